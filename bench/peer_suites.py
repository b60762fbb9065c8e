"""Run the peers' own test suites against pydecode, beside the peers themselves, on one local model.

    # llama.cpp's server tests (vendor/llama.cpp/tools/server/tests of the llama-cpp-python sdist),
    # through bench/llama_server_shim.py, against `pydecode serve` and (with --llama-server) llama-server:
    python bench/peer_suites.py server --sdist DIR [--llama-server build/bin/llama-server] [--model smollm2-135m]

    # llama-cpp-python's high-level tests (tests/ of the sdist) with `llama_cpp.Llama` = pydecode.Llama:
    python bench/peer_suites.py python --sdist DIR

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


def python_suite(args) -> dict[str, dict]:
    tests = os.path.join(args.sdist, "tests")
    py = ensure_venv(args.venv, ["pytest", "numpy", "jinja2", "huggingface_hub", "scipy"])
    model = model_path(args.model)
    tmp = tempfile.mkdtemp(prefix="peer-suites-")
    # The shim: a `llama_cpp` package whose Llama is pydecode's, found before the real one.
    os.makedirs(os.path.join(tmp, "llama_cpp"))
    with open(os.path.join(tmp, "llama_cpp", "__init__.py"), "w") as f:
        f.write("from pydecode.compat.llama_cpp import *  # noqa\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tmp, ROOT]), "PEER_MODEL": model}
    res = run_pytest(py, tests, ["test_llama.py"], env, os.path.join(tmp, "python.xml"), args.timeout)
    return {"pydecode": res}


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
