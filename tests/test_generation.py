"""Generation: determinism, scalar vs SIMD agreement, stop conditions, bad parameters.

SIMD_PART_TOL: scalar and AVX2 kernels sum in different orders (float rounding ~1e-6). That alone
would not matter, but every matmul input is quantized to 8 bits, activations often sit on exact
.5 rounding ties, and a 1-ulp difference flips a tie; 30 layers amplify the flips to logit
differences of 0.4-0.9 (measured on SmolLM2; the numpy q8 reference shows the same spread). So two
greedy runs may part where the top two logits are close. Where they part, the top two logits of
that step (scalar path) must be within SIMD_PART_TOL of each other.
"""
import numpy as np
import pytest

import pydecode

SIMD_PART_TOL = 0.5
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "Water boils at a temperature of",
    "The three primary colors are",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]
N = 32


@pytest.fixture(scope="module")
def llm(smollm_path):
    with pydecode.load(str(smollm_path), n_ctx=512, n_threads=2) as m:
        yield m


def test_greedy_is_deterministic(llm):
    a = llm.generate(PROMPTS[0], max_tokens=16)
    llm2 = pydecode.load(llm.model.path, n_ctx=512, n_threads=1)
    b = llm2.generate(PROMPTS[0], max_tokens=16)
    assert a.tokens == b.tokens and a.text == b.text
    assert "Paris" in a.text


def test_scalar_and_simd_agree(smollm_path):
    from pydecode._core import lib

    best = pydecode.Model(smollm_path, n_ctx=256, n_threads=2)
    if best.isa == "scalar":
        pytest.skip("no SIMD kernels on this CPU")
    scalar = pydecode.Model(smollm_path, n_ctx=256, n_threads=2, isa="scalar")
    parted = []
    for prompt in PROMPTS:
        toks = best.tokenizer.encode(prompt)
        outs = []
        for m in (scalar, best):
            seq, logits, steps = list(toks), m.prefill(toks).copy(), []
            for _ in range(N):
                t = int(np.argmax(logits))
                steps.append((t, logits.copy()))
                logits = m.decode_step(t, len(seq)).copy()
                seq.append(t)
            outs.append(steps)
        for i, ((ts, ls), (tb, lb)) in enumerate(zip(*outs)):
            if ts != tb:
                top2 = np.sort(ls)[-2:]
                assert top2[1] - top2[0] <= SIMD_PART_TOL, (prompt, i, top2)
                parted.append((prompt, i, float(top2[1] - top2[0])))
                break
    print("parted (prompt, step, top-2 margin):", parted)  # seen: 5 of 6, margins 0.01-0.17


def test_stream_matches_generate_and_is_utf8_clean(llm):
    full = llm.generate("Say hello in Japanese:", max_tokens=24)
    pieces = list(llm.stream("Say hello in Japanese:", max_tokens=24))
    assert "".join(p.text for p in pieces) == full.text
    assert "\ufffd" not in full.text


def test_stream_can_be_abandoned(llm):
    it = llm.stream("Count: 1, 2, 3,", max_tokens=50)
    first = [next(it) for _ in range(3)]
    it.close()
    assert len(first) == 3
    out = llm.generate("Count: 1, 2, 3,", max_tokens=5)
    assert out.stats.generated_tokens == 5


def test_stops_on_end_of_generation(llm):
    out = llm.chat([{"role": "user", "content": "Hi!"}], max_tokens=64)
    assert out.finish_reason == "stop", out.text
    assert "end-of-generation" in out.stop_detail
    assert "<|im_end|>" not in out.text


def test_context_full(smollm_path):
    llm = pydecode.load(str(smollm_path), n_ctx=16, n_threads=1)
    out = llm.generate("One two three four five", max_tokens=100)
    assert out.finish_reason == "length" and "context" in out.stop_detail
    assert out.stats.prompt_tokens + out.stats.generated_tokens == 16 + 1
    with pytest.raises(pydecode.ContextFullError, match="context"):
        llm.generate("word " * 40, max_tokens=4)


@pytest.mark.parametrize("kwargs,name", [
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": -3}, "max_tokens"),
    ({"temperature": float("nan")}, "temperature"), ({"temperature": -1.0}, "temperature"),
    ({"top_k": -1}, "top_k"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"min_p": 2.0}, "min_p"),
])
def test_bad_parameters_name_the_parameter(llm, kwargs, name):
    with pytest.raises(ValueError, match=name):
        llm.generate("Hi", **{"max_tokens": 4, **kwargs})


def test_bad_inputs_raise_not_crash(llm, smollm_path):
    m = llm.model
    with pytest.raises(ValueError, match="outside the vocabulary"):
        m.prefill([1, 2, 10**7])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        m.decode_step(-5, 3)
    with pytest.raises(pydecode.ContextFullError):
        m.decode_step(5, 10**6)
    with pytest.raises(ValueError, match="empty"):
        llm.generate([], max_tokens=3)
    with pytest.raises(ValueError, match="instruction set 'foo'"):
        pydecode.Model(smollm_path, n_ctx=32, isa="foo")
    with pytest.raises(ValueError, match="n_threads"):
        pydecode.Model(smollm_path, n_ctx=32, n_threads=0)
    with pytest.raises(ValueError, match="n_ctx"):
        pydecode.Model(smollm_path, n_ctx=0)


def test_sampling_is_seeded(llm):
    a = llm.generate("My favourite food is", max_tokens=12, temperature=0.8, top_p=0.9, seed=7)
    b = llm.generate("My favourite food is", max_tokens=12, temperature=0.8, top_p=0.9, seed=7)
    assert a.tokens == b.tokens
