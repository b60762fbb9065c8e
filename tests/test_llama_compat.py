"""llama-cpp-python's Llama on pydecode: every parameter is honoured or refused by name, never
accepted and ignored (issue 34, item 4, first part); top_p=0 is greedy; grammar constrains."""
import inspect

import pytest

from pydecode import Llama, LlamaGrammar
from pydecode import llama_compat as lc

# The parameters each entry point honours (the rest of its signature must be a refusal table's).
HONOURED = {
    "__init__": {"self", "model_path", "n_ctx", "n_batch", "n_threads", "seed", "verbose", "chat_format",
                 "draft_model", "type_k", "type_v", "last_n_tokens_size", "kwargs"},
    "create_completion": {"self", "prompt", "suffix", "max_tokens", "temperature", "top_p", "min_p", "logprobs",
                          "echo", "stop", "frequency_penalty", "presence_penalty", "repeat_penalty", "top_k",
                          "stream", "seed", "model", "grammar", "mirostat_tau", "mirostat_eta", "logit_bias"},
    "create_chat_completion": {"self", "messages", "functions", "function_call", "tools", "tool_choice",
                               "temperature", "top_p", "top_k", "min_p", "stream", "stop", "seed",
                               "response_format", "max_tokens", "presence_penalty", "frequency_penalty",
                               "repeat_penalty", "model", "grammar", "logprobs", "top_logprobs",
                               "mirostat_tau", "mirostat_eta", "logit_bias"},
}


@pytest.mark.parametrize("fn", sorted(HONOURED))
def test_every_parameter_is_honoured_or_refused(fn):
    """A parameter added to a signature must be listed as honoured here or be in a refusal table
    (mirostat_tau / eta only matter with mirostat_mode, which is refused unless 0)."""
    params = set(inspect.signature(getattr(Llama, fn)).parameters)
    refused = set(lc._SAMPLING_OFF)
    assert params - HONOURED[fn] <= refused, params - HONOURED[fn] - refused
    # the constructor's **kwargs take exactly the no-effect and refused-unless-default names
    assert not (lc._NO_EFFECT & set(lc._UNSUPPORTED_UNLESS_DEFAULT))


@pytest.fixture(scope="module")
def llm(smollm_path):
    m = Llama(model_path=str(smollm_path), n_ctx=256, verbose=False, seed=1)
    yield m
    m.close()


@pytest.mark.parametrize("kw", [dict(typical_p=0.5), dict(tfs_z=0.9), dict(mirostat_mode=2),
                                dict(logits_processor=[lambda ids, s: s]),
                                dict(stopping_criteria=[lambda ids, s: False]), dict(suffix="return x")])
def test_completion_parameters_not_implemented_are_refused_by_name(llm, kw):
    name = next(iter(kw))
    with pytest.raises(NotImplementedError, match=name):
        llm("Hello", max_tokens=2, **kw)


@pytest.mark.parametrize("kw", [dict(mirostat_mode=1), dict(typical_p=0.9)])
def test_chat_parameters_not_implemented_are_refused_by_name(llm, kw):
    name = next(iter(kw))
    with pytest.raises(NotImplementedError, match=name):
        llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=2, **kw)


def test_defaults_of_refused_parameters_are_accepted(llm):
    out = llm("Hello", max_tokens=2, typical_p=1.0, tfs_z=1.0, mirostat_mode=0, logit_bias=None,
              logits_processor=None, stopping_criteria=None, suffix=None)
    assert out["usage"]["completion_tokens"] == 2
    with pytest.raises(TypeError, match="no_such"):
        llm("Hello", max_tokens=2, no_such=1)


def test_top_p_zero_is_greedy_whatever_the_seed(llm):
    greedy = llm("Once upon a time", max_tokens=12, temperature=0)["choices"][0]["text"]
    texts = {llm("Once upon a time", max_tokens=12, temperature=0.8, top_p=0, seed=s)["choices"][0]["text"]
             for s in (1, 2, 3, 4)}
    assert texts == {greedy}


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
    with pytest.raises(TypeError, match="grammar"):
        llm("x", max_tokens=1, grammar=42)


def test_constructor_refuses_what_would_change_the_model_and_maps_cache_types(smollm_path):
    for kw in (dict(rope_freq_base=10000.0), dict(vocab_only=True), dict(lora_path="a.gguf"), dict(embedding=True),
               dict(type_k=1, type_v=8), dict(type_k=2)):
        with pytest.raises(NotImplementedError, match=next(iter(kw))):
            Llama(model_path=str(smollm_path), verbose=False, **kw)
    m = Llama(model_path=str(smollm_path), n_ctx=128, verbose=False, n_gpu_layers=-1, use_mlock=True,
              rope_freq_base=0.0, type_k=8, type_v=8, last_n_tokens_size=32)
    try:
        assert m._llm.model.kv_type == "q8_0"
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


def test_logit_bias_is_honoured(llm):
    plain = llm("The capital of France is", max_tokens=3, temperature=0)
    first = llm.tokenize(plain["choices"][0]["text"].encode(), add_bos=False)[0]
    banned = llm("The capital of France is", max_tokens=3, temperature=0, logit_bias={first: -float("inf")})
    assert llm.tokenize(banned["choices"][0]["text"].encode(), add_bos=False)[0] != first
    chat = llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=3, logit_bias={first: -100.0})
    assert chat["choices"][0]["message"]["content"] is not None
