"""Structured output (pydecode/constraint.py): every output matches its JSON Schema, regex,
grammar or choices, on real models; the mask's C kernels against numpy; forced runs against
one-token steps; the Engine mixing constrained and free sequences; bad constraints refused
before decoding."""
import json
import re
import subprocess
import sys

import jsonschema
import numpy as np
import pytest

import pydecode
from pydecode import _core
from pydecode.engine import Engine

from structured_schemas import SCHEMAS

ffi, lib = _core.ffi, _core.lib

SAMPLED = dict(temperature=0.8, top_k=40, top_p=0.95, seed=7)
MODES = {"greedy": {}, "sampled": SAMPLED}


@pytest.fixture(scope="module")
def smol(smollm_path):
    with pydecode.load(smollm_path, n_ctx=1024, n_threads=2, n_seq=3) as m:
        yield m


@pytest.fixture(scope="module")
def gemma(gemma_path):
    with pydecode.load(gemma_path, n_ctx=1024, n_threads=2) as m:
        yield m


def _ask(llm, what):
    return [{"role": "user", "content": f"Reply with JSON only: {what}."}]


# ---------------------------------------------------------------- the 20 schemas x 2 models x 2 modes

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", ["smol", "gemma"])
def test_every_output_validates_against_its_schema(request, model, mode):
    llm = request.getfixturevalue(model)
    bad = []
    for i, (what, schema) in enumerate(SCHEMAS):
        c = llm.chat(_ask(llm, what), 256, json_schema=schema, **MODES[mode])
        try:
            jsonschema.validate(json.loads(c.text), schema)
            assert c.finish_reason == "stop" and c.complete, c.stop_detail
        except Exception as e:   # collect all, so one failure shows the others too
            bad.append(f"schema {i} ({what}): {type(e).__name__}: {str(e)[:200]} -- {c.text!r}")
    assert not bad, "\n".join(bad)


def test_response_format_spellings(smol):
    schema = SCHEMAS[0][1]
    for rf in ({"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}},
               {"type": "json_object", "schema": schema}):
        c = smol.chat(_ask(smol, SCHEMAS[0][0]), 128, response_format=rf)
        jsonschema.validate(json.loads(c.text), schema)
    # any JSON object: a 135M model may nest objects until max_tokens unless shown what to write
    c = smol.chat(_ask(smol, 'copy this: {"name": "Ann", "age": 30}'), 128, response_format={"type": "json_object"})
    assert c.complete, c.text
    assert isinstance(json.loads(c.text), dict)
    assert smol.generate("Hi", 5, response_format={"type": "text"}).text == smol.generate("Hi", 5).text
    c = smol.chat(_ask(smol, "a person"), 128, json_schema=json.dumps(schema))   # a JSON string
    jsonschema.validate(json.loads(c.text), schema)


# ---------------------------------------------------------------- regex, choices, grammars

REGEXES = [r"(yes|no)", r"[0-9]{4}-[0-9]{2}-[0-9]{2}", r"[A-Z][a-z]{2,8}( [A-Z][a-z]{2,8})?",
           r"\+?[0-9]{1,3}-[0-9]{3}-[0-9]{4}", r"(0|[1-9][0-9]{0,2})(\.[0-9]{1,2})?"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", ["smol", "gemma"])
def test_regex_and_choices_always_match(request, model, mode):
    llm = request.getfixturevalue(model)
    for rx in REGEXES:
        c = llm.generate("Q: Give me an example.\nA:", 48, regex=rx, **MODES[mode])
        assert re.fullmatch(rx, c.text), (rx, c.text, c.stop_detail)
        assert c.finish_reason == "stop" and c.complete
    choices = ["red", "green", "blue", "light blue"]
    for prompt in ("The sky is", "Grass is", "My favourite colour is"):
        c = llm.generate(prompt, 16, choices=choices, **MODES[mode])
        assert c.text in choices, c.text


def test_grammar_lark_and_gbnf(smol, gemma):
    lark = 'start: "The answer is " ANSWER "."\nANSWER: /[0-9]+/'
    gbnf = 'root ::= "The answer is " [0-9]+ "."'
    for llm in (smol, gemma):
        for g in (lark, gbnf):
            c = llm.generate("What is 2 + 2?", 24, grammar=g)
            assert re.fullmatch(r"The answer is [0-9]+\.", c.text), c.text


ANYTHING = "start: /(?s:.*)/"


@pytest.mark.parametrize("model", ["smol", "gemma"])
def test_a_grammar_that_allows_everything_changes_nothing(request, model):
    """Greedy: the same tokens. Plain temperature sampling too, seed for seed: the constrained
    draw comes first from the whole softmax, as the free one does. (Truncated sampling keeps
    its distribution, not its seed's tokens: test_constrained_sampling_is_the_chain_...)"""
    llm = request.getfixturevalue(model)
    for prompt, kw in (("The history of the bicycle", {}), ("Once upon a time", {}),
                       ("Once upon a time", dict(temperature=0.9, seed=3)),
                       ("The best way to learn", dict(temperature=1.2, seed=5))):
        free = llm.generate(prompt, 40, **kw)
        held = llm.generate(prompt, 40, grammar=ANYTHING, **kw)
        assert held.tokens == free.tokens, (prompt, kw, free.text, held.text)


def _chain(x: np.ndarray, allowed: np.ndarray, p) -> np.ndarray:
    """The sampler chain's distribution over the allowed tokens, in numpy (sampling.py's order:
    top-k, top-p over the top-k's mass, min-p against the best, as pd_sample_truncated)."""
    ids = np.flatnonzero(allowed)
    order = ids[np.lexsort((ids, -x[ids].astype(np.float64)))]   # value descending, id ascending
    if 0 < p.top_k < len(order):
        order = order[:p.top_k]
    w = np.exp((x[order].astype(np.float64) - x[order[0]]) / p.temperature)
    keep = len(order)
    if p.top_p < 1.0:
        keep = min(int(np.argmax(np.cumsum(w) / w.sum() >= p.top_p)) + 1, keep)
    if p.min_p > 0.0:
        keep = min(keep, max(1, int((w >= p.min_p).sum())))
    out = np.zeros(len(x))
    out[order[:keep]] = w[:keep] / w[:keep].sum()
    return out


@pytest.mark.parametrize("params", [
    dict(temperature=1.0, top_k=40, top_p=0.9, min_p=0.02),
    dict(temperature=0.7, top_p=0.8),
    dict(temperature=1.5, top_k=5),
    dict(temperature=1.3, min_p=0.1),
    dict(temperature=1.0, top_k=20, top_p=0.95, repeat_penalty=1.5),
])
def test_constrained_sampling_is_the_chain_over_the_allowed_tokens(smol, params):
    """The draw-first path (a draw from the untruncated softmax taken when the grammar allows it
    and the chain over the allowed tokens keeps it, else drawn again or under the mask) is
    rejection sampling: its tokens must follow the chain's distribution over the allowed
    tokens exactly: no token outside it, every frequency within 5 sigma, 8000 draws."""
    from pydecode.constraint import Constraint, compile_grammar, grammar_of
    from pydecode.sampling import Sampler, SamplingParams, apply_penalties
    tok, m = smol.tokenizer, smol.model
    # " Paris" and the other capitalized or punctuated continuations are refused
    c = Constraint(tok, m.n_vocab, compile_grammar(tok, grammar_of(regex="[a-z ]{1,40}")), fast_forward=False)
    logits = np.array(smol.model.prefill(tok.encode("The capital of France is"), 0, seq=0), np.float32)
    sp = SamplingParams(seed=11, **params)
    recent = tok.encode(" the a of and") if sp.penalized else ()
    sampler = Sampler(sp, m.n_vocab)
    allowed = np.unpackbits(np.frombuffer(ffi.buffer(c._mask(), c.words.nbytes), np.uint8),
                            bitorder="little")[:m.n_vocab].astype(bool)
    x = apply_penalties(logits, recent, sp) if recent else logits
    want = _chain(x, allowed, sp)
    assert not allowed[np.argsort(-x)[:5]].all()   # (some of the best are refused: the chain reaches past them)
    n = 8000
    counts = np.zeros(m.n_vocab)
    for _ in range(n):
        counts[c.choose(logits, sampler, recent)] += 1
        c.matcher.rollback(1)
    assert counts[want == 0].sum() == 0, [tok.decode([int(t)]) for t in np.flatnonzero((want == 0) & (counts > 0))]
    sigma = np.sqrt(n * want * (1 - want))
    bad = np.flatnonzero(np.abs(counts - n * want) > 5 * sigma + 1)
    assert not len(bad), [(tok.decode([int(t)]), counts[t], n * want[t]) for t in bad]


def test_draw_first_decisions_agree_with_the_mask(smol):
    """pd_proposal_keeps (from the allowed flags of the first candidates) and a draw's `sure`
    never contradict pd_sample_allowed_keeps (from the whole mask), which matches the numpy chain;
    pd_proposal_draw_known, when it decides, draws what pd_sample_allowed draws at the same u."""
    from pydecode.sampling import Sampler, SamplingParams
    m = smol.model
    logits = np.array(m.prefill(smol.tokenizer.encode("The quick brown fox jumps over the"), 0, seq=0), np.float32)
    rng = np.random.default_rng(3)
    order = np.argsort(-logits, kind="stable")
    checked = decided = drawn = 0
    for params in (dict(temperature=1.0, top_k=40, top_p=0.9), dict(temperature=0.8, top_p=0.7, min_p=0.05),
                   dict(temperature=2.0, top_k=8), dict(temperature=1.0, top_p=0.5),
                   # weights relative to the best token underflow when the grammar refuses it
                   dict(temperature=0.001), dict(temperature=0.001, top_k=40, min_p=0.1)):
        sp = SamplingParams(seed=1, **params)
        s = Sampler(sp, m.n_vocab)
        top_k, _, inv_t, top_p, min_p = s._fast_args
        for density in (1.0, 0.9, 0.6, 0.2):
            bits = rng.random(m.n_vocab) < density
            bits[order[:6]] = rng.random(6) < density
            w = _words(bits)
            want = _chain(logits, bits, sp)
            for _ in range(60):
                t, sure = s.propose(logits)
                exact = lib.pd_sample_allowed_keeps(_ptr(logits, "float *"), m.n_vocab, _ptr(w, "uint32_t *"), t,
                                                    top_k, inv_t, top_p, min_p)
                assert exact == int(want[t] > 0), (params, density, t)
                if sure and bits[t]:
                    assert exact == 1
                p = s.proposal
                flags = ffi.new("int8_t[256]", [int(bits[p.ids[j]]) for j in range(p.n_cand)])
                if p.index >= 0:
                    for n_known in (p.index + 1, p.index + 20, p.n_cand):
                        got = s.proposal_keeps(flags, min(n_known, p.n_cand))
                        assert got in (-1, exact), (params, density, t, n_known)
                        decided += got != -1
                u = float(rng.random())
                for n_known in (8, 64, p.n_cand):   # the whole draw, when the answers determine it
                    got = lib.pd_proposal_draw_known(p, flags, n_known, top_k, inv_t, top_p, min_p, u)
                    if got >= 0:
                        drawn += 1
                        assert got == lib.pd_sample_allowed(_ptr(logits, "float *"), m.n_vocab, _ptr(w, "uint32_t *"),
                                                            top_k, 256, inv_t, top_p, min_p, u), (params, density, n_known)
                checked += 1
    assert checked == 6 * 4 * 60 and decided > checked and drawn > checked


# ---------------------------------------------------------------- forced runs, the engine, limits

def test_forced_runs_give_the_tokens_of_one_token_steps(smol):
    eng = Engine(smol.model)
    try:
        for what, schema in SCHEMAS[:8]:
            ids = smol.chat_tokens(_ask(smol, what))
            for kw in ({}, SAMPLED):
                eng.forced_runs = True
                batched = eng.submit(ids, 200, json_schema=schema, **kw).result()
                eng.forced_runs = False
                stepped = eng.submit(ids, 200, json_schema=schema, **kw).result()
                assert batched.tokens == stepped.tokens, (what, batched.text, stepped.text)
                # the forced tokens went through in fewer passes
                assert batched.stats.decode_passes <= stepped.stats.decode_passes
    finally:
        eng.close()


def test_forced_tokens_make_schema_output_take_fewer_passes(smol):
    what, schema = SCHEMAS[6]
    c = smol.chat(_ask(smol, what), 200, json_schema=schema)
    assert c.stats.decode_passes < len(c.tokens) - 1, (c.stats.decode_passes, len(c.tokens))


def test_the_engine_mixes_constrained_and_free_sequences(smol):
    what, schema = SCHEMAS[6]
    ids = smol.chat_tokens(_ask(smol, what))
    alone_free = smol.generate("The history of the bicycle", 40)
    alone_json = smol.generate(ids, 200, json_schema=schema)
    eng = smol.engine
    hs = [eng.submit(ids, 200, json_schema=schema), eng.submit("The history of the bicycle", 40),
          eng.submit("Date: ", 20, regex=r"[0-9]{4}-[0-9]{2}-[0-9]{2}", **SAMPLED)]
    out = [h.result() for h in hs]
    jsonschema.validate(json.loads(out[0].text), schema)
    assert out[0].tokens == alone_json.tokens
    assert out[1].tokens == alone_free.tokens
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", out[2].text)


def test_max_tokens_marks_the_output_incomplete(smol):
    c = smol.generate("Letters:", 3, regex="[a-z]( [a-z]){40}")   # a grammar that is not JSON
    assert c.finish_reason == "length" and c.complete is False
    assert "incomplete" in c.stop_detail
    with pytest.raises(ValueError, match="too small for json_schema"):   # JSON: refused up front
        smol.chat(_ask(smol, SCHEMAS[6][0]), 4, json_schema=SCHEMAS[6][1])
    c = smol.chat(_ask(smol, SCHEMAS[6][0]), 24, json_schema=SCHEMAS[6][1])
    assert c.finish_reason == "length" and c.complete is True     # ... or closed within the budget
    assert "closed with its shortest completion" in c.stop_detail and json.loads(c.text) is not None
    assert smol.generate("Hi", 3).complete is None   # unconstrained: not a question


def test_stop_strings_still_work(smol):
    c = smol.generate("Letters:", 40, grammar='start: "a, b, c"', stop=", b")   # forced text too
    assert c.text == "a" and c.finish_reason == "stop" and c.complete is False
    c = smol.generate("Letters:", 40, regex="[a-z]{1,3}(, [a-z]{1,3}){0,20}", stop=",")
    assert "," not in c.text and c.finish_reason == "stop" and c.stop_detail == "stop string ','"


def test_choices_of_one_end_before_any_step(smol):
    c = smol.generate("x", 8, choices=["only this"])
    assert c.text == "only this" and c.finish_reason == "stop" and c.complete
    n = len(c.tokens)
    assert n > 1
    c = smol.generate("x", n - 1, choices=["only this"])   # the forced run cut by max_tokens
    assert c.finish_reason == "length" and c.complete is False and len(c.tokens) == n - 1
    c = smol.generate("x", n, choices=["only this"])       # ... or just complete at it
    assert c.text == "only this" and c.finish_reason == "stop" and c.complete


def _nested(depth: int) -> dict:
    schema = inner = {"type": "object"}
    for _ in range(depth):
        inner["properties"] = {"a": {"type": "object"}}
        inner = inner["properties"]["a"]
    return schema


@pytest.mark.parametrize("kw, words", [
    (dict(json_schema="{not json"), "json_schema is not valid JSON"),
    (dict(json_schema={"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}}), "unclosed group"),
    (dict(json_schema={"type": "wizard"}), "wizard"),
    (dict(json_schema=[1, 2]), "json_schema must be a JSON Schema"),
    (dict(regex="(("), "regex"),
    (dict(regex=""), "regex must be a non-empty string"),
    (dict(grammar="start: undefined_rule"), "undefined_rule"),
    (dict(grammar='root ::= "a" | bogus'), "grammar (GBNF)"),
    (dict(choices=[]), "choices must be a non-empty list"),
    (dict(choices=["a", 3]), "choices must be non-empty strings"),
    (dict(response_format={"type": "xml"}), "response_format.type"),
    (dict(response_format={"type": "json_schema"}), "needs a json_schema object"),
    (dict(regex="a", choices=["a"]), "at most one"),
    (dict(json_schema={"type": "object"}, ignore_eos=True), "ignore_eos"),
    (dict(json_schema=_nested(500)), "more than 128 levels deep"),            # was a RecursionError
    (dict(choices=[f"c{i}" for i in range(2000)]), "at most 1999"),           # was an 88 KB RuntimeError
    (dict(json_schema='{"a":' * 10_000 + "1" + "}" * 10_000), "more than 128 levels deep"),
])
def test_a_bad_constraint_fails_before_decoding(smol, kw, words):
    eng = smol.engine
    with pytest.raises(ValueError) as e:
        eng.submit("x", 8, **kw)
    assert words in str(e.value)
    assert eng.n_active == 0 and eng.n_queued == 0


@pytest.mark.parametrize("kw, words", [
    (dict(regex=r"[^\s\S]"), "matches no text at all"),
    (dict(grammar="root ::= x\nx ::= x"), "matches no text at all"),
    (dict(grammar='root ::= ([a-z] | "if")+ "."'), "Too many items"),     # llguidance's mask item limit
])
@pytest.mark.parametrize("temperature", [0, 0.8])
def test_a_failing_grammar_is_an_error_not_a_stop(smol, kw, words, temperature):
    # the failed matcher's mask allows only the end tokens: that was an empty "stop" (HTTP 200)
    with pytest.raises(pydecode.constraint.ConstraintError, match=words) as e:
        smol.generate("Write:", 8, temperature=temperature, **kw)
    assert "<state>" not in str(e.value) and len(str(e.value)) < 500   # not llguidance's state dump
    assert smol.engine.n_active == 0 and smol.generate("Hi", 2).stats.generated_tokens >= 1


# ---------------------------------------------------------------- the C side of the mask

def _words(bits: np.ndarray) -> np.ndarray:
    n = len(bits)
    padded = np.zeros((n + 31) // 32 * 32, bool)
    padded[:n] = bits
    return np.packbits(padded.reshape(-1, 32)[:, ::-1], axis=1).view(">u4").astype(np.uint32).ravel()


def _ptr(a, t):
    return ffi.cast(t, a.ctypes.data)


@pytest.mark.parametrize("n", [1, 31, 32, 33, 1000, 49152, 151936])
def test_masked_argmax_and_apply_match_numpy(n):
    rng = np.random.default_rng(n)
    for density in (0.0, 0.001, 0.3, 0.97, 1.0):
        x = rng.standard_normal(n).astype(np.float32)
        x[rng.integers(0, n, 3)] = x.max()   # ties: the first allowed maximum wins, as numpy's
        bits = rng.random(n) < density
        w = _words(bits)
        got = lib.pd_argmax_masked(_ptr(x, "float *"), n, _ptr(w, "uint32_t *"))
        want = int(np.argmax(np.where(bits, x, -np.inf))) if bits.any() else -1
        assert got == want
        dst = np.empty(n, np.float32)
        cnt = lib.pd_apply_mask(_ptr(dst, "float *"), _ptr(x, "float *"), n, _ptr(w, "uint32_t *"))
        assert cnt == bits.sum() == lib.pd_mask_count(_ptr(w, "uint32_t *"), n)
        np.testing.assert_array_equal(dst, np.where(bits, x, -np.inf).astype(np.float32))


def test_llguidance_bit_layout_is_ours(smol):
    """A mask from llguidance, read through _words' layout: exactly the tokens it allows."""
    from pydecode.constraint import Constraint, compile_grammar, grammar_of
    tok = smol.tokenizer
    c = Constraint(tok, smol.model.n_vocab, compile_grammar(tok, grammar_of(regex="[0-9]+")))
    ptr = c._mask()
    words = np.frombuffer(ffi.buffer(ptr, c.words.nbytes), np.uint32)
    allowed = np.unpackbits(words.view(np.uint8), bitorder="little")[:smol.model.n_vocab].astype(bool)
    for t in np.flatnonzero(allowed)[:200]:
        assert re.fullmatch("[0-9]+", tok.decode([int(t)]))
    digits = [t for t in range(smol.model.n_vocab) if re.fullmatch("[0-9]+", tok.decode([t])) and not tok.is_special(t)]
    assert set(digits) <= set(np.flatnonzero(allowed).tolist())


def test_masked_summary_draw_is_the_masked_logits_draw(smol):
    """The step's sampling summary decides a masked top-k draw exactly, or declines (-1)."""
    m = smol.model
    ids = smol.tokenizer.encode("The quick brown fox jumps over the")
    rng = np.random.default_rng(0)
    m.set_summary(1 / 0.8)
    try:
        logits = np.array(m.prefill(ids, 0, seq=0), np.float32)
        decided = 0
        for density in (1.0, 0.9, 0.5, 0.05):
            bits = rng.random(m.n_vocab) < density
            bits[np.argsort(-logits)[:3]] = density > 0.5   # the best tokens refused half the time
            w = _words(bits)
            masked = np.where(bits, logits, -np.inf).astype(np.float32)
            for u in np.linspace(0.01, 0.99, 9):
                t = m.sample_summary_masked(40, 0.95, 0.0, float(u), _ptr(w, "uint32_t *"))
                want = lib.pd_sample_truncated(_ptr(masked, "float *"), m.n_vocab, 40, 256, 1 / 0.8, 0.95, 0.0, float(u))
                if t >= 0:
                    decided += 1
                    assert t == want and bits[t]
        assert decided > 0
    finally:
        m.set_summary(0.0)


# ---------------------------------------------------------------- everywhere: CLI, server, llama-cpp-python

def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "pydecode.cli", *args], capture_output=True, text=True,
                          timeout=300, **kw)


def test_cli_run_json_schema_regex_grammar(smollm_path, tmp_path):
    schema = SCHEMAS[6][1]
    f = tmp_path / "schema.json"
    f.write_text(json.dumps(schema))
    for arg in (str(f), json.dumps(schema)):
        r = _cli("run", "--chat", "-p", f"Reply with JSON only: {SCHEMAS[6][0]}.", "-n", "200", "--json-schema", arg,
                 "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        jsonschema.validate(json.loads(out["text"]), schema)
        assert out["complete"] is True
    r = _cli("run", "-p", "Date:", "-n", "20", "--regex", "[0-9]{4}-[0-9]{2}-[0-9]{2}", "--no-stats")
    assert r.returncode == 0 and re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", r.stdout.strip()), r.stdout
    g = tmp_path / "answer.gbnf"
    g.write_text('root ::= "yes" | "no"\n')
    r = _cli("run", "-p", "Is water wet?", "-n", "8", "--grammar", str(g), "--no-stats")
    assert r.returncode == 0 and r.stdout.strip() in ("yes", "no"), r.stdout
    r = _cli("chat", "-p", "Is water wet?", "-n", "8", "--grammar", str(g))
    assert r.returncode == 0 and r.stdout.strip() in ("yes", "no"), r.stdout + r.stderr


@pytest.mark.parametrize("args, words", [
    (["--json-schema", '{"type": "wizard"}'], "wizard"),
    (["--json-schema", "/no/such/schema.json"], "not a JSON Schema and not a readable file"),
    (["--regex", "(("], "regex"),
    (["--grammar", "/no/such.gbnf"], "cannot read it"),
    (["--regex", "a", "--json-schema", "{}"], "at most one"),
])
def test_cli_bad_constraint_is_a_clear_error(smollm_path, args, words):
    r = _cli("run", "-p", "x", "-n", "4", *args)
    assert r.returncode != 0 and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_llama_cpp_python_response_format(smollm_path):
    from pydecode import Llama
    schema = SCHEMAS[0][1]
    llm = Llama(str(smollm_path), n_ctx=512, verbose=False)
    try:
        r = llm.create_chat_completion([{"role": "user", "content": "A person as JSON."}], max_tokens=100,
                                       temperature=0, response_format={"type": "json_object", "schema": schema})
        jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), schema)
    finally:
        llm.close()


def test_speculative_decoding_keeps_the_constraint_and_the_tokens(smollm_path, smol):
    with pydecode.load(smollm_path, n_ctx=1024, n_threads=2, draft="lookup") as spec:
        for what, schema in SCHEMAS[:10]:
            want = smol.chat(_ask(smol, what), 200, json_schema=schema)
            got = spec.chat(_ask(spec, what), 200, json_schema=schema)
            assert got.tokens == want.tokens, (what, want.text, got.text)
        rx = r"[0-9]{1,3}(, [0-9]{1,3}){3,12}"   # repetitive text: the lookup drafts pay here
        want = smol.generate("1, 2, 3, 1, 2, 3, 1, 2, 3,", 60, regex=rx)
        got = spec.generate("1, 2, 3, 1, 2, 3, 1, 2, 3,", 60, regex=rx)
        assert got.tokens == want.tokens and re.fullmatch(rx, got.text)
