"""Run the peers' own test suites against pydecode, beside the peers themselves, on one local model.

    # llama.cpp's server tests (vendor/llama.cpp/tools/server/tests of the llama-cpp-python sdist),
    # through bench/llama_server_shim.py, against `pydecode serve` and (with --llama-server) llama-server:
    python bench/peer_suites.py server --sdist DIR [--llama-server build/bin/llama-server] [--model smollm2-135m]

    # llama-cpp-python's high-level tests (tests/ of the sdist) with `llama_cpp.Llama` = pydecode.Llama:
    python bench/peer_suites.py python --sdist DIR [--llama-cpp-python /path/to/venv/bin/python]

DIR is the unpacked sdist: `pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36`
and `tar xzf` it. The suites' own requirements go into a venv made here (--venv, default
/tmp/peer-suites-venv). Prints pass counts per file for each runtime, then every test the peer
passes and pydecode does not. The tests of this repository never depend on any of this.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# The text-chat files of llama.cpp's server suite (issue 34): what a CPU chat server is asked.
SERVER_FILES = ["basic", "completion", "chat_completion", "tokenize", "security", "metrics", "ctx_shift",
                "slot_save", "template", "stream", "ignore_eos", "compat_oai_responses", "compat_anthropic",
                "compat_gcp", "sleep", "kv_keep_only_active"]


def ensure_venv(venv: str, requirements: list[str]) -> str:
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", *requirements], check=True)
    return py


def model_path(name: str) -> str:
    sys.path.insert(0, ROOT)
    from pydecode import registry
    return str(registry.resolve(name)) if not name.endswith(".gguf") else name


def junit(path: str) -> dict[str, str]:
    """{test id: 'passed' | 'failed' | 'skipped'} from a pytest junit XML file."""
    out = {}
    if not os.path.exists(path):
        return out
    for case in ET.parse(path).getroot().iter("testcase"):
        tid = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        kinds = {child.tag for child in case}
        out[tid] = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
    return out


def run_pytest(py: str, cwd: str, files: list[str], env: dict, xml: str, timeout: int, extra=()) -> dict:
    cmd = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x" if False else "-q", f"--junitxml={xml}",
           "-o", "junit_family=xunit1", *extra, *files]
    try:
        subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        print(f"  (timed out after {timeout} s: {' '.join(files)})", file=sys.stderr)
    return junit(xml)


def server_suite(args) -> dict[str, dict]:
    tests = os.path.join(args.sdist, "vendor", "llama.cpp", "tools", "server", "tests")
    reqs = open(os.path.join(tests, "requirements.txt")).read().split()
    py = ensure_venv(args.venv, [r for r in reqs if not r.startswith("-")])
    model = model_path(args.model)
    tmp = tempfile.mkdtemp(prefix="peer-suites-")
    shim = os.path.join(tmp, "llama-server")
    with open(shim, "w") as f:
        f.write(f"#!/bin/sh\nexec {sys.executable} {os.path.join(HERE, 'llama_server_shim.py')} \"$@\"\n")
    os.chmod(shim, 0o755)
    targets = ["pydecode"] + (["llama-server"] if args.llama_server else [])
    if args.targets:
        targets = args.targets.split(",")
    results: dict[str, dict] = {}
    files = args.files or SERVER_FILES
    for target in targets:
        env = {**os.environ, "LLAMA_SERVER_BIN_PATH": shim, "PEER_MODEL": model, "PEER_TARGET": target,
               "PEER_PYTHON": sys.executable, "PYTHONPATH": ROOT}
        if args.llama_server:
            env["PEER_LLAMA_SERVER"] = os.path.abspath(args.llama_server)
        if args.threads:
            env["LLAMA_ARG_THREADS"] = str(args.threads)
        res = {}
        for name in files:
            print(f"{target}: test_{name}.py", file=sys.stderr, flush=True)
            res.update({f"{name}::{k.split('::', 1)[1]}": v for k, v in
                        run_pytest(py, tests, [f"unit/test_{name}.py"], env, os.path.join(tmp, f"{target}-{name}.xml"),
                                   args.timeout).items()})
        results[target] = res
    return results


# llama-cpp-python's test files, and the models its fixtures download (hf_hub_download(repo,
# file)) -> the local registry model each is replaced with (None: nothing pydecode can load;
# the fixture then fails, and so does the test, counted as such).
PYTHON_FILES = ["test_llama.py", "test_llama_grammar.py", "test_llama_chat_format.py", "test_llama_speculative.py"]
# Qwen3.5-0.8B (qwen35, a hybrid: issue 36) -> Gemma 3 270M: of the registry models it is the one that
# answers test_real_llama's questions ("true" at temperature 0.8, seed 1337); Qwen2.5-Coder-0.5B draws
# "false" there (greedy it says "true"), SmolLM2 does not finish the fox sentence.
PYTHON_MODELS = {"Qwen3.5-0.8B-Q8_0.gguf": "gemma3-270m",
                 "tinyllamas/stories15M-q4_0.gguf": "smollm2-135m",
                 "bge-small-en-v1.5-q4_k_m.gguf": "smollm2-135m",      # (BERT: no encoder architecture)
                 "mamba-130m-hf.Q2_K.gguf": None, "Falcon-H1-Tiny-90M-Instruct-Q2_K.gguf": None}

_PYTHON_PLUGIN = """
import json, os
import huggingface_hub

_MAP = json.loads(os.environ["PEER_MODELS"])


def hf_hub_download(repo_id, filename, *args, **kwargs):
    path = _MAP.get(filename)
    if path is None:
        raise FileNotFoundError(f"{repo_id}/{filename}: no local stand-in (pydecode does not load this "
                                f"architecture; the suite runs offline)")
    return path


huggingface_hub.hf_hub_download = hf_hub_download
"""


def python_suite(args) -> dict[str, dict]:
    """llama-cpp-python's tests with `import llama_cpp` = pydecode.compat (install()), their
    downloads replaced by local registry models (PYTHON_MODELS), run from the sdist's root (where
    test_llama.py finds vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf). In this interpreter:
    pytest, scipy and huggingface_hub are installed into it when missing."""
    missing = [m for m in ("pytest", "scipy", "huggingface_hub") if subprocess.run(
        [sys.executable, "-c", f"import {m}"], capture_output=True).returncode]
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)
    tmp = tempfile.mkdtemp(prefix="peer-suites-")
    os.makedirs(os.path.join(tmp, "llama_cpp"))
    with open(os.path.join(tmp, "llama_cpp", "__init__.py"), "w") as f:
        f.write("import pydecode.compat\npydecode.compat.install()\n")
    with open(os.path.join(tmp, "peer_hf_shim.py"), "w") as f:
        f.write(_PYTHON_PLUGIN)
    # Run from a directory with the sdist's tests/ and vendor/ (not its llama_cpp/ package, which
    # would shadow the shim's).
    run_dir = os.path.join(tmp, "run")
    os.makedirs(run_dir)
    for sub in ("tests", "vendor"):
        os.symlink(os.path.join(os.path.abspath(args.sdist), sub), os.path.join(run_dir, sub))
    models = {k: (model_path(v) if v else None) for k, v in PYTHON_MODELS.items()}
    runs = {"pydecode": (sys.executable, os.pathsep.join([tmp, ROOT]))}
    if args.llama_cpp_python:   # the real package, in its own interpreter: only the download shim
        runs["llama-cpp-python"] = (args.llama_cpp_python, os.path.join(tmp, "plugin-only"))
        os.makedirs(runs["llama-cpp-python"][1])
        with open(os.path.join(runs["llama-cpp-python"][1], "peer_hf_shim.py"), "w") as f:
            f.write(_PYTHON_PLUGIN)
    results = {}
    for target, (py, path) in runs.items():
        env = {**os.environ, "PYTHONPATH": path, "PEER_MODELS": json.dumps(models)}
        res = {}
        for name in args.files or PYTHON_FILES:
            print(f"{target}: tests/{name}", file=sys.stderr, flush=True)
            res.update({f"{name[:-3]}::{k.split('::', 1)[1]}": v for k, v in
                        run_pytest(py, run_dir, [os.path.join("tests", name)], env,
                                   os.path.join(tmp, f"{target}-{name}.xml"), args.timeout,
                                   extra=("-p", "peer_hf_shim")).items()})
        results[target] = res
    return results


def report(results: dict[str, dict]) -> None:
    targets = list(results)
    by_file: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for t, res in results.items():
        for tid, outcome in res.items():
            by_file[tid.split("::")[0]][t].append(outcome)
    print("| file | " + " | ".join(f"{t} passed" for t in targets) + " | tests |")
    print("|---|" + "---|" * (len(targets) + 1))
    totals = defaultdict(int)
    n_all = 0
    for f, per in by_file.items():
        n = max(len(v) for v in per.values())
        n_all += n
        cells = []
        for t in targets:
            p = per[t].count("passed")
            totals[t] += p
            cells.append(str(p))
        print(f"| {f} | " + " | ".join(cells) + f" | {n} |")
    print("| **all** | " + " | ".join(f"**{totals[t]}**" for t in targets) + f" | {n_all} |")
    if len(targets) > 1:
        ours, peer = results[targets[0]], results[targets[1]]
        missing = sorted(t for t, o in peer.items() if o == "passed" and ours.get(t) != "passed")
        print(f"\n{len(missing)} tests {targets[1]} passes and {targets[0]} does not:")
        for t in missing:
            print(f"  {t}")
    fails = sorted(t for t, o in results[targets[0]].items() if o == "failed")
    print(f"\n{len(fails)} tests {targets[0]} fails:")
    for t in fails:
        print(f"  {t}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", choices=["server", "python"])
    ap.add_argument("--sdist", required=True, help="the unpacked llama-cpp-python 0.3.36 sdist")
    ap.add_argument("--model", default="smollm2-135m", help="registry name or .gguf path (default smollm2-135m)")
    ap.add_argument("--llama-server", default=None, help="a built llama-server, to run the suite on it too")
    ap.add_argument("--llama-cpp-python", default=None, help="a python with the real llama-cpp-python 0.3.36 "
                    "installed (and pytest, scipy, huggingface_hub), to run its tests on it too")
    ap.add_argument("--venv", default="/tmp/peer-suites-venv", help="where the suites' requirements go")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per test file")
    ap.add_argument("--targets", default=None, help="comma-separated: pydecode,llama-server (default: both when "
                    "--llama-server is given)")
    ap.add_argument("--save", default=None, help="write the results (JSON) here")
    ap.add_argument("--peer-results", default=None, help="a --save file of an earlier run, for the other columns")
    ap.add_argument("files", nargs="*", help="server test files (default: the text-chat ones)")
    args = ap.parse_intermixed_args()
    results = server_suite(args) if args.suite == "server" else python_suite(args)
    if args.peer_results:
        earlier = json.load(open(args.peer_results))
        results.update({t: r for t, r in earlier.items() if t not in results})
    if args.save:
        with open(args.save, "w") as f:
            json.dump(results, f, indent=1)
    report(results)


if __name__ == "__main__":
    main()
