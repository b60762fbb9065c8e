"""Batched decoding and the continuous-batching Engine: batched == alone, sequences joining and
leaving, cancel, the FIFO queue and its bound, threads (one driver, or consumers stepping in
turn), errors, KV accounting, LLM.generate_batch / concurrent streams, bench --concurrency.

BATCH_ATOL: the C core computes each token of a batch exactly as it would alone (bit-identical,
checked by its author); the tolerance only leaves room for summation order should that change.
"""
import json
import threading
import time

import numpy as np
import pytest

import pydecode
from pydecode import ContextFullError, Engine, QueueFullError

BATCH_ATOL = 1e-4
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village, there lived",
           "Water boils at a temperature of"]
N = 8
TIMEOUT = 120   # a hang fails the test instead of the whole run


@pytest.fixture(scope="module")
def model(smollm_path):
    m = pydecode.Model(smollm_path, n_ctx=256, n_threads=2, n_seq=4)
    yield m
    m.close()


def _alone(model, ids, n, seq=0):
    """Greedy tokens and the logits each was chosen from, decoding `ids` alone in slot `seq`."""
    logits = model.prefill(ids, seq=seq).copy()
    toks, steps = [], []
    for i in range(n):
        toks.append(int(np.argmax(logits)))
        steps.append(logits)
        if i + 1 < n:
            logits = model.decode_step(toks[-1], len(ids) + i, seq=seq).copy()
    return toks, steps


@pytest.fixture(scope="module")
def ref(model):
    """Per prompt: (ids, greedy tokens, logits), each decoded alone. Computed before any engine
    runs: it writes slot 0."""
    out = {}
    for p in PROMPTS:
        ids = model.tokenizer.encode(p)
        toks, steps = _alone(model, ids, N)
        assert not set(toks) & model.tokenizer.eog_ids   # every run below goes the full N tokens
        out[p] = (ids, toks, steps)
    return out


def _logprob(logits, tok):
    m = logits.max()
    return float(logits[tok] - m - np.log(np.exp(logits.astype(np.float64) - m).sum()))


def _check(out, ref, prompt, n=N):
    _, toks, steps = ref[prompt]
    assert out.tokens == toks[:n], prompt
    if out.logprobs is not None:
        for (tok, lp, _), logits in zip(out.logprobs, steps):
            assert abs(lp - _logprob(logits, tok)) <= BATCH_ATOL


# ---------------------------------------------------------------- batched == alone


def test_engine_batch_equals_alone(model, ref):
    eng = Engine(model)
    hs = [eng.submit(p, N, logprobs=1) for p in PROMPTS]   # 4 prompt lengths, prefilled in one step
    for p, h in zip(PROMPTS, hs):
        out = h.result(TIMEOUT)
        _check(out, ref, p)
        assert out.finish_reason == "length" and len(out.stats.token_latencies_s) == N - 1
        assert out.stats.ttft_s > 0 and out.stats.positions_computed == len(h.prompt) + N - 1


def test_batch_step_mixed_prefill_and_decodes(model, ref):
    (a, ta, la), (b, tb, lb), (c, tc, lc) = (ref[p] for p in PROMPTS[:3])
    # step 1: two whole prompts (slots 1, 2); logits of each one's last token
    x = model.batch_step(a + b, list(range(len(a))) + list(range(len(b))), [1] * len(a) + [2] * len(b),
                         [len(a) - 1, len(a) + len(b) - 1])
    assert np.abs(x[0] - la[0]).max() <= BATCH_ATOL and np.abs(x[1] - lb[0]).max() <= BATCH_ATOL
    # step 2: a decode, the first chunk of a third prompt (slot 3), another decode
    h = len(c) // 2
    x = model.batch_step([ta[0]] + c[:h] + [tb[0]], [len(a)] + list(range(h)) + [len(b)], [1] + [3] * h + [2],
                         [0, h + 1])
    assert np.abs(x[0] - la[1]).max() <= BATCH_ATOL and np.abs(x[1] - lb[1]).max() <= BATCH_ATOL
    # step 3: the rest of that prompt between two decodes
    rest = c[h:]
    x = model.batch_step([tb[1]] + rest + [ta[1]], [len(b) + 1] + list(range(h, len(c))) + [len(a) + 1],
                         [2] + [3] * len(rest) + [1])
    assert x.shape == (len(rest) + 2, model.n_vocab)
    assert np.abs(x[0] - lb[2]).max() <= BATCH_ATOL and np.abs(x[-1] - la[2]).max() <= BATCH_ATOL
    assert np.abs(x[len(rest)] - lc[0]).max() <= BATCH_ATOL


def test_batch_step_arguments(model):
    with pytest.raises(ValueError, match="sequence slot 4"):
        model.batch_step([1], [0], [4])
    with pytest.raises(ValueError, match="does not follow"):
        model.batch_step([1, 2], [0, 2], [0, 0])
    with pytest.raises(ContextFullError):
        model.batch_step([1], [256], [0])
    with pytest.raises(ValueError, match="n_batch"):
        model.batch_step([1] * (model.n_batch + 1), list(range(model.n_batch + 1)), [0] * (model.n_batch + 1))
    with pytest.raises(ValueError, match="vocabulary"):
        model.batch_step([10**7], [0], [0])
    with pytest.raises(ValueError, match="one entry per token"):
        model.batch_step([1, 2], [0, 1], [0])
    with pytest.raises(ValueError, match="out_idx"):
        model.batch_step([1], [0], [0], out_idx=[1])


# ---------------------------------------------------------------- continuous batching


def test_sequences_join_and_leave_mid_run(model, ref):
    eng = Engine(model, max_seqs=3)
    a, b = eng.submit(PROMPTS[0], N), eng.submit(PROMPTS[1], 3)
    eng.step(), eng.step()
    assert len(a.tokens) == 2 and len(b.tokens) == 2
    c = eng.submit(PROMPTS[2], N)   # joins: its prompt shares the next step with a's and b's decodes
    assert eng.step() == 2 + len(c.prompt)
    assert b.done and b.completion.finish_reason == "length" and eng.n_active == 2   # b left
    d = eng.submit(PROMPTS[3], N)   # takes b's slot
    eng.step()
    assert d.slot == b.slot and eng.n_active == 3
    for p, h, n in zip(PROMPTS, (a, b, c, d), (N, 3, N, N)):
        _check(h.result(TIMEOUT), ref, p, n)
    assert eng.n_active == eng.n_queued == 0 and eng.step() == 0


def test_cancel_frees_the_slot_for_the_queue(model, ref):
    eng = Engine(model, max_seqs=2)
    a, b, c = eng.submit(PROMPTS[0], 100), eng.submit(PROMPTS[1], 100), eng.submit(PROMPTS[2], N)
    eng.step(), eng.step()
    assert eng.n_active == 2 and eng.n_queued == 1 and c.slot is None
    a.cancel()   # between steps: ends now
    assert a.done and a.completion.finish_reason == "cancelled" and a.completion.stop_detail == "cancel()"
    assert len(a.completion.tokens) == 2 and "".join(p.text for p in a) == a.completion.text
    eng.step()
    assert c.slot is not None and eng.n_queued == 0 and eng.n_active == 2
    b.cancel()
    _check(c.result(TIMEOUT), ref, PROMPTS[2])
    assert b.completion.finish_reason == "cancelled" and eng.n_active == 0


def test_queue_drains_fifo(model, ref):
    eng = Engine(model, max_seqs=1)
    hs = [eng.submit(p, 2) for p in PROMPTS[:3]]
    order = []
    while eng.step():
        assert eng.n_active <= 1
        order += [i for i, h in enumerate(hs) if h.done and i not in order]
    assert order == [0, 1, 2]
    for p, h in zip(PROMPTS, hs):
        _check(h.completion, ref, p, 2)


def test_max_queue(model):
    eng = Engine(model, max_seqs=1, max_queue=1)
    a, b = eng.submit("one", 50), eng.submit("two", 50)   # a will take the free slot; b waits
    with pytest.raises(QueueFullError, match="max_queue=1"):
        eng.submit("three", 50)
    eng.step()
    with pytest.raises(QueueFullError):
        eng.submit("three", 50)
    a.cancel()   # b can take the slot: the queue has room again
    c = eng.submit("three", 50)
    for h in (b, c):
        h.cancel()
    assert eng.n_queued == eng.n_active == 0


def test_bad_requests_raise_at_submit(model):
    eng = Engine(model)
    for kw, err, match in [({"temperature": -1.0}, ValueError, "temperature"), ({"max_tokens": 0}, ValueError, "max_tokens"),
                           ({"top_p": 0.0}, ValueError, "top_p"), ({"logprobs": 101}, ValueError, "logprobs"),
                           ({"stop": [""]}, ValueError, "stop"), ({"tempreature": 1.0}, TypeError, "tempreature")]:
        with pytest.raises(err, match=match):
            eng.submit("Hi", **{"max_tokens": 4, **kw})
    with pytest.raises(ContextFullError, match="context"):
        eng.submit("word " * 300, 4)
    with pytest.raises(ValueError, match="empty"):
        eng.submit([], 4)
    with pytest.raises(ValueError, match="vocabulary"):
        eng.submit([1, 10**7], 4)
    assert eng.n_queued == 0
    for kw, match in [({"max_seqs": 5}, "max_seqs"), ({"max_seqs": 0}, "max_seqs"), ({"max_queue": -1}, "max_queue"),
                      ({"prefill_chunk": 0}, "prefill_chunk")]:
        with pytest.raises(ValueError, match=match):
            Engine(model, **kw)


def test_prefill_chunks_share_steps_with_decodes(model, ref):
    eng = Engine(model, prefill_chunk=4)
    a = eng.submit(PROMPTS[0], N)
    eng.step()
    assert len(a.tokens) == 0 and eng.kv_bytes_in_use == model.config.kv_bytes(4, 2, ring_extra=model.n_batch)
    c = eng.submit(PROMPTS[2], N)
    while not a.done:
        assert eng.step() <= 1 + 4
    _check(a.completion, ref, PROMPTS[0])
    _check(c.result(TIMEOUT), ref, PROMPTS[2])


# ---------------------------------------------------------------- threads


def _threads(fns):
    errors = []

    def wrap(f):
        try:
            f()
        except BaseException as e:   # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=wrap, args=(f,)) for f in fns]
    for t in ts:
        t.start()
    for t in ts:
        t.join(TIMEOUT)
        assert not t.is_alive(), "a thread hung"
    assert not errors, errors


def test_threads_submit_while_a_driver_runs(model, ref):
    results = {}
    barrier = threading.Barrier(4)
    with Engine(model) as eng:
        def client(i):
            barrier.wait()
            hs = [(p, eng.submit(p, N)) for p in (PROMPTS[i], PROMPTS[(i + 1) % 4])]
            results[i] = [(p, h.result(TIMEOUT)) for p, h in hs]
        _threads([lambda i=i: client(i) for i in range(4)])
    assert len(results) == 4
    for outs in results.values():
        for p, out in outs:
            _check(out, ref, p)


def test_take_and_waker_never_block(model, ref):
    """Handle.take() returns what is ready without stepping; the waker fires from the driver
    whenever pieces arrive or the request ends (an event loop's consumer: pydecode/server)."""
    eng = Engine(model)
    h = eng.submit(PROMPTS[0], N)
    assert h.take() == ([], False)            # no driver: nothing ran, nothing waited
    woke = threading.Event()
    h.set_waker(woke.set)
    assert not woke.is_set()
    pieces = []
    with eng:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            assert woke.wait(TIMEOUT)
            woke.clear()
            got, done = h.take()
            pieces += got
            if done:
                break
    assert "".join(p.text for p in pieces) == h.completion.text
    _check(h.completion, ref, PROMPTS[0])
    late = threading.Event()
    h.set_waker(late.set)                     # already over: called at once
    assert late.is_set() and h.take() == ([], True)


def test_consumers_drive_cooperatively(model, ref):
    eng = Engine(model, max_seqs=3)   # 4 requests: one waits in the queue
    hs = [eng.submit(p, N) for p in PROMPTS]
    texts = {}

    def consume(i):
        texts[i] = "".join(piece.text for piece in hs[i])

    _threads([lambda i=i: consume(i) for i in range(4)])
    for i, (p, h) in enumerate(zip(PROMPTS, hs)):
        assert texts[i] == h.completion.text
        _check(h.completion, ref, p)


def test_step_errors_reach_the_handles(model, ref, monkeypatch):
    eng = Engine(model)

    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(model, "batch_step", broken)
    monkeypatch.setattr(model, "decode_step", broken)   # a one-token step (a cached prompt's last token)
    a = eng.submit(PROMPTS[0], N)
    with pytest.raises(RuntimeError, match="boom"):
        a.result(TIMEOUT)
    with pytest.raises(RuntimeError, match="boom"):
        next(iter(a))
    with eng:   # the same through a driver thread
        b = eng.submit(PROMPTS[1], N)
        with pytest.raises(RuntimeError, match="boom"):
            b.result(TIMEOUT)
    monkeypatch.undo()
    assert eng.n_active == 0   # the slots were freed
    _check(eng.submit(PROMPTS[0], N).result(TIMEOUT), ref, PROMPTS[0])


# ---------------------------------------------------------------- KV accounting


def test_kv_bytes(model):
    eng = Engine(model)
    cfg, nb = model.config, model.n_batch
    assert eng.kv_bytes_reserved == model.kv_bytes == model.n_seq * cfg.kv_bytes(model.n_ctx, 2, ring_extra=nb)
    hs = [eng.submit(p, N) for p in PROMPTS[:2]]
    for _ in range(3):
        eng.step()
    # the last sampled token of each is not decoded yet
    assert eng.kv_bytes_in_use == sum(cfg.kv_bytes(len(h.prompt) + len(h.tokens) - 1, 2) for h in hs)
    for h in hs:
        h.cancel()
    assert eng.kv_bytes_in_use == 0


def test_sliding_window_ring_accounting_and_reuse(tmp_path):
    from tiny_models import write_tiny_model

    path = tmp_path / "tiny-gemma3.gguf"
    write_tiny_model(path, "gemma3")   # window 4
    m = pydecode.Model(path, n_ctx=64, n_threads=1, n_seq=2, n_batch=4)
    cfg = m.config
    prompt = np.random.default_rng(3).integers(0, 256, 12).tolist()

    def run(ids, n):   # through the engine (slot 0), checked against decoding alone in slot 1
        h = eng.submit(ids, n, logprobs=20)
        h._s.policy.eog = frozenset()   # random weights: do not let an end token cut the check short
        out = h.result(TIMEOUT)
        toks, steps = _alone(m, ids, n, seq=1)
        assert out.tokens == toks
        for (_, _, top), logits in zip(out.logprobs, steps):   # the top 20, not only the (peaked) winner
            assert all(abs(lp - _logprob(logits, t)) <= BATCH_ATOL for t, lp in top)
        return out

    eng = Engine(m, max_seqs=1)
    h = eng.submit(prompt, 10)
    h._s.policy.eog = frozenset()
    while eng.step() and len(h.tokens) < 8:
        if h.tokens:   # local layers hold at most window + n_batch positions
            pos = len(h.prompt) + len(h.tokens) - 1
            assert eng.kv_bytes_in_use == cfg.kv_bytes(pos, 2, ring_extra=4)
            assert pos <= 8 or eng.kv_bytes_in_use < cfg.kv_bytes_per_token(2) * pos
    held = h.prompt + h.tokens[:-1]
    h.cancel()
    # A prompt sharing a prefix with what the slot holds reuses it while the ring of the local
    # layers still holds the window before the prefix's end: at most n_batch + 1 positions were
    # written after it (checked here at n_batch; beyond n_batch + 1 the logits differ by ~8).
    out = run(held[:-4] + [5], 4)
    assert out.stats.cached_tokens == len(held) - 4
    held = out.stats.prompt_tokens + 3
    out = run(prompt[:6] + [7, 8], 4)   # parts from it long before its end: recomputed
    assert out.stats.cached_tokens == 0 and held - 6 > 4
    m.close()


def test_single_sequence_reuse_respects_the_ring(tmp_path):
    """The same rule on the one-slot path (Generation): a prompt parting from the cached tokens
    long before their end is recomputed, not read from a ring that has wrapped."""
    from tiny_models import write_tiny_model

    path = tmp_path / "tiny-gemma3.gguf"
    write_tiny_model(path, "gemma3")
    llm, fresh = (pydecode.LLM(pydecode.Model(path, n_ctx=64, n_threads=1, n_batch=4)) for _ in range(2))
    prompt = np.random.default_rng(5).integers(0, 256, 12).tolist()
    held = prompt + llm.generate(prompt, 20).tokens[:-1]   # what the cache holds
    for p, cached in ((prompt[:8] + [9, 10], 0), (held + [11], len(held))):
        if cached:
            llm.generate(prompt, 20)   # the cache holds `held` again
        a, b = llm.generate(p, 4, logprobs=20), fresh.generate(p, 4, logprobs=20)
        assert a.stats.cached_tokens == cached and a.tokens == b.tokens
        for x, y in zip(a.logprobs, b.logprobs):
            assert np.allclose([lp for _, lp in x[2]], [lp for _, lp in y[2]], atol=BATCH_ATOL)


# ---------------------------------------------------------------- LLM API and bench


@pytest.fixture(scope="module")
def solo(smollm_path):
    """llm.generate with one slot (today's path), per prompt."""
    llm = pydecode.load(str(smollm_path), n_ctx=256, n_threads=2)
    extra = ["The three primary colors are", "My favourite food is"]
    yield llm, {p: llm.generate(p, N) for p in PROMPTS + extra}
    llm.close()


def test_generate_batch(model, solo):
    llm1, want = solo
    prompts = list(want)   # 6 prompts on 4 slots: two wait in the queue
    outs = pydecode.LLM(model).generate_batch(prompts, N)
    assert [o.tokens for o in outs] == [want[p].tokens for p in prompts]
    assert [o.text for o in outs] == [want[p].text for p in prompts]
    outs = llm1.generate_batch(prompts[:2], N)   # one slot: one after another
    assert [o.text for o in outs] == [want[p].text for p in prompts[:2]]
    with pytest.raises(TypeError, match="list of prompts"):
        llm1.generate_batch("one string", N)


def test_streams_run_at_once(model, solo):
    _, want = solo
    llm = pydecode.LLM(model)
    # two threads, each streaming
    texts = {}
    barrier = threading.Barrier(2)

    def stream(p):
        barrier.wait()
        texts[p] = "".join(piece.text for piece in llm.stream(p, N))

    _threads([lambda p=p: stream(p) for p in PROMPTS[:2]])
    assert texts == {p: want[p].text for p in PROMPTS[:2]}
    # one thread, two streams consumed in turn
    its, got, live = [llm.stream(p, N) for p in PROMPTS[2:]], ["", ""], [0, 1]
    while live:
        for i in list(live):
            try:
                got[i] += next(its[i]).text
            except StopIteration:
                live.remove(i)
    assert got == [want[p].text for p in PROMPTS[2:]]


def test_bench_concurrency_smoke(smollm_path):
    from click.testing import CliRunner

    from pydecode.cli import main

    args = ["bench", "-m", str(smollm_path), "-t", "2", "--concurrency", "1,2", "-n", "4"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "| threads | concurrency | t/s (all)" in r.output and "ITL p99 ms" in r.output
    r = CliRunner().invoke(main, args + ["--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)["concurrency"]
    assert [x["concurrency"] for x in rows] == [1, 2] and [x["generated_tokens"] for x in rows] == [4, 8]
    assert rows[1]["weight_bytes_per_token"] * 2 == rows[0]["weight_bytes_per_token"] and rows[1]["tokens_per_s"] > 0
    r = CliRunner().invoke(main, ["bench", "-m", str(smollm_path), "--concurrency", "1,x"])
    assert r.exit_code == 2 and "--concurrency" in r.output
