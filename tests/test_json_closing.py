"""JSON that always closes within max_tokens (pydecode/budget.py, json_closer.py, json_leaves.py).

The closer is checked against llguidance itself: random walks under each schema's grammar (any
allowed token, the forced runs taken), and at every prefix the closer's shortest completion must
be accepted by the grammar, complete it, and give JSON that validates. Then on a real model:
every schema's output parses and validates at small max_tokens, greedy and sampled, with
finish_reason "length" where it was cut; a schema that cannot fit is refused before decoding."""
import json
import random
from decimal import Decimal

import jsonschema
import numpy as np
import pytest

import pydecode
from pydecode import constraint
from pydecode.json_leaves import shortest_completion

from structured_schemas import SCHEMAS, checked_closing, random_allowed_step

FREE = {"type": "object", "properties": {   # the issue's "describe a person": nothing bounded
    "name": {"type": "string"}, "age": {"type": "integer"}, "height": {"type": "number"},
    "hobbies": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    "required": ["name", "age", "height", "hobbies", "address"]}
TREE = {"$defs": {"node": {"type": "object", "properties": {
    "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
    "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"}
EXTRA = [
    FREE, TREE,
    {"anyOf": [{"type": "object", "properties": {"cat": {"type": "string"}}, "required": ["cat"]},
               {"type": "object", "properties": {"dog": {"type": "integer", "minimum": 3}}, "required": ["dog"]}]},
    {"oneOf": [{"type": "string", "minLength": 4}, {"type": "array", "items": {"type": "boolean"}, "minItems": 2}]},
    {"type": "object", "properties": {"k": {"const": "fixed"}, "t": {"type": ["integer", "null"]}},
     "required": ["k", "t"]},
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "number"}], "minItems": 2},
    {"type": "object", "properties": {"d": {"type": "string", "format": "date"},
                                      "e": {"type": "string", "format": "email"},
                                      "u": {"type": "string", "format": "uuid"}}, "required": ["d", "e", "u"]},
    {"type": "object", "additionalProperties": {"type": "integer", "minimum": 18, "maximum": 99}, "minProperties": 0},
    {},
    {"type": "object", "properties": {"lo": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                                      "neg": {"type": "integer", "minimum": -50, "maximum": -20},
                                      "big": {"type": "integer", "minimum": 1000}},
     "required": ["lo", "neg", "big"]},
    {"type": "array", "items": {"type": "array", "items": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
                                "minItems": 1}, "minItems": 2},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
               {"properties": {"b": {"type": "boolean"}}, "required": ["b"]}]},
]
ALL = [s for _, s in SCHEMAS] + EXTRA


def validate(text: str, schema) -> None:
    """jsonschema's check, in decimals (as floats 303.9 is no multiple of 0.01)."""
    as_dec = json.loads(json.dumps(schema), parse_float=Decimal)
    jsonschema.validate(json.loads(text, parse_float=_decimal), as_dec)


def _decimal(t: str):
    try:
        return Decimal(t)
    except ArithmeticError:   # an exponent past Decimal's: as a float (inf), still valid JSON
        return float(t)


def _walk(tok, n_vocab, schema, rng, steps):
    """A random output under schema's grammar: yields (text so far, the closing's text) after
    each step; asserts the closing is accepted and completes the grammar."""
    g = constraint.compile_grammar(tok, constraint.grammar_of(json_schema=schema))
    c = constraint.Constraint(tok, n_vocab, g)
    out = list(c.initial())
    eog = tok.eog_ids
    for _ in range(steps):
        full = checked_closing(c, tok, out)
        validate(full, schema)
        if c.done:
            return
        if not random_allowed_step(c, rng, tok, n_vocab, eog, out):
            return


@pytest.fixture(scope="module")
def smol(smollm_path):
    with pydecode.load(smollm_path, n_ctx=1024, n_threads=2, n_seq=2) as m:
        yield m


@pytest.mark.parametrize("i", range(len(ALL)))
def test_closing_is_accepted_at_every_prefix_of_random_outputs(smol, i):
    rng = random.Random(i)
    for _ in range(6):
        _walk(smol.tokenizer, smol.model.n_vocab, ALL[i], rng, 48)


def test_regex_shortest_completion():
    assert shortest_completion("^[0-9]{5}$", "12") == "000"
    assert shortest_completion("^[a-z]{1,10}@[a-z]{1,10}\\.(com|org)$", "ab@c.o") == "rg"
    assert shortest_completion("abc", "xxab") == "c"            # unanchored: a match anywhere
    assert shortest_completion("^ab$", "x") is None
    assert shortest_completion("(a)\\1", "") is None           # a backreference: beyond an NFA


@pytest.mark.parametrize("max_tokens", [12, 24, 48])
@pytest.mark.parametrize("sampled", [False, True])
def test_outputs_cut_by_max_tokens_still_parse(smol, max_tokens, sampled):
    mode = dict(temperature=1.2, top_k=0, top_p=1.0, seed=3) if sampled else {}
    bad, cut = [], 0
    for schema in [s for _, s in SCHEMAS[:12]] + [FREE, TREE]:
        try:
            c = smol.chat([{"role": "user", "content": "Describe a person as JSON."}], max_tokens,
                          json_schema=schema, **mode)
        except ValueError as e:
            assert "too small" in str(e)
            continue
        assert len(c.tokens) <= max_tokens
        cut += c.finish_reason == "length"
        try:
            validate(c.text, schema)
            assert c.complete
        except Exception as e:
            bad.append(f"{type(e).__name__}: {str(e)[:120]} -- {c.text!r} ({c.stop_detail})")
    assert not bad, "\n".join(bad)
    if max_tokens == 12:
        assert cut > 0   # (the closing ran)


def test_a_schema_that_cannot_fit_is_refused_before_decoding(smol):
    with pytest.raises(ValueError, match=r"max_tokens=4 is too small for json_schema: its shortest valid output"):
        smol.chat([{"role": "user", "content": "Hi"}], 4, json_schema=SCHEMAS[6][1])
    c = smol.chat([{"role": "user", "content": "Hi"}], 24, json_schema=SCHEMAS[6][1])   # just enough
    validate(c.text, SCHEMAS[6][1])


def test_the_context_also_bounds_the_closing(smollm_path):
    with pydecode.load(smollm_path, n_ctx=64, n_threads=2) as m:
        prompt = m.tokenizer.encode("word " * 12)
        c = m.generate(prompt, 200, json_schema=FREE, temperature=1.5, seed=1)
        validate(c.text, FREE)
        assert c.finish_reason == "length" and len(prompt) + len(c.tokens) <= 64 + 1


def test_closing_in_batched_steps_and_with_speculative_decoding(smol, smollm_path):
    """Four constrained sequences in one batch, cut by max_tokens, close as each would alone; with
    prompt-lookup drafts the tokens are the same as without."""
    schemas = [s for _, s in SCHEMAS[:4]] + [FREE]
    hs = [smol.engine.submit("Describe a person as JSON.", 30, json_schema=s) for s in schemas]
    outs = [h.result() for h in hs]
    for o, s in zip(outs, schemas):
        validate(o.text, s)
        assert o.tokens == smol.generate("Describe a person as JSON.", 30, json_schema=s).tokens
    with pydecode.load(smollm_path, n_ctx=1024, n_threads=2, draft="lookup") as spec:
        for o, s in zip(outs, schemas):
            assert spec.generate("Describe a person as JSON.", 30, json_schema=s).tokens == o.tokens
