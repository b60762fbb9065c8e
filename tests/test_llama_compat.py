"""llama-cpp-python's Llama on pydecode (issue 34, item 4): every parameter of its signatures is
honoured (each by a named test here), has nothing to do on a CPU runtime (NO_EFFECT, with the
reason) or is refused by name (REFUSED): none is accepted and ignored. The signatures are
llama-cpp-python 0.3.36's (tests/data/llama_cpp_python_0.3.36_signatures.json: names and
defaults read from its llama.py, MIT)."""
import ast
import inspect
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import pydecode.compat as lc
from pydecode import Llama, LlamaGrammar

SIGS = json.loads((Path(__file__).parent / "data" / "llama_cpp_python_0.3.36_signatures.json").read_text())
T = "test_"   # (the honoured parameters below name the test that shows each)
SAMPLING = {"temperature": T + "sampling_parameters_reach_the_sampler", "top_p": T + "top_p_zero_is_greedy_whatever_the_seed",
            "top_k": T + "sampling_parameters_reach_the_sampler", "min_p": T + "sampling_parameters_reach_the_sampler",
            "typical_p": T + "sampling_parameters_reach_the_sampler", "tfs_z": T + "sampling_parameters_reach_the_sampler",
            "mirostat_mode": T + "mirostat_reaches_the_sampler", "mirostat_tau": T + "mirostat_reaches_the_sampler",
            "mirostat_eta": T + "mirostat_reaches_the_sampler", "repeat_penalty": T + "sampling_parameters_reach_the_sampler",
            "frequency_penalty": T + "sampling_parameters_reach_the_sampler",
            "presence_penalty": T + "sampling_parameters_reach_the_sampler", "seed": T + "seed_chain_and_saved_state",
            "logits_processor": T + "logits_processor_and_stopping_criteria",
            "stopping_criteria": T + "logits_processor_and_stopping_criteria", "grammar": T + "grammar_constrains_completions_and_chats",
            "logit_bias": T + "logit_bias_is_honoured", "stop": T + "sampling_parameters_reach_the_sampler",
            "max_tokens": T + "sampling_parameters_reach_the_sampler", "stream": T + "streams_follow_the_context",
            "model": T + "sampling_parameters_reach_the_sampler"}
COMPLETION = {**SAMPLING, "prompt": T + "sampling_parameters_reach_the_sampler", "suffix": T + "suffix_fills_in_the_middle",
              "logprobs": T + "streams_follow_the_context", "echo": T + "streams_follow_the_context"}
HONOURED = {
    "__init__": {"model_path": T + "vocab_only_loads_the_vocabulary", "vocab_only": T + "vocab_only_loads_the_vocabulary",
                 "seed": T + "seed_chain_and_saved_state", "n_ctx": T + "token_level_loop",
                 "n_threads": T + "token_level_loop", "pooling_type": T + "embeddings",
                 "attention_type": T + "constructor_refuses_what_would_change_the_model",
                 "logits_all": T + "token_level_loop", "embedding": T + "embeddings",
                 "last_n_tokens_size": T + "constructor_refuses_what_would_change_the_model",
                 "chat_format": T + "constructor_refuses_what_would_change_the_model",
                 "draft_model": T + "draft_model_is_prompt_lookup", "type_k": T + "constructor_refuses_what_would_change_the_model",
                 "type_v": T + "constructor_refuses_what_would_change_the_model", "spm_infill": T + "suffix_fills_in_the_middle",
                 "verbose": T + "vocab_only_loads_the_vocabulary"},
    "create_completion": COMPLETION, "__call__": COMPLETION,
    "create_chat_completion": {**SAMPLING, "messages": T + "grammar_constrains_completions_and_chats",
                               "functions": "tests/test_tool_calls.py", "function_call": "tests/test_tool_calls.py",
                               "tools": "tests/test_tool_calls.py", "tool_choice": "tests/test_tool_calls.py",
                               "response_format": "tests/test_structured.py", "logprobs": T + "streams_follow_the_context",
                               "top_logprobs": T + "streams_follow_the_context"},
    "generate": {**SAMPLING, "tokens": T + "token_level_loop", "temp": T + "token_level_loop",
                 "reset": T + "token_level_loop", "penalize_nl": T + "token_level_loop"},
    "sample": {**SAMPLING, "temp": T + "token_level_loop", "penalize_nl": T + "token_level_loop",
               "idx": T + "token_level_loop"},
    "embed": {"input": T + "embeddings", "normalize": T + "embeddings", "truncate": T + "embeddings",
              "return_count": T + "embeddings"},
    "create_embedding": {"input": T + "embeddings", "model": T + "embeddings"},
    "from_pretrained": {"repo_id": "tests/test_registry.py", "filename": "tests/test_registry.py",
                        "local_dir_use_symlinks": "(huggingface_hub ignores it)",
                        "additional_files": T + "from_pretrained_refuses_what_it_does_not_do",
                        "local_dir": T + "from_pretrained_refuses_what_it_does_not_do",
                        "cache_dir": T + "from_pretrained_refuses_what_it_does_not_do"},
    "tokenize": {n: T + "tokenize_and_detokenize_as_llama_cpp_python" for n in ("text", "add_bos", "special")},
    "detokenize": {n: T + "tokenize_and_detokenize_as_llama_cpp_python" for n in ("tokens", "prev_tokens", "special")},
    "eval": {"tokens": T + "token_level_loop"}, "set_cache": {"cache": T + "prompt_caches"},
    "set_seed": {"seed": T + "seed_chain_and_saved_state"}, "load_state": {"state": T + "seed_chain_and_saved_state"},
    "logits_to_logprobs": {"logits": T + "tokenize_and_detokenize_as_llama_cpp_python",
                           "axis": T + "tokenize_and_detokenize_as_llama_cpp_python"},
    "longest_token_prefix": {"a": T + "prompt_caches", "b": T + "prompt_caches"},
}


@pytest.mark.parametrize("fn", sorted(SIGS))
def test_every_parameter_is_honoured_without_effect_or_refused(fn):
    """Each llama-cpp-python parameter is in our signature with its default, and is honoured
    (the test named for it exists), has no effect here (NO_EFFECT, with why) or is refused
    unless default (REFUSED, LlamaGrammar-free defaults); nothing else."""
    ours = inspect.signature(getattr(Llama, fn)).parameters
    for name, default in SIGS[fn].items():
        assert name in ours, f"{fn}: llama-cpp-python's parameter {name} is missing"
        if default is not None and ours[name].default is not inspect.Parameter.empty:
            try:
                theirs = ast.literal_eval(default)
            except ValueError:   # a constant of theirs (LLAMA_DEFAULT_SEED, llama_cpp.LLAMA_SPLIT_MODE_LAYER)
                continue
            assert ours[name].default == theirs, f"{fn}({name}=...): default {ours[name].default!r} != {theirs!r}"
        if fn == "__init__" and (name in lc.NO_EFFECT or name in lc.REFUSED):
            continue
        where = HONOURED.get(fn, {}).get(name)
        assert where, f"{fn}({name}=...) is neither honoured (with a test), nor NO_EFFECT, nor REFUSED"
        if where.startswith(T):
            assert where in globals(), f"{fn}({name}): the test {where} does not exist"
    assert not (set(lc.NO_EFFECT) & set(lc.REFUSED))


@pytest.fixture(scope="module")
def llm(smollm_path):
    m = Llama(model_path=str(smollm_path), n_ctx=256, verbose=False, seed=1)
    yield m
    m.close()


def test_constructor_refuses_what_would_change_the_model(smollm_path):
    for kw in (dict(rope_freq_base=10000.0), dict(lora_path="a.gguf"), dict(kv_overrides={"a": 1}),
               dict(attention_type=1), dict(pooling_type=4), dict(type_k=1, type_v=8), dict(type_k=2),
               dict(chat_handler=object())):
        with pytest.raises(NotImplementedError, match=next(iter(kw))):
            Llama(model_path=str(smollm_path), verbose=False, **kw)
    with pytest.raises(TypeError, match="no_such"):
        Llama(model_path=str(smollm_path), verbose=False, no_such=1)
    with pytest.warns(DeprecationWarning, match="n_parts"):
        Llama(model_path=str(smollm_path), n_ctx=64, verbose=False, n_parts=1).close()
    with pytest.warns(DeprecationWarning, match="f16_kv.*honoured"):
        m = Llama(model_path=str(smollm_path), n_ctx=64, verbose=False, f16_kv=False)
    assert m._llm.model.kv_type == "f32"
    m.close()
    m = Llama(model_path=str(smollm_path), n_ctx=128, verbose=False, n_gpu_layers=-1, use_mlock=True,
              rope_freq_base=0.0, type_k=8, type_v=8, last_n_tokens_size=32, flash_attn=True, attention_type=0)
    try:
        assert m._llm.model.kv_type == "q8_0" and m.last_n_tokens_size == 32
        assert m("Hello", max_tokens=2)["usage"]["completion_tokens"] == 2
    finally:
        m.close()
    m = Llama(model_path=str(smollm_path), n_ctx=64, verbose=False, chat_format="llama-2")
    try:   # the named format's turns, not the model's ChatML
        assert m._llm.chat_prompt([{"role": "user", "content": "Hi"}]).endswith("[INST] Hi [/INST]")
    finally:
        m.close()
    with pytest.raises(ValueError, match="chat_format='no-such-format'.*chatml"):
        Llama(model_path=str(smollm_path), n_ctx=64, verbose=False, chat_format="no-such-format")


def test_vocab_only_loads_the_vocabulary(smollm_path, capsys):
    v = Llama(model_path=str(smollm_path), vocab_only=True, verbose=True)
    full = Llama(model_path=str(smollm_path), n_ctx=64, verbose=False)
    try:
        assert v._ctx.ctx is not None and v.n_vocab() == full.n_vocab()
        ids = v.tokenize(b"Hello World")
        assert ids == full.tokenize(b"Hello World") and v.detokenize(ids) == b"Hello World"
        assert v.token_eos() == full.token_eos() and v.token_nl() == full.token_nl() >= 0
        with pytest.raises(RuntimeError, match="vocab_only"):
            v("Hello", max_tokens=1)
        with pytest.raises(RuntimeError, match="vocab_only"):
            v.eval([1, 2])
    finally:
        full.close()
        v.close()
    assert "pydecode: loaded" not in capsys.readouterr().err


def test_tokenize_and_detokenize_as_llama_cpp_python():
    """llama-cpp-python's test_llama_cpp_tokenization, on the same vocabulary file (llama.cpp's
    ggml-vocab-llama-spm.gguf, from the tokenizer suite the tests fetch), vocab_only."""
    sys.path.insert(0, str(Path(__file__).parent))
    import conformance
    llama = Llama(model_path=str(conformance.tokenizer_dir() / "ggml-vocab-llama-spm.gguf"), vocab_only=True,
                  verbose=False)
    assert llama._ctx.ctx is not None
    tokens = llama.tokenize(b"Hello World")
    assert tokens == [1, 15043, 2787] and tokens[0] == llama.token_bos()
    assert llama.detokenize(tokens) == b"Hello World"
    tokens = llama.tokenize(b"Hello World", add_bos=False)
    assert tokens == [15043, 2787] and llama.detokenize(tokens) != b"Hello World"   # (" Hello World")
    assert llama.detokenize([2787], prev_tokens=[1, 15043]) == b" World"
    assert llama.tokenize(b"Hello World</s>") == [1, 15043, 2787, 829, 29879, 29958]
    assert llama.tokenize(b"Hello World</s>", special=True) == [1, 15043, 2787, 2]
    assert llama.detokenize([1, 15043, 2], special=True).endswith(b"</s>")
    assert llama.tokenize(b"", add_bos=True, special=True) == [llama.token_bos()]
    assert llama.detokenize([llama.token_bos()]) == b""
    lp = Llama.logits_to_logprobs(np.array([[1.0, 2.0, 3.0]]), axis=-1)
    np.testing.assert_allclose(np.exp(lp).sum(), 1.0, rtol=1e-6)


def test_from_pretrained_refuses_what_it_does_not_do():
    for kw in (dict(additional_files=["x"]), dict(local_dir="/tmp"), dict(cache_dir="/tmp")):
        with pytest.raises(NotImplementedError, match=next(iter(kw))):
            Llama.from_pretrained("owner/repo", "x.gguf", **kw)


def test_top_p_zero_is_greedy_whatever_the_seed(llm):
    greedy = llm("Once upon a time", max_tokens=12, temperature=0)["choices"][0]["text"]
    texts = {llm("Once upon a time", max_tokens=12, temperature=0.8, top_p=0, seed=s)["choices"][0]["text"]
             for s in (1, 2, 3, 4)}
    assert texts == {greedy}


def test_sampling_parameters_reach_the_sampler(llm):
    """Each sampling knob changes what a seeded call draws (or keeps it greedy where it must)."""
    base = dict(max_tokens=10, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5, model="m")
    plain = llm("The weather today", **base)
    assert plain["model"] == "m" and plain["usage"]["completion_tokens"] <= 10
    for kw in (dict(temperature=0.3), dict(top_k=3), dict(min_p=0.3), dict(typical_p=0.3), dict(tfs_z=0.3),
               dict(repeat_penalty=1.5), dict(frequency_penalty=2.0), dict(presence_penalty=2.0)):
        texts = {llm("The weather today", **{**base, **kw, "seed": s})["choices"][0]["text"] for s in (5, 6, 7)}
        again = llm("The weather today", **{**base, **kw})["choices"][0]["text"]
        assert again == llm("The weather today", **{**base, **kw})["choices"][0]["text"], kw   # seeded
        assert texts != {plain["choices"][0]["text"]}, kw
    stopped = llm("1, 2, 3, 4,", max_tokens=20, temperature=0, stop=[" 6"])
    assert " 6" not in stopped["choices"][0]["text"] and stopped["choices"][0]["finish_reason"] == "stop"
    for bad in (dict(typical_p=0.0), dict(mirostat_mode=3), dict(mirostat_tau=-1.0, mirostat_mode=2)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            llm("x", max_tokens=1, **bad)


def test_mirostat_reaches_the_sampler(llm):
    """Mirostat 2 with a tiny target surprise keeps only the most likely token: greedy's text,
    whatever the seed; a normal tau samples."""
    greedy = llm("Once upon a time", max_tokens=12, temperature=0)["choices"][0]["text"]
    for mode in (1, 2):
        tight = {llm("Once upon a time", max_tokens=12, temperature=0.8, mirostat_mode=mode, mirostat_tau=0.001,
                     mirostat_eta=0.1, seed=s)["choices"][0]["text"] for s in (1, 2)}
        assert tight == {greedy}, mode
    loose = {llm("Once upon a time", max_tokens=12, temperature=1.0, mirostat_mode=2, mirostat_tau=8.0,
                 seed=s)["choices"][0]["text"] for s in (1, 2, 3)}
    assert len(loose) > 1


def test_logits_processor_and_stopping_criteria(llm):
    target = llm.tokenize(b" banana", add_bos=False)[0]
    seen = []

    def force(input_ids, scores):
        seen.append(len(input_ids))
        scores[:] = -np.inf
        scores[target] = 0.0
        return scores

    out = llm("I like", max_tokens=4, temperature=0.8, logits_processor=lc.LogitsProcessorList([force]))
    assert out["choices"][0]["text"] == " banana" * 4
    n_prompt = out["usage"]["prompt_tokens"]
    assert seen == [n_prompt + i for i in range(4)]   # input_ids: the prompt and the tokens so far
    stop_at = lc.StoppingCriteriaList([lambda ids, logits: len(ids) >= n_prompt + 2])
    out = llm("I like", max_tokens=8, temperature=0, stopping_criteria=stop_at)
    assert out["usage"]["completion_tokens"] == 2 and out["choices"][0]["finish_reason"] == "stop"
    with pytest.raises(TypeError, match="logits_processor"):
        llm("I like", max_tokens=2, logits_processor=lambda ids, s: s[:10])
    chat = llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=3,
                                      logits_processor=[force])
    assert chat["choices"][0]["message"]["content"] == " banana" * 3
    assert llm("I like", max_tokens=2, temperature=0)["usage"]["completion_tokens"] == 2   # still serving


def test_grammar_constrains_completions_and_chats(llm, tmp_path):
    g = LlamaGrammar.from_string('root ::= "yes" | "no"')
    for seed in (1, 2):
        out = llm("Is the sky blue? Answer:", max_tokens=8, grammar=g, seed=seed)["choices"][0]
        assert out["text"] in ("yes", "no") and out["finish_reason"] == "stop"
    f = tmp_path / "n.gbnf"
    f.write_text('root ::= [0-9]+ "."\n')
    reply = llm.create_chat_completion([{"role": "user", "content": "Pick a number."}], max_tokens=6,
                                       grammar=LlamaGrammar.from_file(str(f)))
    text = reply["choices"][0]["message"]["content"]
    assert text[:1].isdigit() and (text.endswith(".") or reply["choices"][0]["finish_reason"] == "length")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    out = llm("JSON:", max_tokens=12, grammar=LlamaGrammar.from_json_schema(json.dumps(schema)))
    assert isinstance(json.loads(out["choices"][0]["text"])["a"], int)
    with pytest.raises(TypeError, match="grammar"):
        llm("x", max_tokens=1, grammar=42)
    with pytest.raises(ValueError):
        LlamaGrammar.from_string("root ::= (")


def test_logit_bias_is_honoured(llm):
    plain = llm("The capital of France is", max_tokens=3, temperature=0)
    first = llm.tokenize(plain["choices"][0]["text"].encode(), add_bos=False)[0]
    banned = llm("The capital of France is", max_tokens=3, temperature=0, logit_bias={first: -float("inf")})
    assert llm.tokenize(banned["choices"][0]["text"].encode(), add_bos=False)[0] != first


def test_streams_follow_the_context(llm):
    whole = llm("Once upon a time", max_tokens=6, temperature=0, logprobs=2, echo=True)
    parts = list(llm("Once upon a time", max_tokens=6, temperature=0, logprobs=2, echo=True, stream=True))
    assert "".join(p["choices"][0]["text"] for p in parts) == whole["choices"][0]["text"]
    assert whole["choices"][0]["text"].startswith("Once upon a time")
    assert len(whole["choices"][0]["logprobs"]["top_logprobs"]) >= 6
    # the context is what the slot now holds: the prompt and the tokens decoded
    ids = llm.tokenize(b"Once upon a time")
    assert llm.input_ids[:len(ids)].tolist() == ids and llm.n_tokens >= len(ids) + 5
    chat = llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0,
                                      logprobs=True, top_logprobs=2)
    assert len(chat["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2


def test_token_level_loop(smollm_path):
    """llama-cpp-python's own checks (tests/test_llama.py: exact and shorter prefix reuse, a
    saved state loaded into another instance), and logits_all / idx / penalize_nl."""
    def make(**kw):
        return Llama(str(smollm_path), n_ctx=64, n_threads=2, verbose=False, **kw)

    def gen(m, toks, n=3, **kw):
        out = []
        for t in m.generate(toks, temp=0.0, **kw):
            out.append(t)
            if len(out) == n:
                break
        return out

    fresh = make()
    try:
        toks = fresh.tokenize(b"The quick brown fox", add_bos=True, special=True)
        expected = gen(fresh, toks)
        assert expected == fresh.tokenize(fresh("The quick brown fox", max_tokens=3, temperature=0)["choices"][0]
                                          ["text"].encode(), add_bos=False)
        reference = fresh._llm.model.prefill(toks).copy()
    finally:
        fresh.close()   # (one model less held at once: each instance is its own copy of the weights)
    cached, loaded = make(), make(logits_all=True)
    try:
        cached.eval(toks)
        assert cached.n_tokens == len(toks) and cached.input_ids[:len(toks)].tolist() == toks
        assert cached.sample(temp=0.0, idx=len(toks) - 1) == expected[0]
        assert gen(cached, toks) == expected and cached.n_tokens == len(toks) + 2   # no re-evaluation
        cached.reset()
        cached.eval(toks + cached.tokenize(b" jumps over the lazy dog", add_bos=False))
        assert gen(cached, toks) == expected                                          # a shorter prefix
        state = cached.save_state()
        loaded.eval([loaded.token_eos()] * len(toks))
        loaded.load_state(state)
        assert loaded.input_ids[:loaded.n_tokens].tolist() == cached.input_ids[:cached.n_tokens].tolist()
        loaded.reset()
        loaded.eval(toks)
        # logits_all: every position's logits, each one's sample()
        assert loaded.scores.shape[0] == 64
        np.testing.assert_allclose(loaded.scores[len(toks) - 1], reference, atol=1e-3)
        first = loaded.sample(temp=0.0, idx=0)
        assert first == int(np.argmax(loaded.scores[0]))
        with pytest.raises(ValueError, match="logits_all"):
            cached.sample(temp=0.0, idx=0)
        # penalize_nl=False leaves the newline out of the penalties
        nl = cached.token_nl()
        cached.reset()
        cached.eval(cached.tokenize(b"a\nb\nc\nd\n"))
        p = dict(temp=0.0, repeat_penalty=100.0)
        assert cached.sample(**p, penalize_nl=False) != nl or cached.sample(**p) != nl
        # stopping_criteria and a grammar in generate
        stop = [lambda ids, logits: len(ids) >= len(toks) + 1]
        assert len(list(cached.generate(toks, temp=0.0, stopping_criteria=stop))) == 1
        g = LlamaGrammar.from_string('root ::= " yes" | " no"')
        got = []
        for t in cached.generate(toks, temp=0.7, grammar=g):
            if t == cached.token_eos():
                break
            got.append(t)
        assert cached.detokenize(got).decode() in (" yes", " no")
        # sample(grammar=): a token the grammar may start with (a fresh grammar each call, as
        # llama-cpp-python's temporary sampler), at any temperature
        starts = {cached.tokenize(w, add_bos=False)[0] for w in (b" yes", b" no")}
        for temp in (0.0, 1.5):
            t = cached.sample(temp=temp, grammar=g)
            assert cached.detokenize([t]).decode() in (" ", " yes", " no", " y", " n", " ye") or t in starts
        with pytest.raises(Exception, match="n_ctx"):
            cached.eval(list(toks) * 40)
    finally:
        cached.close()
        loaded.close()


def test_seed_chain_and_saved_state(llm):
    """test_real_llama's check: after set_seed, two unseeded calls draw differently, and
    load_state brings back the first's draw (the state carries the seed)."""
    llm.set_seed(1337)
    state = llm.save_state()
    kw = dict(max_tokens=8, top_k=50, top_p=0.9, temperature=1.0)
    one, two = (llm("Pick a number from 1 to 10?:\n", **kw)["choices"][0]["text"] for _ in range(2))
    llm.load_state(state)
    three = llm("Pick a number from 1 to 10?:\n", **kw)["choices"][0]["text"]
    assert one != two and one == three
    assert llm("Hi", max_tokens=6, seed=3)["choices"][0]["text"] == llm("Hi", max_tokens=6, seed=3)["choices"][0]["text"]
    with pytest.raises(TypeError, match="LlamaState"):
        llm.load_state(b"nope")


def test_prompt_caches(smollm_path, tmp_path):
    """test_ram_cache_exact_prompt_hit_matches_fresh: a second instance's completion starts from
    the cached state (load_state called once) and answers the same; the disk cache too."""
    def make():
        return Llama(str(smollm_path), n_ctx=64, n_threads=2, verbose=False)

    for cache in (lc.LlamaRAMCache(), lc.LlamaDiskCache(str(tmp_path / "c"))):
        fresh = make()
        toks = fresh.tokenize(b"The quick brown fox", add_bos=True, special=True)
        expected = fresh.create_completion(toks, max_tokens=1, temperature=0.0, seed=1337)
        fresh.close()
        writer, cached = make(), make()
        try:
            writer.set_cache(cache)
            writer.create_completion(toks, max_tokens=1, temperature=0.0, seed=1337)
            assert toks in cache
            calls = []
            original = cached.load_state
            cached.load_state = lambda s: (calls.append(1), original(s))
            cached.set_cache(cache)
            got = cached.create_completion(toks, max_tokens=1, temperature=0.0, seed=1337)
            assert calls == [1] and got["choices"][0]["text"] == expected["choices"][0]["text"]
        finally:
            writer.close()
            cached.close()


def test_suffix_fills_in_the_middle(llm):
    from pydecode.registry import model_path
    coder = Llama(model_path("qwen2.5-coder-0.5b"), n_ctx=256, n_threads=2, verbose=False)
    try:
        out = coder("def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n", max_tokens=6, temperature=0)
        assert "a + b" in out["choices"][0]["text"]
        spm = Llama(model_path("qwen2.5-coder-0.5b"), n_ctx=256, n_threads=2, verbose=False, spm_infill=True)
        try:
            assert spm("x = ", suffix="\n", max_tokens=2, temperature=0)["usage"]["prompt_tokens"] == \
                coder("x = ", suffix="\n", max_tokens=2, temperature=0)["usage"]["prompt_tokens"]
        finally:
            spm.close()
    finally:
        coder.close()
    with pytest.raises(ValueError, match="fill-in-the-middle"):
        llm("def f():", suffix="\n", max_tokens=2)


def test_embeddings(smollm_path):
    plain = Llama(str(smollm_path), n_ctx=64, verbose=False)
    try:
        with pytest.raises(RuntimeError, match="embedding=True"):
            plain.embed("Hello")
    finally:
        plain.close()
    m = Llama(str(smollm_path), n_ctx=64, verbose=False, embedding=True, pooling_type=1)
    try:
        assert m.pooling_type() == 1
        one = m.embed("Hello World")
        assert len(one) == m.n_embd()
        both = m.embed(["Hello World", "A different prompt"], normalize=True)
        np.testing.assert_allclose(np.linalg.norm(both[0]), 1.0, rtol=1e-5)
        np.testing.assert_allclose(both[0], np.asarray(one) / np.linalg.norm(one), rtol=1e-4, atol=1e-5)
        vecs, n = m.embed(["a b c " * 40], truncate=True, return_count=True)
        assert n == 64 and len(vecs[0]) == m.n_embd()
        r = m.create_embedding(["x", "y"], model="e")
        assert r["model"] == "e" and [d["index"] for d in r["data"]] == [0, 1] and r["usage"]["prompt_tokens"] > 0
    finally:
        m.close()
    per_token = Llama(str(smollm_path), n_ctx=64, verbose=False, embedding=True, pooling_type=0)
    try:
        rows = per_token.embed("Hello World")
        assert len(rows) == len(per_token.tokenize(b"Hello World")) and len(rows[0]) == per_token.n_embd()
    finally:
        per_token.close()


def test_draft_model_is_prompt_lookup(smollm_path):
    m = Llama(str(smollm_path), n_ctx=256, verbose=False, draft_model=lc.LlamaPromptLookupDecoding(num_pred_tokens=4))
    plain = Llama(str(smollm_path), n_ctx=256, verbose=False)
    try:
        p = "a b c d e f a b c d e f a b c"
        assert m(p, max_tokens=12, temperature=0)["choices"][0]["text"] == \
            plain(p, max_tokens=12, temperature=0)["choices"][0]["text"]
    finally:
        m.close()
        plain.close()
    f = lc.LlamaPromptLookupDecoding.find_candidate_pred_tokens
    assert f(np.array([1, 2, 3, 1, 2, 3, 1, 2, 3]), 3, 2).tolist() == [1, 2]
    assert f(np.array([1, 2, 3, 4, 5, 6, 7, 8, 9]), 3, 2).tolist() == []


def test_llama_cpp_modules_install():
    """pydecode.compat.install(): `import llama_cpp` (and its submodules) gives these."""
    saved = {k: v for k, v in sys.modules.items() if k == "llama_cpp" or k.startswith("llama_cpp.")}
    try:
        lc.install()
        import llama_cpp
        import llama_cpp.llama_types as types
        from llama_cpp.llama_chat_format import format_mistral_instruct, hf_tokenizer_config_to_chat_formatter
        assert llama_cpp.Llama is Llama and llama_cpp.__version__
        msgs = [types.ChatCompletionRequestUserMessage(role="user", content="Instruction"),
                types.ChatCompletionRequestAssistantMessage(role="assistant", content="Model answer"),
                types.ChatCompletionRequestUserMessage(role="user", content="Follow-up instruction")]
        r = format_mistral_instruct(messages=msgs)
        assert ("" if r.added_special else "<s>") + r.prompt == \
            "<s>[INST] Instruction [/INST]Model answer</s>[INST] Follow-up instruction [/INST]"
        fmt = hf_tokenizer_config_to_chat_formatter({"chat_template": "{{ bos_token }}{% for m in messages %}"
                                                     "{{ m['content'] }}{% endfor %}", "bos_token": "<s>",
                                                     "eos_token": "</s>"})
        assert fmt(messages=[{"role": "user", "content": "Hi"}]).prompt == "<s>Hi"
        with pytest.raises(NotImplementedError, match="C API"):
            import llama_cpp._internals as internals
            internals.LlamaModel(path_model="x")
    finally:
        for k in [k for k in sys.modules if k == "llama_cpp" or k.startswith("llama_cpp.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lc.LlamaGrammar.from_json_schema(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}}))
