"""Save and restore a slot's KV state (pydecode/kvstate.py), the hand-off between a prefill process
and a decode process, and the CLI's --prompt-cache.

Restoring into a new process must continue bit for bit: the logits after a restore are compared
with array_equal, not within a tolerance, because the restored cache holds the same bits and the
attention of a position depends on positions only (core/attention.c)."""
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import pydecode
from pydecode import kvstate
from tiny_models import write_tiny_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_CONT = 6     # decode steps compared after a restore


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    p = tmp_path_factory.mktemp("kvstate") / "tiny-gemma3.gguf"
    write_tiny_model(p, "gemma3", n_layer=7, window=4)   # a window of 4: 20 positions wrap its ring
    return p


def _continue(m, first_tok, pos, n):
    """n greedy decode steps from `first_tok` at `pos`: (tokens, stacked logits)."""
    toks, logits, tok = [], [], first_tok
    for i in range(n):
        lg = m.decode_step(tok, pos + i).copy()
        logits.append(lg)
        tok = int(np.argmax(lg))
        toks.append(tok)
    return toks, np.stack(logits)


RESTORE = textwrap.dedent("""
    import sys, numpy as np, pydecode
    from pydecode import kvstate
    path, state, kv, n_ctx, first, n, out = sys.argv[1:8]
    m = pydecode.Model(path, n_ctx=int(n_ctx), n_threads=2, kv_type=kv, n_batch=%d)
    toks = kvstate.load(m, state, 0)
    tok, logits = int(first), []
    for i in range(int(n)):
        lg = m.decode_step(tok, len(toks) + i).copy()
        logits.append(lg)
        tok = int(np.argmax(lg))
    np.save(out, np.stack(logits))
""")


def _restore_in_new_process(path, state, kv, n_ctx, first, out, n_batch):
    subprocess.run([sys.executable, "-c", RESTORE % n_batch, str(path), str(state), kv, str(n_ctx), str(first),
                    str(N_CONT), str(out)], check=True, cwd=REPO, timeout=300)
    return np.load(out)


@pytest.mark.parametrize("which,kv,n_batch", [("smollm", "f16", 256), ("smollm", "q8_0", 256),
                                             ("gemma", "f16", 4), ("gemma", "q8_0", 4)])
def test_restore_in_a_new_process_continues_bit_identically(request, tmp_path, which, kv, n_batch):
    path = request.getfixturevalue("smollm_path" if which == "smollm" else "tiny_gemma")
    m = pydecode.Model(path, n_ctx=128, n_threads=2, kv_type=kv, n_batch=n_batch)
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, min(m.n_vocab, 20000), 20)]
    first = int(np.argmax(m.prefill(prompt)))
    toks, _ = _continue(m, first, len(prompt), 3)          # a few decodes before the save
    held = prompt + [first] + toks[:-1]                    # the positions the cache holds
    kvstate.save(m, tmp_path / "s.pdkv", 0, held)
    want_toks, want = _continue(m, toks[-1], len(held), N_CONT)
    m.close()
    got = _restore_in_new_process(path, tmp_path / "s.pdkv", kv, 128, toks[-1], tmp_path / "out.npy", n_batch)
    assert np.array_equal(got, want)
    assert [int(np.argmax(r)) for r in got] == want_toks


@pytest.fixture(scope="module")
def saved(smollm_path, tmp_path_factory):
    """A SmolLM2 f16 state of 12 tokens: (bytes, tokens)."""
    m = pydecode.Model(smollm_path, n_ctx=64, n_threads=2)
    toks = list(range(200, 212))
    m.prefill(toks)
    data = kvstate.dumps(m, 0, toks)
    m.close()
    return data, toks


@pytest.fixture(scope="module")
def target(smollm_path):
    m = pydecode.Model(smollm_path, n_ctx=64, n_threads=2)
    yield m
    m.close()


def _slot_unchanged(m, before):
    return m.export_kv(0, 5) == before


def test_refused_files_change_nothing(target, saved, tmp_path):
    data, toks = saved
    target.prefill([5, 6, 7, 8, 9])
    before = target.export_kv(0, 5)
    bad = {
        "too short": data[:20],
        "bad magic": b"XXXXXXXX" + data[8:],
        "checksum mismatch": data[:-1] + bytes([data[-1] ^ 1]),
    }
    ver = bytearray(data)
    ver[8] = 2
    bad["format version 2"] = bytes(ver)
    for want, blob in bad.items():
        with pytest.raises(kvstate.StateFileError, match=want):
            kvstate.loads(target, blob, 0)
        assert _slot_unchanged(target, before)
    assert kvstate.loads(target, data, 0) == toks            # the intact file restores


def _with_header(header: bytes, payload: bytes = b"") -> bytes:
    """A state file around `header` with a valid checksum (what a hostile writer can make)."""
    import hashlib
    body = kvstate._PREFIX.pack(kvstate.MAGIC, kvstate.VERSION, len(header)) + header + payload
    return body + hashlib.sha256(body).digest()


def test_hostile_headers_and_files_are_state_file_errors(target, saved, tmp_path):
    data, toks = saved
    target.prefill([5, 6, 7, 8, 9])
    before = target.export_kv(0, 5)
    hlen = kvstate._PREFIX.unpack_from(data, 0)[2]
    head = json.loads(data[kvstate._PREFIX.size:kvstate._PREFIX.size + hlen])
    payload = data[kvstate._PREFIX.size + hlen:-32]
    for header in (b"[" * 100_000 + b"]" * 100_000,                       # was a RecursionError
                   json.dumps({**head, "tokens": [True] + toks[1:]}).encode(),   # true was taken as id 1
                   json.dumps({**head, "tokens": {"a": [[[[]]]]}}).encode()):
        with pytest.raises(kvstate.StateFileError, match="header"):
            kvstate.loads(target, _with_header(header, payload), 0)
        assert _slot_unchanged(target, before)
    fifo, sparse, zero = tmp_path / "fifo", tmp_path / "sparse", tmp_path / "zero"
    os.mkfifo(fifo)                                                    # no writer: open() used to block
    with open(sparse, "wb") as f:
        f.truncate(8 << 30)                                            # 8 GiB of holes: read whole before
    zero.symlink_to("/dev/zero")
    for path, want in ((fifo, "not a regular file"), (zero, "not a regular file"), (tmp_path, "not a regular file"),
                       (sparse, "more than any state file of this model")):
        with pytest.raises(kvstate.StateFileError, match=want):
            kvstate.load(target, path, 0)
        assert _slot_unchanged(target, before)
    assert kvstate.max_bytes(target) >= len(data)
    good = tmp_path / "good.pdkv"
    assert kvstate.save(target, good, 0, [5, 6, 7, 8, 9]) > 0 and kvstate.load(target, good, 0) == [5, 6, 7, 8, 9]
    assert not any(kvstate.replaceable(p) for p in (fifo, zero, tmp_path, tmp_path / "sparse"))
    assert kvstate.replaceable(good) and kvstate.replaceable(tmp_path / "absent")


def test_truncated_or_flipped_anywhere_never_loads(target, saved):
    data, _ = saved
    target.prefill([5, 6, 7, 8, 9])
    before = target.export_kv(0, 5)
    rng = np.random.default_rng(0)
    cuts = sorted(set([0, 1, 7, 8, 15, 16, 100, len(data) - 33, len(data) - 32, len(data) - 1]
                      + rng.integers(0, len(data), 40).tolist()))
    for n in cuts:
        with pytest.raises(kvstate.StateFileError):
            kvstate.loads(target, data[:n], 0)
    for i in sorted(set(list(range(0, 64)) + rng.integers(0, len(data), 200).tolist())):
        flipped = bytearray(data)
        flipped[i] ^= 1 << int(rng.integers(8))
        with pytest.raises(kvstate.StateFileError):
            kvstate.loads(target, bytes(flipped), 0)
    assert _slot_unchanged(target, before)


def test_other_model_and_other_kv_type_are_refused(smollm_path, tiny_gemma, saved):
    data, _ = saved
    with pydecode.Model(tiny_gemma, n_ctx=64, n_threads=1) as other:
        with pytest.raises(kvstate.StateFileError, match="saved by another model"):
            kvstate.loads(other, data, 0)
    with pydecode.Model(smollm_path, n_ctx=64, n_threads=1, kv_type="q8_0") as q8:
        with pytest.raises(kvstate.StateFileError, match="saved with a f16 KV cache"):
            kvstate.loads(q8, data, 0)
    with pydecode.Model(smollm_path, n_ctx=8, n_threads=1) as small:
        with pytest.raises(kvstate.StateFileError, match="more than this model's context"):
            kvstate.loads(small, data, 0)


def test_save_is_atomic(target, tmp_path, monkeypatch):
    """A save that dies before its rename leaves the old file whole and no temporary file."""
    target.prefill([1, 2, 3])
    path = tmp_path / "state.pdkv"
    kvstate.save(target, path, 0, [1, 2, 3])
    old = path.read_bytes()

    def crash(*a):
        raise OSError("simulated crash before the rename")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        kvstate.save(target, path, 0, [1, 2])
    assert path.read_bytes() == old and sorted(p.name for p in tmp_path.iterdir()) == ["state.pdkv"]


def test_llm_state_round_trip_reuses_the_prefix(smollm_path, tmp_path):
    """LLM.save_state / load_state: the restored tokens are a prefix the next prompt reuses, and
    the continuation equals the one the saving LLM gives."""
    prompt = "The three largest cities of Japan are"
    with pydecode.load(str(smollm_path), n_ctx=256, n_threads=2) as llm:
        first = llm.generate(prompt, max_tokens=8)
        assert llm.save_state(tmp_path / "s.pdkv") == first.stats.prompt_tokens + 7
        again = llm.generate(prompt + first.text, max_tokens=8)
    with pydecode.load(str(smollm_path), n_ctx=256, n_threads=2) as llm:
        assert len(llm.load_state(tmp_path / "s.pdkv")) == first.stats.prompt_tokens + 7
        restored = llm.generate(prompt + first.text, max_tokens=8)
        assert restored.tokens == again.tokens
        assert restored.stats.cached_tokens == again.stats.cached_tokens > first.stats.prompt_tokens
        me = object()                                    # a leased slot is waited for, up to timeout
        llm.engine.model.slots.take(0, me, latest=False)
        with pytest.raises(TimeoutError, match="in use"):
            llm.save_state(tmp_path / "busy.pdkv", slot=0, timeout=0.1)
        llm.engine.model.slots.give_back(0, me)


def test_state_calls_wait_for_a_slot_like_generations(smollm_path, tmp_path):
    """Under contention a state call waits its turn (issue 35 item 9: it failed at once with
    'every sequence slot is in use'): from another thread while generations hold every slot,
    and in the one thread whose generation nobody consumes yet (the call steps it to its end)."""
    with pydecode.load(str(smollm_path), n_ctx=256, n_threads=2) as llm:   # one slot
        h = llm.engine.submit("Once upon a time", 24, ignore_eos=True)
        data = llm.export_state()                         # steps h to its end, then saves its slot
        assert h.done and len(h.completion.tokens) == 24
        assert len(llm.import_state(data)) == h.completion.stats.prompt_tokens + 23
        texts, errors = [], []

        def generate(i):
            try:
                texts.append(llm.generate(f"Story {i}:", max_tokens=12).text)
            except BaseException as e:   # noqa: BLE001 (reported below)
                errors.append(e)

        threads = [threading.Thread(target=generate, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        saved = [llm.save_state(tmp_path / f"s{i}.pdkv", timeout=120) for i in range(3)]
        loaded = [llm.load_state(tmp_path / f"s{i}.pdkv", timeout=120) for i in range(3)]
        for t in threads:
            t.join()
        assert not errors and len(texts) == 3
        assert all(n > 0 for n in saved) and [len(t) for t in loaded] == saved
        long = llm.engine.submit("x", 200, ignore_eos=True)
        llm.engine.start()
        try:
            while not long.done and not llm.engine.n_active:
                time.sleep(0.01)
            with pytest.raises(TimeoutError, match="waited 0.05 s"):
                llm.export_state(timeout=0.05)
        finally:
            long.cancel()
            llm.engine.stop()


def test_engine_saves_a_finished_handles_slot_in_memory(smollm_path):
    """Engine.export_state(handle) / import_state: per request, in memory; a slot reused by another
    request is refused."""
    m = pydecode.Model(smollm_path, n_ctx=128, n_threads=2, n_seq=2)
    eng = pydecode.Engine(m)
    a = eng.submit("Apples are", 6)
    a.result()
    data = eng.export_state(a)
    held = m.slots.held(a.slot)
    b = eng.submit("Bananas are yellow and", 6)       # these two may reuse a's slot
    b.result()
    c = eng.submit("Cherries are", 6)
    c.result()
    if m.slots.held(a.slot) != held:
        with pytest.raises(RuntimeError, match="no longer holds"):
            eng.export_state(a)
    slot = 1 - c.slot
    eng.import_state(data, slot)
    assert m.slots.held(slot) == held
    again = eng.submit(list(held), 4)                  # its prefix is found in the restored slot
    again.result()
    assert again.slot == slot
    eng.close()
    m.close()


# ---------------------------------------------------------------- the hand-off between processes

def test_handoff_prefill_process_to_decode_process(smollm_path, tmp_path):
    """examples/handoff.py: one process prefills and exports the slot, another imports it and
    decodes; the text equals one process doing both, and each side reports what it computed."""
    script = os.path.join(REPO, "examples", "handoff.py")
    prompt = "A list of five colours: red,"
    state = tmp_path / "handoff.pdkv"
    pre = subprocess.run([sys.executable, script, "prefill", str(smollm_path), prompt, str(state)], check=True,
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    dec = subprocess.run([sys.executable, script, "decode", str(smollm_path), prompt, str(state), "16"], check=True,
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    p, d = json.loads(pre.stdout), json.loads(dec.stdout)
    with pydecode.load(str(smollm_path), n_ctx=512, n_threads=2) as llm:
        one = llm.generate(prompt, max_tokens=16)
    assert d["text"] == one.text and d["tokens"] == list(one.tokens)
    n = one.stats.prompt_tokens
    assert p["positions_computed"] == n and p["state_tokens"] == n      # the whole prompt
    # the decode side recomputes the prompt's last position (the state has K/V, not logits)
    assert d["cached_tokens"] == n - 1 and d["positions_computed"] == 1 + 16 - 1


# ---------------------------------------------------------------- the CLI's --prompt-cache

def test_prompt_cache_round_trip_through_the_cli(smollm_path, tmp_path):
    cache = tmp_path / "prompt.pdkv"
    cmd = [sys.executable, "-m", "pydecode", "run", str(smollm_path), "-p", "Here is a short story about a robot:",
           "-n", "8", "--prompt-cache", str(cache), "--json", "-t", "2"]
    runs = [json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300).stdout)
            for _ in range(2)]
    assert cache.exists()
    assert runs[0]["stats"]["cached_tokens"] == 0
    assert runs[1]["stats"]["cached_tokens"] == runs[1]["stats"]["prompt_tokens"] - 1
    assert runs[1]["text"] == runs[0]["text"]
    cache.write_bytes(cache.read_bytes()[:100])              # a damaged cache: a warning, then replaced
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 0 and "prompt cache ignored" in bad.stderr and "checksum" in bad.stderr
    assert json.loads(bad.stdout)["text"] == runs[0]["text"]
    assert kvstate.parse(pydecode.Model(smollm_path, n_ctx=64, n_threads=1), cache.read_bytes())
    cache.write_bytes(_with_header(b"[" * 100_000 + b"]" * 100_000))   # a hostile header: a warning too
    deep = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert deep.returncode == 0 and "prompt cache ignored" in deep.stderr and "Traceback" not in deep.stderr
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    cmd[cmd.index(str(cache))] = str(notes)                            # not a state file: never replaced
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "not a pydecode state file" in refused.stderr, refused.stderr
    assert notes.read_text() == "my notes\n"
