"""Chat templates (the sandboxed jinja2 environment, built-in fallbacks, 70 real templates) and
multi-turn chat over one KV cache."""
from datetime import datetime
from pathlib import Path

import pytest

import pydecode
from pydecode.chat import CHATML, GEMMA, LLAMA3, TemplateError, fallback_template, render

TEMPLATES = Path(__file__).resolve().parent / "data" / "chat-templates"   # llama.cpp's set (MIT, data/LICENSE.ggml)

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there!"},
    {"role": "user", "content": "How are you?"},
]

# The real templates that cannot render a plain conversation, each with what its error names.
# The tool-use variants are separate templates a model uses only when given tools; firefunction
# wants its own variables; Gemma 2 rejects a system message by design (raise_exception).
EXPECTED_FAILURES = {
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": "`tools` was not given",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": "`tools` was not given",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "`tools` was not given",
    "fireworks-ai-llama-3-firefunction-v2.jinja": "'functions' is undefined",
    "google-gemma-2-2b-it.jinja": "System role not supported",
}


# ------------------------------------------------------------------ built-in fallbacks

def test_chatml_fallback_exact():
    assert render(CONVERSATION, CHATML) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\nHi there!<|im_end|>\n"
        "<|im_start|>user\nHow are you?<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert render(CONVERSATION, None) == render(CONVERSATION, CHATML)   # no template: ChatML
    assert render(CONVERSATION[:2], CHATML, add_generation_prompt=False) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n")


def test_gemma_fallback_exact():
    # The system prompt opens the first user turn; the assistant is "model"; BOS first.
    assert render(CONVERSATION, GEMMA, bos_token="<bos>") == (
        "<bos><start_of_turn>user\nYou are a helpful assistant.\n\nHello<end_of_turn>\n"
        "<start_of_turn>model\nHi there!<end_of_turn>\n"
        "<start_of_turn>user\nHow are you?<end_of_turn>\n"
        "<start_of_turn>model\n")
    assert render(CONVERSATION[1:2], GEMMA, bos_token="<bos>") == (
        "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n")


def test_llama3_fallback_exact():
    assert render(CONVERSATION, LLAMA3, bos_token="<|begin_of_text|>") == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHi there!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")


class _Vocab:
    """A tokenizer stand-in: the given strings are single tokens, anything else is many."""

    def __init__(self, *markers):
        self.markers = set(markers)

    def encode(self, text, add_special=True, parse_special=True):
        return [0] if text in self.markers else [0, 1, 2]


def test_fallback_is_chosen_from_the_vocabulary():
    assert fallback_template(_Vocab("<start_of_turn>", "<end_of_turn>")) == GEMMA
    assert fallback_template(_Vocab("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")) == LLAMA3
    assert fallback_template(_Vocab("<|im_start|>", "<|im_end|>")) == CHATML
    assert fallback_template(_Vocab()) == CHATML
    assert fallback_template(_Vocab("<start_of_turn>")) == CHATML       # half a marker pair is not Gemma


# ------------------------------------------------------------------ the GGUFs' own templates

@pytest.fixture(scope="module")
def smollm(smollm_path):
    with pydecode.load(str(smollm_path), n_ctx=512, n_threads=2) as llm:
        yield llm


def test_smollm2_gguf_template(smollm):
    assert smollm.model.gguf.metadata.get("tokenizer.chat_template")
    assert smollm.chat_prompt(CONVERSATION) == render(CONVERSATION, CHATML)
    # Without a system message the template supplies its own.
    assert smollm.chat_prompt(CONVERSATION[1:2]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n")
    assert smollm.chat_prompt(CONVERSATION[1:2], add_generation_prompt=False).endswith("Hello<|im_end|>\n")


def test_gemma_vocabulary_selects_gemma_fallback(gemma_path):
    from pydecode.gguf_file import GGUFFile
    from pydecode.tokenizer import Tokenizer

    meta = GGUFFile(gemma_path).metadata
    assert not meta.get("tokenizer.chat_template")          # this GGUF carries no template
    tok = Tokenizer.from_metadata(meta, cache_path=str(gemma_path) + ".spm.model")
    assert fallback_template(tok) == GEMMA


def test_gemma_gguf_chat_prompt(gemma_path):
    llm = pydecode.load(str(gemma_path), n_ctx=256, n_threads=2)
    try:
        text = llm.chat_prompt(CONVERSATION)
        assert text.startswith("<bos><start_of_turn>user\nYou are a helpful assistant.\n\nHello<end_of_turn>\n")
        assert text.endswith("<start_of_turn>user\nHow are you?<end_of_turn>\n<start_of_turn>model\n")
        # One turn, as token ids: llama.cpp's for the same text (see test_tokenizer), one BOS.
        assert llm.chat_tokens([{"role": "user", "content": "Hi"}]) == [2, 105, 2364, 107, 10979, 106, 107, 105,
                                                                       4368, 107]
        c = llm.chat([{"role": "user", "content": "Hi"}], max_tokens=2)
        assert c.stats.prompt_tokens == 10
    finally:
        llm.close()


# ------------------------------------------------------------------ the environment

def test_environment_helpers():
    m = [{"role": "user", "content": "é"}]
    assert render(m, "{{ messages[0] | tojson }}") == '{"role": "user", "content": "é"}'
    assert render(m, "{{ messages[0] | tojson(ensure_ascii=True) }}") == '{"role": "user", "content": "\\u00e9"}'
    assert render(m, "{{ {'a': [1]} | tojson(indent=2) }}") == '{\n  "a": [\n    1\n  ]\n}'
    assert render(m, "{{ '<x>' | tojson }}") == '"<x>"'                 # not HTML-escaped
    assert render(m, "{{ strftime_now('%Y') }}") == str(datetime.now().year)
    assert render(m, "{% for i in [1, 2, 3] %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}") == "1"
    assert render(m, "{% for i in [1, 2, 3] %}{% if i == 2 %}{% continue %}{% endif %}{{ i }}{% endfor %}") == "13"
    assert render(m, "{% set ns = namespace(n=0) %}{% for x in messages %}{% set ns.n = ns.n + 1 %}"
                     "{% endfor %}{{ ns.n }}") == "1"
    assert render(m, "{% generation %}{{ 'a' }}{% endgeneration %}b") == "ab"
    assert render(m, "{{ ' x y '.strip().split(' ') | join(',') }}") == "x,y"
    assert render(m, "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools }}",
                  bos_token="<s>", eos_token="</s>") == "<s>|</s>|True|None"
    assert render(m, "{% if tools is none and documents is none %}ok{% endif %}") == "ok"


def test_content_may_be_a_list_of_parts():
    m = [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image"}]}]
    tpl = ("{% for p in messages[0]['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}"
           "{% else %}<{{ p['type'] }}>{% endif %}{% endfor %}")
    assert render(m, tpl) == "look<image>"


def test_errors_name_what_is_missing():
    with pytest.raises(TemplateError, match="System role not supported"):
        render(CONVERSATION, "{{ raise_exception('System role not supported') }}")
    with pytest.raises(TemplateError, match="'nope' is undefined"):
        render(CONVERSATION, "{{ nope.attr }}")
    with pytest.raises(TemplateError, match="No filter named 'frobnicate'"):
        render(CONVERSATION, "{{ messages | frobnicate }}")
    with pytest.raises(TemplateError, match="No filter named 'frobnicate'"):       # found only at render time
        render(CONVERSATION, "{% if messages %}{{ messages | frobnicate }}{% endif %}")
    with pytest.raises(TemplateError, match="cannot be compiled at line 2"):
        render(CONVERSATION, "ok\n{% for %}")
    with pytest.raises(TemplateError, match=r"line 2 \(`\{% for t in tools %\}.*`\); `tools` was not given"):
        render(CONVERSATION, "x\n{% for t in tools %}{{ t }}{% endfor %}")
    # The sandbox is immutable: templates cannot change the caller's messages.
    with pytest.raises(TemplateError):
        render(CONVERSATION, "{{ messages.append(1) }}")
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        render([{"content": "no role"}], CHATML)


# ------------------------------------------------------------------ 70 real templates

def _template_files():
    return sorted(TEMPLATES.glob("*.jinja"))


def test_conformance_templates_present():
    assert len(_template_files()) == 70, TEMPLATES


@pytest.mark.parametrize("path", _template_files(), ids=lambda p: p.stem)
def test_conformance_template(path):
    source = path.read_text()
    if path.name in EXPECTED_FAILURES:
        with pytest.raises(TemplateError) as e:
            render(CONVERSATION, source, bos_token="<s>", eos_token="</s>")
        assert EXPECTED_FAILURES[path.name] in str(e.value)
        return
    text = render(CONVERSATION, source, bos_token="<s>", eos_token="</s>", add_generation_prompt=True)
    for m in CONVERSATION:
        assert m["content"] in text, (m, text)
    # Turns in order, and the generation prompt comes after the last user message.
    assert text.index("Hello") < text.index("Hi there!") < text.rindex("How are you?")
    closed = render(CONVERSATION, source, bos_token="<s>", eos_token="</s>", add_generation_prompt=False)
    assert len(closed) <= len(text)      # (some templates always open the assistant's turn)


def test_conformance_render_count():
    ok = 0
    for path in _template_files():
        try:
            render(CONVERSATION, path.read_text(), bos_token="<s>", eos_token="</s>")
            ok += 1
        except TemplateError:
            pass
    assert ok == len(_template_files()) - len(EXPECTED_FAILURES) == 65


# ------------------------------------------------------------------ multi-turn over one cache

def test_second_turn_prefills_only_new_tokens(smollm):
    history = [{"role": "user", "content": "What is the capital of France?"}]
    first = smollm.chat(history, max_tokens=12)
    history += [{"role": "assistant", "content": first.text},
                {"role": "user", "content": "And of Italy?"}]
    second = smollm.chat(history, max_tokens=1)
    s = second.stats
    new = s.prompt_tokens - s.cached_tokens
    assert s.cached_tokens > 0
    assert s.cached_tokens >= first.stats.prompt_tokens           # the whole first prompt was reused
    assert s.positions_computed == new                           # only the new tokens were computed
    # The new tokens are the end of the old answer's turn plus the new question: a few, not all.
    assert new < len(smollm.tokenize(smollm.chat_prompt(history[-1:]))) + 8


def test_chat_session_drops_oldest_turns_to_fit(smollm_path):
    from pydecode.chat import ChatSession

    llm = pydecode.load(str(smollm_path), n_ctx=100, n_threads=2)
    notices = []
    try:
        s = ChatSession(llm, system="Be brief.", max_tokens=16, notice=notices.append)
        for q in ("Name a colour.", "Name a fruit.", "Name a river.", "Name a city.", "Name a planet."):
            c = s.ask(q)
            assert c.finish_reason in ("stop", "length")
            assert s.prompt_tokens() <= llm.n_ctx
        assert notices and "dropped" in notices[0]
        assert s.history[0] == {"role": "system", "content": "Be brief."}   # the system prompt stays
        assert s.history[1]["role"] == "user"                              # whole exchanges dropped
        assert s.history[-2]["content"] == "Name a planet."
        assert c.stats.cached_tokens > 0
    finally:
        llm.close()


# ------------------------------------------------------------------ the new families, exactly

def _reference_render(source, messages, **kw):
    """What transformers' apply_chat_template renders: its environment (_compile_jinja_template)
    and its render call (messages, tools, documents, add_generation_prompt, special tokens),
    written here apart from pydecode's, as the reference to compare with."""
    import json

    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    kw.setdefault("add_generation_prompt", True)
    return env.from_string(source).render(messages=messages, tools=None, documents=None, **kw)


TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4.", "reasoning_content": "A sum."},
    {"role": "user", "content": "And 3+3?"},
]


def _today(fmt):
    return {datetime.now().strftime(fmt)}


def _expected(name, now):
    """The text each template must render for TURNS (read off the template by hand)."""
    llama_system = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                    "Cutting Knowledge Date: December 2023\nToday Date: {date}\n\nBe brief.<|eot_id|>")
    llama_turns = ("<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n4.<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n")
    qwen3 = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
             "<|im_start|>assistant\n4.<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n")
    return {
        # Qwen3: the earlier turn's reasoning is dropped (it precedes the last user message).
        "Qwen-Qwen3-0.6B": qwen3,
        "Qwen3.5-4B": qwen3 + "<think>\n",
        "openai-gpt-oss-120b": (
            "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
            f"Knowledge cutoff: 2024-06\nCurrent date: {now['%Y-%m-%d']}\n\nReasoning: medium\n\n"
            "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
            "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"
            "<|start|>user<|message|>What is 2+2?<|end|>"
            "<|start|>assistant<|channel|>final<|message|>4.<|end|>"
            "<|start|>user<|message|>And 3+3?<|end|><|start|>assistant"),
        "meta-llama-Llama-3.1-8B-Instruct": llama_system.format(date="26 Jul 2024") + llama_turns,
        "meta-llama-Llama-3.3-70B-Instruct": llama_system.format(date="26 Jul 2024") + llama_turns,
        "meta-llama-Llama-3.2-3B-Instruct": llama_system.format(date=now["%d %b %Y"]) + llama_turns,
        "microsoft-Phi-3.5-mini-instruct": ("<|system|>\nBe brief.<|end|>\n<|user|>\nWhat is 2+2?<|end|>\n"
                                            "<|assistant|>\n4.<|end|>\n<|user|>\nAnd 3+3?<|end|>\n<|assistant|>\n"),
    }[name]


SPECIALS = {"openai-gpt-oss-120b": ("<|startoftext|>", "<|return|>"), "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
            "Qwen-Qwen3-0.6B": ("", "<|im_end|>"), "Qwen3.5-4B": ("", "<|im_end|>")}


@pytest.mark.parametrize("name", ["Qwen-Qwen3-0.6B", "Qwen3.5-4B", "openai-gpt-oss-120b",
                                  "meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct",
                                  "meta-llama-Llama-3.3-70B-Instruct", "microsoft-Phi-3.5-mini-instruct"])
def test_new_family_templates_render_exactly(name):
    from pydecode.chat.reasoning import for_template, reasoning_format

    source = (TEMPLATES / f"{name}.jinja").read_text()
    bos, eos = SPECIALS.get(name, ("<|begin_of_text|>", "<|eot_id|>"))
    msgs = for_template(TURNS, reasoning_format(source))   # what LLM.chat_prompt hands the template
    before = {f: datetime.now().strftime(f) for f in ("%Y-%m-%d", "%d %b %Y")}
    ours = render(msgs, source, bos_token=bos, eos_token=eos)
    reference = _reference_render(source, msgs, bos_token=bos, eos_token=eos)
    after = {f: datetime.now().strftime(f) for f in ("%Y-%m-%d", "%d %b %Y")}
    assert ours == reference
    assert ours in (_expected(name, before), _expected(name, after))
    closed = render(msgs, source, bos_token=bos, eos_token=eos, add_generation_prompt=False)
    assert closed == _reference_render(source, msgs, bos_token=bos, eos_token=eos, add_generation_prompt=False)


def test_qwen3_enable_thinking_false_closes_an_empty_reasoning():
    source = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
    text = render(TURNS, source, enable_thinking=False)
    assert text == _reference_render(source, TURNS, enable_thinking=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_gpt_oss_reasoning_effort_and_phi35_closing_eos():
    gpt = (TEMPLATES / "openai-gpt-oss-120b.jinja").read_text()
    assert "Reasoning: high\n" in render(TURNS, gpt, reasoning_effort="high")
    phi = (TEMPLATES / "microsoft-Phi-3.5-mini-instruct.jinja").read_text()
    assert render(TURNS[:2], phi, eos_token="<|endoftext|>", add_generation_prompt=False).endswith(
        "What is 2+2?<|end|>\n<|endoftext|>")


@pytest.mark.parametrize("name, vocab", [("meta-llama-Llama-3.1-8B-Instruct", "llama-bpe"),
                                         ("microsoft-Phi-3.5-mini-instruct", "phi-3"),
                                         ("Qwen-Qwen3-0.6B", "qwen2")])
def test_new_family_prompts_tokenize_to_their_markers(name, vocab):
    # The rendered prompt's markers are single special tokens of the family's vocabulary.
    from test_tokenizer import vocab_tokenizer

    tok = vocab_tokenizer(vocab)
    bos = tok.decode([tok.bos_id]) if tok.bos_id is not None else ""
    text = render(TURNS, (TEMPLATES / f"{name}.jinja").read_text(), bos_token=bos)
    ids = tok.encode(text, add_special=False)
    markers = {"llama-bpe": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               "phi-3": ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
               "qwen2": ["<|im_start|>", "<|im_end|>"]}[vocab]
    for m in markers:
        [tid] = tok.encode(m, add_special=False)
        assert tid in ids and tok.is_special(tid)
    assert tok.decode(ids) == (text if vocab != "phi-3" else text.replace("|>\n", "|>"))  # Phi-3's rstrip
    if vocab == "llama-bpe":
        assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
    # The marker that closes the assistant's turn ends a generation.
    end = {"llama-bpe": "<|eot_id|>", "phi-3": "<|end|>", "qwen2": "<|im_end|>"}[vocab]
    assert tok.encode(end, add_special=False)[0] in tok.eog_ids


def test_named_templates_render_their_turn_format():
    from pydecode.chat.named_templates import names, resolve_template
    from pydecode.chat.templates import render
    m = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert render(m, resolve_template("command-r")) == (
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>S<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>U"
        "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")
    assert render(m, resolve_template("llama-3"), bos_token="<B>").startswith("<B><|start_header_id|>system")
    assert resolve_template("qwen") == resolve_template("chatml")
    assert resolve_template("{{ 'x' }}") == "{{ 'x' }}"          # not a name: jinja text
    for n in names():                                            # every name renders
        assert "U" in render(m, resolve_template(n), bos_token="<s>", eos_token="</s>")
