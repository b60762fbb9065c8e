"""CLI smoke tests, run as a user would: a subprocess."""
import subprocess
import sys


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
