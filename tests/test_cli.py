"""CLI smoke tests, run as a user would: a subprocess (and, for `chat`, a pseudo-terminal)."""
import json
import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "pydecode.cli", *args], capture_output=True, text=True,
                          timeout=300)


def test_run_prints_text(smollm_path):
    r = _cli("run", "-p", "The capital of France is", "-n", "8")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip()) > 0
    assert "t/s" in r.stderr


def test_info(smollm_path):
    r = _cli("info", str(smollm_path))
    assert r.returncode == 0, r.stderr
    for word in ("llama", "30 layers", "Q4_1", "KV cache", "per decoded token"):
        assert word in r.stdout


def test_info_full_context_kv_counts_the_windows(gemma_path):
    """Gemma 3's sliding-window layers keep 512 positions, not the whole context: the KV figure at
    full context is ArchConfig.kv_bytes's, not bytes per token x context."""
    from pydecode.config import arch_config
    from pydecode.gguf_file import GGUFFile

    r = _cli("info", str(gemma_path))
    assert r.returncode == 0, r.stderr
    c = arch_config(GGUFFile(gemma_path))
    assert f"{c.kv_bytes(c.n_ctx_train) / 1e6:.1f} MB at full context" in r.stdout, r.stdout
    assert "sliding-window layers keep 512 positions" in r.stdout
    assert c.kv_bytes(c.n_ctx_train) < c.kv_bytes_per_token() * c.n_ctx_train / 2


def test_bad_model_is_a_clear_error(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"nope")
    r = _cli("run", "-m", str(bad), "-p", "hi", "-n", "2")
    assert r.returncode == 1 and "error:" in r.stderr and "Traceback" not in r.stderr
    r = _cli("run", "-m", "no-such-model", "-p", "hi")
    assert r.returncode == 1 and "no-such-model" in r.stderr


def test_pydecode_isa_env_forces_kernels(smollm_path):
    import os

    code = ("import pydecode; m = pydecode.Model(%r, n_ctx=32, n_threads=1); print(m.isa)" % str(smollm_path))
    for isa in ("scalar", "avx2"):
        from pydecode._core import lib

        if not lib.pd_isa_supported(isa.encode()):
            continue
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**os.environ, "PYDECODE_ISA": isa}, timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == isa, r.stderr
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYDECODE_ISA": "sse9"}, timeout=120)
    assert r.returncode != 0 and "instruction set 'sse9'" in r.stderr


# ------------------------------------------------------------------ run: sampler flags, --json, --stop, --chat


def _json_run(*args):
    r = _cli("run", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)        # the whole of stdout is one JSON object


def test_run_json(smollm_path):
    out = _json_run("-p", "The capital of France is", "-n", "6")
    assert {"text", "tokens", "finish_reason", "stop_detail", "stats"} <= set(out)
    assert out["finish_reason"] == "length" and out["stop_detail"] == "max_tokens=6"
    assert len(out["tokens"]) == 6 and "Paris" in out["text"]
    s = out["stats"]
    for key in ("prompt_tokens", "cached_tokens", "generated_tokens", "positions_computed", "ttft_s",
                "prefill_s", "decode_tokens_per_s", "prefill_tokens_per_s", "token_latencies_s"):
        assert key in s, key
    assert s["generated_tokens"] == 6 and s["ttft_s"] > 0 and s["decode_tokens_per_s"] > 0


def test_run_stop_and_sampler_flags(smollm_path):
    out = _json_run("-p", "The capital of France is", "-n", "16", "--stop", ".", "--stop", "\n\n")
    assert out["finish_reason"] == "stop" and "'.'" in out["stop_detail"]
    assert out["text"].strip() == "Paris"                    # the stop string is not part of the text
    r = _cli("run", "-p", "The capital of France is", "-n", "16", "--stop", ".", "--no-stats")
    assert r.returncode == 0 and r.stdout == " Paris\n"
    a = _json_run("-p", "Once upon a time", "-n", "8", "--temp", "0.8", "--top-k", "40", "--top-p", "0.9",
                  "--min-p", "0.05", "--repeat-penalty", "1.1", "--seed", "7")
    b = _json_run("-p", "Once upon a time", "-n", "8", "--temp", "0.8", "--top-k", "40", "--top-p", "0.9",
                  "--min-p", "0.05", "--repeat-penalty", "1.1", "--seed", "7")
    assert a["tokens"] == b["tokens"] and len(a["tokens"]) == 8       # seeded: reproducible


def test_run_chat_wraps_the_prompt(smollm_path):
    plain = _json_run("-p", "What is 2+2?", "-n", "4")
    chat = _json_run("-p", "What is 2+2?", "-n", "4", "--chat")
    # SmolLM2's template adds its default system prompt and the turn markers.
    assert chat["stats"]["prompt_tokens"] > plain["stats"]["prompt_tokens"] + 20
    r = _cli("run", "-p", "Say hello.", "--chat", "-n", "24", "--no-stats")
    assert r.returncode == 0 and r.stdout.strip() and "<|im_" not in r.stdout


@pytest.mark.parametrize("args, flag, code", [
    (("--top-p", "0"), "--top-p", 2),
    (("--temp", "-1"), "--temp", 2),
    (("--temp", "nan"), "--temp", 1),
    (("-n", "0"), "--max-tokens", 2),
    (("--top-k", "x"), "--top-k", 2),
    (("--stop", ""), "--stop", 1),
    (("--repeat-penalty", "0"), "--repeat-penalty", 2),
])
def test_run_bad_parameters(smollm_path, args, flag, code):
    r = _cli("run", "-p", "hi", *args)
    assert r.returncode == code, (r.returncode, r.stderr)
    assert flag in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------ chat: piped stdin

def test_chat_piped_answers_once(smollm_path):
    r = subprocess.run([sys.executable, "-m", "pydecode.cli", "chat", "-n", "24", "--verbose"],
                       input="Say hello.\n", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and ">>>" not in r.stdout and "pydecode chat" not in r.stdout
    assert "t/s" in r.stderr and "TTFT" in r.stderr                       # --verbose, on stderr
    r = subprocess.run([sys.executable, "-m", "pydecode.cli", "chat"], input="  \n", capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "stdin was empty" in r.stderr


# ------------------------------------------------------------------ chat: a terminal

class _Terminal:
    """The CLI on a pseudo-terminal (it is the child's controlling tty: \\x03 is a real SIGINT)."""

    def __init__(self, *args):
        env = {**os.environ, "TERM": "dumb", "PYTHONUNBUFFERED": "1"}
        self.pid, self.fd = pty.fork()
        if self.pid == 0:                       # the child: become the CLI
            try:
                os.execve(sys.executable, [sys.executable, "-m", "pydecode.cli", *args], env)
            finally:
                os._exit(127)
        self.buf = ""
        self.status = None

    def _read(self, timeout):
        r, _, _ = select.select([self.fd], [], [], timeout)
        if not r:
            return False
        try:
            data = os.read(self.fd, 4096)
        except OSError:                         # EIO: the child has gone
            data = b""
        if not data:
            raise EOFError(self.buf)
        self.buf += data.decode("utf-8", "replace")
        return True

    def expect(self, pattern, timeout=60):
        """Waits for `pattern`; returns the text before it and consumes through it."""
        rx, end = re.compile(pattern), time.monotonic() + timeout
        while not (m := rx.search(self.buf)):
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{pattern!r} not seen in {timeout} s; output: {self.buf!r}")
            self._read(left)
        before, self.buf = self.buf[:m.start()], self.buf[m.end():]
        return before

    def send(self, text):
        os.write(self.fd, text.encode())

    def ask(self, line, timeout=60):
        self.send(line + "\r")
        self.expect(re.escape(line) + r"\r?\n")          # the terminal's echo of the line
        return self.expect(r">>> ", timeout)

    def wait(self, timeout=30):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                self.status = os.waitstatus_to_exitcode(status)
                return self.status
            try:
                self._read(0.05)
            except EOFError:
                time.sleep(0.05)
        raise AssertionError(f"the CLI did not exit; output: {self.buf!r}")

    def kill(self):
        if self.status is None:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
            os.close(self.fd)
            self.status = -9


def test_chat_in_a_terminal(smollm_path):
    t = _Terminal("chat", "-n", "200", "--seed", "1")   # a seeded draw: the answer to "Say hello." ends by itself
    try:
        t.expect(r">>> ", timeout=180)
        answer = t.ask("Say hello.")
        assert re.search(r"\w", answer), answer
        stats = t.ask("/stats")
        assert re.search(r"\d+ tokens, [\d.]+ tokens/s", stats) and "TTFT" in stats and "finish: stop" in stats
        # Ctrl-C during an answer stops it and returns to the prompt; the session goes on.
        t.send("Write a long story about a dragon who loves books.\r")
        t.expect(r"books\.\r?\n")
        t.expect(r"\w")                                     # the answer has started
        t.send("\x03")
        assert "[stopped]" in t.expect(r">>> ", timeout=20)
        stats = t.ask("/stats")
        assert "finish: [stopped]" in stats
        assert re.search(r"prompt: +\d+ tokens: \d+ prefilled new, [1-9]\d* reused from cache", stats), stats
        assert "conversation cleared" in t.ask("/reset")
        stats = t.ask("/stats")
        assert "context:     0 messages" in stats and "no answer yet" in stats
        assert "/system" in t.ask("/help")
        t.send("\x04")                                      # Ctrl-D at the prompt: quit
        assert t.wait() == 0
    finally:
        t.kill()


def test_chat_terminal_double_ctrl_c_quits(smollm_path):
    t = _Terminal("chat", "-n", "8", "--system", "Be brief.")
    try:
        t.expect(r">>> ", timeout=180)
        # CPython's readline loses a SIGINT that lands before it starts waiting for input, and
        # under load that moment comes late: Ctrl-C until one is heard (a bounded poll, not a
        # fixed sleep), then again, once every 5 s, until the chat quits.
        end = time.monotonic() + 60
        while "Ctrl-C again" not in t.buf:
            assert time.monotonic() < end, f"Ctrl-C not heard in 60 s; output: {t.buf!r}"
            t.send("\x03")
            try:
                t._read(0.5)
            except EOFError:
                break
        end, sent = time.monotonic() + 60, 0.0
        while True:
            assert time.monotonic() < end, f"the second Ctrl-C did not quit in 60 s; output: {t.buf!r}"
            if time.monotonic() - sent > 5:
                t.send("\x03")
                sent = time.monotonic()
            pid, status = os.waitpid(t.pid, os.WNOHANG)
            if pid:
                try:                                # what it printed last is still in the pty
                    while t._read(0.2):
                        pass
                except EOFError:
                    pass
                os.close(t.fd)
                t.status = os.waitstatus_to_exitcode(status)
                break
            try:
                t._read(0.2)
            except EOFError:
                time.sleep(0.1)
        assert t.status == 0 and "Ctrl-C again" in t.buf, t.buf
    finally:
        t.kill()


def test_bench_smoke(smollm_path):
    """The bench command once with tiny settings (no assertion on speed)."""
    import json

    r = _cli("bench", "-m", str(smollm_path), "-t", "1", "-r", "1", "-p", "8", "-n", "4", "-d", "0", "-d", "16",
             "--bandwidth")
    assert r.returncode == 0, r.stderr
    assert "| model | size | params | backend | threads | test | t/s |" in r.stdout and "tg4 @ d16" in r.stdout
    assert "read bandwidth" in r.stdout and "python share" in r.stdout
    r = _cli("bench", "-m", str(smollm_path), "-t", "2", "-r", "1", "-p", "0", "-n", "4", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["rows"][0]["test"] == "tg4" and d["rows"][0]["mean"] > 0
