"""Embeddings: Model.prefill_hidden (pd_prefill_hidden), pydecode/embeddings.py's pooling and
normalization, LLM.embed's slot leases, and the server's /v1/embeddings, /embeddings, /embedding.

The hidden states are checked two ways: against the numpy reference's final-norm states
(tests/reference_llama.py; tolerances as test_forward.py / test_archs.py, for the same reason:
8-bit activations), and, tighter, as exactly what the output head reads: the q8 reference of
our own hidden states times rows of the head equals the logits of prefill (measured 5e-6).
"""
import base64

import numpy as np
import pytest

import pydecode
from pydecode import embeddings
from pydecode._core import ffi, lib
from pydecode.errors import ContextFullError
from reference_llama import ReferenceModel
from tiny_models import N_VOCAB, write_tiny_model

REL_RMS_TOL = 0.08       # test_forward.py's, SmolLM2 against the float reference
NOISE_FACTOR = 1.6       # ... and at most this many times the q8 reference's own distance
TINY_REL_TOL = 0.04      # test_archs.py's (measured 0.4-2.8% on the hidden states)
ISA_REL_TOL = 0.02       # scalar vs the best table, whole models (8-bit rounding flips; measured <= 0.7%)
HEAD_ATOL = 1e-3         # our hidden x the head's rows vs prefill's logits (measured 5e-6)
ARCHS = ["llama", "qwen2", "gemma3", "qwen3", "qwen3moe", "qwen2moe", "phi3", "gpt-oss"]
PROMPT = "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm"
BEST = ffi.string(lib.pd_isa_best()).decode()


def _rel(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """arch -> a tiny model of it (whose GGUF asks for mean pooling)."""
    d = tmp_path_factory.mktemp("tiny-embd")
    paths = {}
    for arch in ARCHS:
        paths[arch] = d / f"{arch}.gguf"
        write_tiny_model(paths[arch], arch, pooling_type=1)
    return paths


@pytest.fixture(scope="module")
def smol(smollm_path):
    with pydecode.load(smollm_path, n_ctx=128, n_threads=2) as llm:
        yield llm


# ---------------------------------------------------------------- the hidden states

def test_hidden_matches_the_reference_smollm(smollm_path):
    m = pydecode.Model(smollm_path, n_ctx=64, n_threads=2)
    toks = m.tokenizer.encode(PROMPT)[:12]
    plain, quant = ReferenceModel(smollm_path), ReferenceModel(smollm_path, act_quant=True)
    quant._w = plain._w
    ref, ref_q = plain.hidden(toks), quant.hidden(toks)
    ours = m.prefill_hidden(toks)
    assert ours.shape == (12, m.config.n_embd) and ours.dtype == np.float32
    rel = _rel(ours, ref)
    assert rel <= REL_RMS_TOL and _rel(ours, ref_q) <= REL_RMS_TOL
    assert rel <= NOISE_FACTOR * _rel(ref_q, ref), (rel, _rel(ref_q, ref))


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"])
def test_hidden_is_what_the_head_reads(name):
    """Real models (gemma3: its embedding scale and sliding window; qwen2: biases, an untied
    head where it has one): the head's rows over our hidden states give prefill's logits."""
    from gguf.quants import dequantize
    from pydecode.registry import model_path

    path = model_path(name)
    m = pydecode.Model(path, n_ctx=64, n_threads=2)
    toks = m.tokenizer.encode(PROMPT)[:8]
    hidden = m.prefill_hidden(toks)
    logits = m.prefill(toks, all_logits=True)   # (the same slot again: positions 0.. rewritten)
    r = ReferenceModel(path, act_quant=True)
    t = r.tensors["output.weight" if r.has("output.weight") else "token_embd.weight"]
    rows = np.unique(np.concatenate([np.argmax(logits, 1), np.arange(0, m.n_vocab, 997)]))
    w = dequantize(t.data[rows], t.tensor_type).astype(np.float64)
    kind = int(t.tensor_type)
    x = hidden.astype(np.float64)
    if kind not in (0, 1, 30):    # the head's input quantized as the C core does (reference_llama.linear)
        x = r.q8(x, 256 if 10 <= kind <= 14 else 32)
    assert np.abs(x @ w.T - logits[:, rows]).max() <= HEAD_ATOL


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_hidden_matches_reference_on_scalar_and_best(tiny, arch):
    toks = np.random.default_rng(1).integers(0, N_VOCAB, 12).tolist()
    r = ReferenceModel(tiny[arch])
    r.long_factors = True    # phi3: n_ctx 64 is past the tiny model's original context of 32
    ref = r.hidden(toks)
    got = {isa: pydecode.Model(tiny[arch], n_ctx=64, n_threads=2, isa=isa).prefill_hidden(toks)
           for isa in dict.fromkeys(("scalar", BEST))}
    for isa, h in got.items():
        assert _rel(h, ref) <= TINY_REL_TOL, isa
    assert _rel(got[BEST], got["scalar"]) <= ISA_REL_TOL


def test_chunks_equal_one_block_across_a_sliding_window(tiny):
    """n_batch 4: every call runs in chunks; gemma3's window of 4 rides a ring of 8 positions."""
    toks = np.random.default_rng(3).integers(0, N_VOCAB, 19).tolist()
    whole = pydecode.Model(tiny["gemma3"], n_ctx=64, n_threads=2).prefill_hidden(toks)
    chunked = pydecode.Model(tiny["gemma3"], n_ctx=64, n_threads=2, n_batch=4)
    assert np.abs(chunked.prefill_hidden(toks) - whole).max() <= 2e-3
    llm = pydecode.LLM(chunked)
    try:   # embeddings.py runs its own chunks of n_batch, at their positions
        got = llm.embed(toks, pooling="none", normalize=False)[0]
    finally:
        llm.close()
    assert np.abs(got - whole).max() <= 2e-3


def test_prefill_hidden_checks_like_prefill(smollm_path):
    m = pydecode.Model(smollm_path, n_ctx=16, n_threads=2, n_seq=2)
    with pytest.raises(ContextFullError, match="17 tokens at position 0"):
        m.prefill_hidden([1] * 17)
    with pytest.raises(ValueError, match="at least one token"):
        m.prefill_hidden([])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        m.prefill_hidden([m.n_vocab])
    with pytest.raises(ValueError, match="sequence slot"):
        m.prefill_hidden([1, 2], seq=2)
    me = object()
    m.slots.take(1, me, latest=False)   # a lessee's slot: refused to a direct write, open to its lessee
    with pytest.raises(RuntimeError, match="in use"):
        m.prefill_hidden([1, 2], seq=1)
    assert m.prefill_hidden([1, 2], seq=1, lease=me).shape == (2, m.config.n_embd)
    # the K/V it wrote are prefill's: a decode after it gives the logits of prefilling all three
    after = m.decode_step(3, 2, seq=1, lease=me).copy()
    fresh = pydecode.Model(smollm_path, n_ctx=16, n_threads=2).prefill([1, 2, 3])
    assert np.abs(after - fresh).max() <= 2e-3


# ---------------------------------------------------------------- pooling and normalization

def _states(llm, text):
    ids = llm.tokenize(text)
    return ids, llm.model.prefill_hidden(ids).astype(np.float64)


def test_pooling_against_numpy(smol):
    text = "Embeddings pool the hidden states"
    ids, h = _states(smol, text)
    want = {"mean": h.mean(0), "cls": h[0], "last": h[-1]}
    for pooling, v in want.items():
        raw = smol.embed(text, pooling=pooling, normalize=False)[0]
        assert raw.shape == (smol.n_embd,) and raw.dtype == np.float32
        np.testing.assert_allclose(raw, v, rtol=1e-5, atol=1e-5)
        unit = smol.embed(text, pooling=pooling)[0]
        np.testing.assert_allclose(unit, v / np.linalg.norm(v), rtol=1e-5, atol=1e-6)
        assert abs(np.linalg.norm(unit) - 1) < 1e-5
    none = smol.embed(text, pooling="none", normalize=False)[0]
    assert none.shape == (len(ids), smol.n_embd)
    np.testing.assert_allclose(none, h, rtol=1e-5, atol=1e-5)
    rows = smol.embed(ids, pooling="none")[0]     # normalized token by token, as llama.cpp's embedding tool
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1, atol=1e-5)


def test_llama_cpp_normalizations():
    v = np.array([[3.0, -4.0, 0.0], [0.0, 0.0, 0.0]])
    assert np.allclose(embeddings.normalized(v, 2)[0], [0.6, -0.8, 0])
    assert np.allclose(embeddings.normalized(v, 1)[0], [3 / 7, -4 / 7, 0])
    assert np.allclose(embeddings.normalized(v, 0)[0], [3 * 32760 / 4, -32760, 0])
    assert np.allclose(embeddings.normalized(v, 3)[0], v[0] / (27 + 64) ** (1 / 3))
    assert np.array_equal(embeddings.normalized(v, -1), v)
    assert not embeddings.normalized(v, 2)[1].any()          # a zero vector stays zero
    assert embeddings.norm_mode(True) == 2 and embeddings.norm_mode(False) == -1
    with pytest.raises(ValueError, match="normalize"):
        embeddings.norm_mode(-2)


def test_a_batch_equals_each_alone(smol):
    texts = ["The capital of France is", "def f(x):", "The capital of France is", "A much longer sentence " * 6]
    ids = [smol.tokenize(t) for t in texts]
    together = smol.embed(texts, pooling="mean")
    alone = [smol.embed(t, pooling="mean")[0] for t in texts]
    as_ids = smol.embed(ids, pooling="mean")
    for a, b, c in zip(together, alone, as_ids):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    assert np.array_equal(together[0], together[2])
    assert np.array_equal(smol.embed(ids[1], pooling="last")[0], smol.embed([ids[1]], pooling="last")[0])


def test_the_ggufs_pooling_type_decides(tmp_path):
    for value, name in ((None, "none"), (1, "mean"), (2, "cls"), (3, "last"), (4, "rank")):
        path = tmp_path / f"p{value}.gguf"
        write_tiny_model(path, "llama", n_layer=2, pooling_type=value)
        with pydecode.load(str(path), n_ctx=32, n_threads=1) as llm:
            assert llm.pooling == name
            toks = [5, 6, 7, 8]
            if name == "rank":
                with pytest.raises(ValueError, match="rank pooling"):
                    llm.embed(toks)
                assert llm.embed(toks, pooling="mean")[0].shape == (llm.n_embd,)
                continue
            got = llm.embed(toks)[0]
            assert np.array_equal(got, llm.embed(toks, pooling=name)[0])
            assert got.shape == ((4, llm.n_embd) if name == "none" else (llm.n_embd,))


# ---------------------------------------------------------------- leases and errors

def test_embedding_between_generations_changes_no_text(smollm_path):
    prompt = "The capital of France is"
    with pydecode.load(smollm_path, n_ctx=128, n_threads=2) as fresh:
        want = [fresh.generate(p, 12).text for p in (prompt, "Once upon a time")]
    with pydecode.load(smollm_path, n_ctx=128, n_threads=2) as llm:   # one slot: every call shares it
        assert llm.generate(prompt, 12).text == want[0]
        llm.embed(["Once upon", "unrelated words"], pooling="mean")
        assert llm.model.slots.held(0) == llm.tokenize("unrelated words")   # what the slot holds, truly
        llm.embed("Once upon", pooling="last")
        second = llm.generate("Once upon a time", 12)    # starts from the embedding's K/V
        assert second.stats.cached_tokens > 0 and second.text == want[1]
        assert llm.generate(prompt, 12).text == want[0]
        # an embedding waits for the slot a generation holds (with no driver thread, by stepping it)
        h = llm.stream(prompt, 12)
        next(iter(h))
        assert llm.model.slots.n_free() == 0
        llm.embed("x y z", pooling="mean")
        assert h.result().text == want[0]
        assert llm.model.slots.n_free() == 1


def test_errors_name_what_is_wrong(smol):
    assert not smol.tokenizer.add_bos   # (SmolLM2 adds nothing to an empty text)
    with pytest.raises(ValueError, match="input 1 is empty"):
        smol.embed(["a", ""], pooling="mean")
    with pytest.raises(ValueError, match="inputs is empty"):
        smol.embed([])
    with pytest.raises(ContextFullError, match=r"input 0 has 129 tokens, more than the context of 128"):
        smol.embed([[1] * 129], pooling="mean")
    for bad in ("max", "rank", "MEAN"):
        with pytest.raises(ValueError, match="pooling must be one of"):
            smol.embed("a", pooling=bad)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        smol.embed([[1, smol.model.n_vocab]], pooling="mean")
    with pytest.raises(TypeError, match=r"inputs\[1\]"):
        smol.embed(["a", 3.5], pooling="mean")
    assert smol.model.slots.n_free() == smol.model.n_seq   # nothing ran, nothing stays leased


# ---------------------------------------------------------------- the server

@pytest.fixture(scope="module")
def serve(smol):
    """settings -> a TestClient of the app over the shared LLM with those settings."""
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from pydecode.server import ServerState, create_app
    from pydecode.server.settings import Settings

    smol.engine.start()
    clients = []

    def make(**settings):
        state = ServerState("smol", settings=Settings(**settings))
        state.ready(smol)
        clients.append(TestClient(create_app(state)))
        return clients[-1]

    yield make
    for c in clients:
        c.close()


def test_server_without_embedding_is_501(serve):
    c = serve()
    for path in ("/v1/embeddings", "/embeddings", "/embedding"):
        r = c.post(path, json={"input": "hi"})
        assert r.status_code == 501
        assert r.json()["error"]["message"] == "This server does not support embeddings. Start it with `--embeddings`"


def test_openai_route_shape_usage_and_base64(serve, smol):
    c = serve(embeddings=True, pooling="mean")
    texts = ["I believe the meaning of life is", "This is a test"]
    r = c.post("/v1/embeddings", json={"input": texts, "model": "text-embedding-3-small"})
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["object"] == "list" and b["model"] == "text-embedding-3-small"
    n = sum(len(smol.tokenize(t)) for t in texts)
    assert b["usage"] == {"prompt_tokens": n, "total_tokens": n}
    want = smol.embed(texts, pooling="mean")
    for i, (d, w) in enumerate(zip(b["data"], want)):
        assert d["object"] == "embedding" and d["index"] == i
        np.testing.assert_allclose(d["embedding"], w, rtol=1e-6, atol=1e-7)
    r = c.post("/embeddings", json={"input": texts[1]})   # no /v1: llama-server's native shape, as there
    assert r.status_code == 200 and r.json()[0]["index"] == 0
    np.testing.assert_allclose(r.json()[0]["embedding"], [want[1]], rtol=1e-6, atol=1e-7)
    r = c.post("/v1/embeddings", json={"input": texts[0], "encoding_format": "base64"})
    d = r.json()["data"][0]
    assert d["encoding_format"] == "base64"
    floats = np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
    assert np.array_equal(floats, want[0])
    ids = smol.tokenize(texts[0])
    for form in (ids, [ids], [texts[0]], {"prompt_string": texts[0]},
                 {"content": [{"type": "text", "text": texts[0][:5]}, {"type": "text", "text": texts[0][5:]}]}):
        got = c.post("/v1/embeddings", json={"input": form}).json()["data"]
        assert len(got) == 1 and np.allclose(got[0]["embedding"], want[0], atol=1e-7), form
    mixed = c.post("/v1/embeddings", json={"input": ["string1", ids, {"prompt_string": "x"}]}).json()["data"]
    assert [d["index"] for d in mixed] == [0, 1, 2]


def test_openai_client_talks_to_it(serve):
    openai = pytest.importorskip("openai")

    c = serve(embeddings=True, pooling="last")
    client = openai.OpenAI(api_key="x", base_url="http://testserver/v1", http_client=c)   # (an httpx.Client)
    res = client.embeddings.create(model="m", input=["a b", "c d"])
    assert len(res.data) == 2 and len(res.data[0].embedding) == 576
    assert abs(sum(x * x for x in res.data[0].embedding) - 1) < 1e-3


def test_native_routes_and_pooling_none(serve, smol):
    c = serve(embeddings=True)               # SmolLM2's GGUF names no pooling: none, as llama-server
    r = c.post("/v1/embeddings", json={"input": "hello hello hello"})
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("Pooling type 'none' is not OAI compatible")
    ids = smol.tokenize("hello hello hello")
    raw = smol.embed(ids, pooling="none", normalize=False)[0]
    for path in ("/embedding", "/embeddings"):
        r = c.post(path, json={"input": "hello hello hello"})
        assert r.status_code == 200
        got = np.array(r.json()[0]["embedding"])
        assert got.shape == (len(ids), smol.n_embd)                  # a vector per token, not normalized
        np.testing.assert_allclose(got, raw, rtol=1e-6, atol=1e-6)
    m = serve(embeddings=True, pooling="mean")
    r = m.post("/embedding", json={"content": "hello hello hello"})   # llama-server's "content" field
    (e,) = r.json()
    assert e["index"] == 0 and len(e["embedding"]) == 1 and abs(np.linalg.norm(e["embedding"][0]) - 1) < 1e-5
    r = m.post("/v1/embeddings", json={"content": "hi"})               # "content": the native shape there too
    assert isinstance(r.json(), list)
    r = m.post("/embedding", json={"input": "hello", "embd_normalize": -1})
    np.testing.assert_allclose(r.json()[0]["embedding"][0], smol.embed("hello", pooling="mean", normalize=False)[0],
                               rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("body, status, param, words", [
    ({"input": "x", "dimensions": 3}, 400, "dimensions", "dimensions"),
    ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format", "float"),
    ({"model": "m"}, 400, "input", '"input" or "content"'),
    ({"input": []}, 400, "input", "must not be empty"),
    ({"input": ""}, 400, "input", "Input content cannot be empty"),
    ({"input": [[1, 2], []]}, 400, "input", "Input content cannot be empty"),
    ({"input": "This is a test " * 40}, 400, "input", "too large"),
    ({"input": [10 ** 9]}, 400, "input", "outside the vocabulary"),
    ({"input": {"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}}, 400, "input", "text"),
    ({"input": "x", "embd_normalize": "two"}, 400, "embd_normalize", "integer"),
])
def test_server_refusals_name_the_field(serve, body, status, param, words):
    r = serve(embeddings=True, pooling="mean").post("/v1/embeddings", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
    if words == "too large":
        assert err["type"] == "exceed_context_size_error" and err["n_ctx"] == 128


def test_cli_flags(monkeypatch):
    from click.testing import CliRunner

    import pydecode.server.run as run
    from pydecode.cli import main

    seen = {}

    def fake(load, model_id, settings, **kw):
        seen["settings"] = settings
        return 0

    monkeypatch.setattr(run, "serve", fake)
    r = CliRunner().invoke(main, ["serve", "smollm2-135m", "--embeddings", "--pooling", "mean"])
    assert r.exit_code == 0, r.output
    assert seen["settings"].embeddings is True and seen["settings"].pooling == "mean"
    r = CliRunner().invoke(main, ["serve", "smollm2-135m", "--embedding", "--pooling", "rank"])
    assert r.exit_code == 2 and "rank pooling" in r.output
