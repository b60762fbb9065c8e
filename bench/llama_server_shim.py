"""A stand-in `llama-server` executable for llama.cpp's own server test suite
(bench/peer_suites.py puts it on LLAMA_SERVER_BIN_PATH).

The suite starts its server with llama-server's flags and a Hugging Face model name. This shim
swaps the model for the local file in $PEER_MODEL (the same file for both runtimes, so the
comparison is like for like), and then either execs the real llama-server ($PEER_TARGET=llama-server,
with $PEER_LLAMA_SERVER its path) or maps the flags onto `pydecode serve`:

- `-c/--ctx-size` is llama-server's total context, shared by `--parallel` slots; pydecode's `-c`
  is each sequence's, so it is divided here; with `--kv-unified` any one sequence may fill the
  whole pool in llama-server, so each pydecode sequence gets all of it (pydecode's slots are
  fixed: the closest match, at n_parallel times the memory).
- everything else is passed through: `pydecode serve` takes llama-server's flag names itself
  (those a CPU runtime has no use for are accepted with a notice).
"""
from __future__ import annotations

import os
import sys

MODEL_FLAGS = {"-hf", "--hf-repo", "-hff", "--hf-file", "-mu", "--model-url", "-m", "--model"}


def split_model(argv: list[str]) -> list[str]:
    """argv without the model flags (and --offline, which only concerns downloads)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in MODEL_FLAGS:
            skip = True
            continue
        if a == "--offline":
            continue
        out.append(a)
    return out


def value(argv: list[str], *names: str, default=None):
    for i, a in enumerate(argv[:-1]):
        if a in names:
            return argv[i + 1]
    return default


def pydecode_args(argv: list[str]) -> list[str]:
    n_ctx = value(argv, "-c", "--ctx-size")
    slots = 1 if "--kv-unified" in argv or "-kvu" in argv else int(value(argv, "-np", "--parallel", default="1"))
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in ("-c", "--ctx-size"):
            skip = True
            continue
        out.append(a)
    if n_ctx is not None and int(n_ctx) > 0:
        out += ["--ctx-size", str(max(1, int(n_ctx) // slots))]
    return out


def main() -> None:
    model = os.environ["PEER_MODEL"]
    argv = split_model(sys.argv[1:])
    if os.environ.get("PEER_TARGET") == "llama-server":
        exe = os.environ["PEER_LLAMA_SERVER"]
        os.execv(exe, [exe, "--model", model, *argv])
    py = os.environ.get("PEER_PYTHON", sys.executable)
    os.execv(py, [py, "-m", "pydecode", "serve", "--model", model, *pydecode_args(argv)])


if __name__ == "__main__":
    main()
