"""The thread pool under oversubscription: more threads than cores, a busy neighbour, and steps
of changing sizes (chunked prefills of 1..19 tokens, decodes) back to back on several models.

Regression: a worker that woke late used to read a torn step context (the new step's epoch with
the previous step's token count), claim chunks the other threads did not count, and leave the
main thread waiting forever for a phase counter that had overshot. Before the fix this script
hung within seconds on 2 cores; it runs in a subprocess so that a hang fails the test instead of
stalling the suite.

Regression (mixture of experts): a phase's chunk count read from the step's routing (how many
experts hold tokens) was overwritten by the next layer's routing while a descheduled worker had
not yet read it; that worker then waited for a count the phase never reached. The same script
on a tiny qwen3moe hung within seconds before the count became per layer."""
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import sys, threading, time
    import numpy as np
    from pydecode.model import Model
    stop = False
    def busy():                      # a neighbour that wants a core too
        while not stop:
            sum(range(1000))
    threading.Thread(target=busy, daemon=True).start()
    ms = [Model(sys.argv[1], n_threads=t, n_ctx=64, n_batch=8) for t in (2, 3, 7)]
    rng = np.random.default_rng(0)
    t0, rounds = time.time(), 0
    while time.time() - t0 < float(sys.argv[2]):
        for m in ms:
            n = int(rng.integers(1, 20))
            x = m.prefill(rng.integers(0, min(1000, m.n_vocab), n).tolist())
            for i in range(int(rng.integers(1, 4))):
                x = m.decode_step(int(np.argmax(x)), n + i)
        rounds += 1
    stop = True
    print("rounds", rounds)
""")


def test_mixed_steps_oversubscribed_never_hang(smollm_path):
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(smollm_path), "8"], capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert int(r.stdout.split()[-1]) > 0


def test_moe_steps_oversubscribed_never_hang(tmp_path):
    from tiny_models import write_tiny_model
    path = tmp_path / "moe.gguf"
    write_tiny_model(path, "qwen3moe", n_layer=4)
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(path), "6"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert int(r.stdout.split()[-1]) > 0
