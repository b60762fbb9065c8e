"""Tool calls that always parse (pydecode/chat/tools.py): tool_choice checks, the parser of a
finished answer against the streaming one, the closer that keeps a call cut by max_tokens
parseable (walked at random under llguidance, as test_json_closing walks schemas), and a real
model's calls through create_chat_completion: every call's arguments json.loads and validate."""
import json
import random

import jsonschema
import pytest

from pathlib import Path

import pydecode
from pydecode import Llama, constraint
from pydecode.chat import tools as tc
from pydecode.registry import model_path
from structured_schemas import checked_closing, random_allowed_step

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                   "required": ["city"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "integer"},
                                                   "tags": {"type": "array", "items": {"type": "string"}}},
                   "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What's the weather like in Paris? And what is 2 + 3?"}]
TEMPLATES = Path(__file__).resolve().parent / "data" / "chat-templates"   # llama.cpp's (MIT, data/LICENSE.ggml)


def check_calls(calls, only=None):
    """Every call names an offered function and its arguments parse and validate."""
    for c in calls:
        fn = c["function"]
        assert fn["name"] in SCHEMAS and (only is None or fn["name"] == only)
        jsonschema.validate(json.loads(fn["arguments"]), SCHEMAS[fn["name"]])


# ---------------------------------------------------------------- tool_choice

@pytest.mark.parametrize("choice,want", [
    (None, "auto"), ("auto", "auto"), ("none", "none"), ("required", "required"),
    ({"type": "any"}, "required"), ({"type": "auto"}, "auto"),
    ({"type": "function", "function": {"name": "add"}}, "fn:add"),
    ({"type": "function", "name": "add"}, "fn:add"), ({"type": "tool", "name": "add"}, "fn:add")])
def test_tool_choice_spellings(choice, want):
    assert tc.check_choice(choice, ["add", "get_weather"]) == want


@pytest.mark.parametrize("choice,match", [
    ({"type": "function", "function": {"name": "nope"}}, "nope"), ("sometimes", "tool_choice"),
    ({"type": "function"}, "tool_choice"), (3, "tool_choice")])
def test_bad_tool_choice_is_a_clear_error(choice, match):
    with pytest.raises(ValueError, match=match):
        tc.check_choice(choice, ["add"])


def test_plan_without_tools_or_with_none(smol):
    tok = smol.tokenizer
    assert tc.plan(tok, smol.template, [], "auto") is None
    assert tc.plan(tok, smol.template, TOOLS, "none") is None
    with pytest.raises(ValueError, match="needs tools"):
        tc.plan(tok, smol.template, [], "required")
    with pytest.raises(ValueError, match="parallel_tool_calls"):
        tc.plan(tok, smol.template, TOOLS, "auto", parallel="yes")


def test_call_format_of_templates():
    assert tc.call_format("{{ '<tool_call>' }}") == "hermes"
    assert tc.call_format("[TOOL_CALLS] {{ x }}") == "mistral"
    assert tc.call_format("<|python_tag|>") == "llama3"
    assert tc.call_format("{{ messages }}") is None
    real = {"openai-gpt-oss-120b": "harmony", "meetkai-functionary-medium-v3.1": "functionary",
            "ibm-granite-granite-3.3-2B-Instruct": "granite", "ibm-granite-granite-4.0": "hermes",
            "meta-llama-Llama-3.1-8B-Instruct": "llama3", "mistralai-Mistral-Nemo-Instruct-2407": "mistral",
            "Qwen-Qwen2.5-7B-Instruct": "hermes", "Qwen3-Coder": "qwen3_xml", "Qwen3.5-4B": "qwen3_xml",
            "ByteDance-Seed-OSS": None}   # (its <function=...><parameter=...> XML is not functionary's JSON)
    for name, fmt in real.items():
        assert tc.call_format((TEMPLATES / f"{name}.jinja").read_text()) == fmt, name


# ---------------------------------------------------------------- parsing, whole and streamed

ANSWERS = [   # (syntax, answer, text outside the calls, [(name, arguments)])
    ("hermes", 'Let me look.\n<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name":"add","arguments":{"a":2,"b":3,"tags":["x}","]"]}}\n</tool_call>',
     "Let me look.", [("get_weather", {"city": "Paris"}), ("add", {"a": 2, "b": 3, "tags": ["x}", "]"]})]),
    ("hermes", '{"name":"add","arguments":{"a":1.5,"b":-2}}', "", [("add", {"a": 1.5, "b": -2})]),
    ("hermes", "No call: a <tool is not a <tool_ca tag.", "No call: a <tool is not a <tool_ca tag.", []),
    ("hermes", "Plain words.", "Plain words.", []),
    ("mistral", 'Sure.[TOOL_CALLS][{"name":"get_weather","arguments":{"city":"Oslo \\"N\\""}},'
                '{"name":"add","arguments":{"a":0,"b":1}}]',
     "Sure.", [("get_weather", {"city": 'Oslo "N"'}), ("add", {"a": 0, "b": 1})]),
    ("mistral", "Only [TOOL text.", "Only [TOOL text.", []),
    ("llama3", '{"name":"get_weather","parameters":{"city":"Rome","unit":"c"}}', "",
     [("get_weather", {"city": "Rome", "unit": "c"})]),
    ("llama3", "Rome is sunny.", "Rome is sunny.", []),
    ("granite", '<|tool_call|>[{"name":"add","arguments":{"a":1,"b":2}},{"name":"get_weather","arguments":'
                '{"city":"Lima"}}]', "", [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Lima"})]),
    ("granite", "No tools needed.", "No tools needed.", []),
    ("functionary", 'Checking.<function=get_weather>{"city":"Kyiv"}</function><function=add>{"a":2,"b":3}'
                    '</function>', "Checking.", [("get_weather", {"city": "Kyiv"}), ("add", {"a": 2, "b": 3})]),
    ("functionary", "<function broken=1> stays text", "<function broken=1> stays text", []),
    ("harmony", '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Oslo"}', "",
     [("get_weather", {"city": "Oslo"})]),
    ("harmony", "<|channel|>analysis<|message|>Need the sum.<|end|><|start|>assistant<|channel|>commentary "
                'to=functions.add <|constrain|>json<|message|>{"a":2,"b":{"x":1}}',
     "<|channel|>analysis<|message|>Need the sum.<|end|><|start|>assistant", [("add", {"a": 2, "b": {"x": 1}})]),
    ("harmony", "It is sunny.", "It is sunny.", []),
    ("qwen3_xml", "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan \"José\"\n42\n"
                  "</parameter>\n<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
                  "<function=add>\n<parameter=a>\n2.5\n</parameter>\n<parameter=b>\n3\n</parameter>\n<parameter=tags>\n"
                  "[\"x</p>\", \"]\"]\n</parameter>\n</function>\n</tool_call>", "Let me check.",
     [("get_weather", {"city": 'San "José"\n42', "unit": "c"}), ("add", {"a": 2.5, "b": 3, "tags": ["x</p>", "]"]})]),
    ("qwen3_xml", "<tool_call>\n<function=get_weather>\n<parameter=city>\n12\n</parameter>\n</function>\n</tool_call>",
     "", [("get_weather", {"city": "12"})]),                     # a string parameter's digits stay a string
    ("qwen3_xml", "No <tool_call> here: <function=x> is text.", "No <tool_call> here: <function=x> is text.", []),
    ("qwen3_xml", "Plain words.", "Plain words.", []),
]


def _streamed(fmt, answer, rng):
    s, cuts = tc.tool_stream(fmt, SCHEMAS), sorted(rng.sample(range(1, len(answer)), min(6, len(answer) - 1)))
    deltas = []
    for a, b in zip([0] + cuts, cuts + [len(answer)]):
        deltas += s.feed(answer[a:b])
    deltas += s.finish()
    text, calls = "", []
    for d in deltas:
        if d[0] == "content":
            text += d[1]
        elif d[0] == "call":
            assert d[1] == len(calls)
            calls.append([d[3], ""])
        else:
            calls[d[1]][1] += d[2]
    return text, [(n, json.loads(a)) for n, a in calls]


@pytest.mark.parametrize("i", range(len(ANSWERS)))
def test_whole_and_streamed_parsing_agree(i):
    fmt, answer, text, want = ANSWERS[i]
    got_text, calls = tc.parse_tool_calls(answer, fmt, SCHEMAS)
    assert got_text == text
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == want
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    rng = random.Random(i)
    for _ in range(20):
        s_text, s_calls = _streamed(fmt, answer, rng)
        assert s_calls == want
        if want:   # the text outside the calls, as the parser strips it
            assert s_text.strip() == text
        else:
            assert s_text == answer


def test_a_call_of_an_unoffered_function_stays_text():
    answer = '<tool_call>\n{"name":"rm_rf","arguments":{}}\n</tool_call>'
    assert tc.parse_tool_calls(answer, "hermes", set(SCHEMAS)) == (answer, [])


def test_finish_reason():
    assert tc.finish_reason("stop", None, 0) == "stop"
    assert tc.finish_reason("stop", None, 2) == "tool_calls"
    assert tc.finish_reason("length", None, 1) == "tool_calls"


# ---------------------------------------------------------------- the closer, walked at random

@pytest.fixture(scope="module")
def smol():
    with pydecode.load(model_path("smollm2-135m"), n_ctx=1024, n_threads=2, n_seq=2) as m:
        yield m


def _walk(tok, n_vocab, g, prefix, rng, steps, only, reason=None):
    """A random answer under a tool grammar after `prefix`: after each step, the closing is
    accepted, completes the grammar and parses into valid calls."""
    c = constraint.Constraint(tok, n_vocab, g)
    out = list(c.initial())
    fmt, eog = g.frame[0].name, tok.eog_ids
    for t in tok.encode(prefix, add_special=False):
        if not c.matcher.consume_token(t):
            return
        c.budget.read([t])
        out.append(t)
        out += c.forced()
    for _ in range(steps):
        full = checked_closing(c, tok, out)
        if reason is not None:   # the calls are in the answer after the reasoning
            assert reason in full
            full = full.split(reason, 1)[1]
        _, calls = tc.parse_tool_calls(full, fmt, SCHEMAS)
        check_calls(calls, only)
        if g.frame[1] is False:                 # required / named: the answer is calls
            assert calls, f"{full!r} holds no call"
        if c.done:
            return
        if not random_allowed_step(c, rng, tok, n_vocab, eog, out):
            return


@pytest.mark.parametrize("fmt", list(tc.SYNTAXES))
@pytest.mark.parametrize("choice", ["required", "fn:add", "auto"])
def test_a_call_cut_anywhere_closes_into_valid_calls(smol, fmt, choice):
    tok, n_vocab = smol.tokenizer, smol.model.n_vocab
    rng = random.Random(f"{fmt}{choice}")
    for parallel in (True, False):
        g = tc.tool_grammar(tok, TOOLS, fmt, choice, parallel)
        constraint.compile_grammar(tok, g)
        syntax = tc.SYNTAXES[fmt]
        if choice == "auto":   # free text, then the calls (or a bare call where the syntax allows)
            prefixes = ["I will check. " + syntax.trigger] if syntax.trigger else ['{"name":"']
            prefixes += ['{"name":"a'] if syntax.bare else []
        else:
            prefixes = [""]
        for prefix in prefixes:
            for _ in range(4):
                _walk(tok, n_vocab, g, prefix, rng, 40, choice[3:] if choice.startswith("fn:") else None)


@pytest.mark.parametrize("fmt", ["qwen3_xml", "hermes"])
@pytest.mark.parametrize("choice", ["required", "auto"])
def test_calls_after_an_open_reasoning_block(smol, fmt, choice):
    """A prompt that opens <think> (Qwen3.5's): the answer reasons up to </think>, then calls;
    cut anywhere, in the reasoning too, it closes into valid calls after the reasoning."""
    tok, n_vocab = smol.tokenizer, smol.model.n_vocab
    rng = random.Random(f"reason{fmt}{choice}")
    g = tc.tool_grammar(tok, TOOLS, fmt, choice, True, "</think>")
    constraint.compile_grammar(tok, g)
    trig = tc.SYNTAXES[fmt].trigger
    for prefix in ("", "I should look it up.", "Look it up.</think>\n\n", "Look it up.</think>\n\n" + trig):
        for _ in range(3):
            _walk(tok, n_vocab, g, prefix, rng, 40, None, reason="</think>")


# ---------------------------------------------------------------- a real model's calls

@pytest.fixture(scope="module")
def qwen():
    llm = Llama(model_path("qwen2.5-coder-0.5b"), n_ctx=2048, n_threads=2, verbose=False)
    yield llm
    llm.close()


def _ask(llm, **kw):
    r = llm.create_chat_completion(ASK, tools=TOOLS, **kw)
    return r["choices"][0]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}, "auto"])
@pytest.mark.parametrize("max_tokens", [20, 32, 64, 200])
def test_real_calls_always_parse(qwen, choice, max_tokens):
    only = choice["function"]["name"] if isinstance(choice, dict) else None
    for temperature, seed in ((0, None), (0.9, 1), (1.2, 2)):
        ch = _ask(qwen, tool_choice=choice, max_tokens=max_tokens, temperature=temperature, seed=seed)
        calls = ch["message"].get("tool_calls") or []
        check_calls(calls, only)
        if choice != "auto":
            assert calls, ch
        if calls:
            assert ch["finish_reason"] in ("tool_calls", "length")


def test_a_budget_too_small_for_any_call_is_refused(qwen):
    with pytest.raises(ValueError, match="max_tokens=12 is too small for tool calls"):
        _ask(qwen, tool_choice="required", max_tokens=12)


def test_tool_choice_none_gives_text(qwen):
    ch = _ask(qwen, tool_choice="none", max_tokens=24, temperature=0)
    assert "tool_calls" not in ch["message"] and ch["finish_reason"] in ("stop", "length")


def test_streamed_calls_equal_the_whole_answer(qwen):
    for choice in ("required", "auto"):
        whole = _ask(qwen, tool_choice=choice, max_tokens=80, temperature=0)
        chunks = list(qwen.create_chat_completion(ASK, tools=TOOLS, tool_choice=choice, max_tokens=80,
                                                  temperature=0, stream=True))
        calls, text = [], ""
        for ch in chunks:
            d = ch["choices"][0]["delta"]
            text += d.get("content") or ""
            for t in d.get("tool_calls") or []:
                if t["index"] == len(calls):
                    calls.append({"name": t["function"]["name"], "arguments": ""})
                calls[t["index"]]["arguments"] += t["function"].get("arguments", "")
        want = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                for c in whole["message"].get("tool_calls") or []]
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == \
               [(c["name"], json.loads(c["arguments"])) for c in want]
        assert chunks[-1]["choices"][0]["finish_reason"] == whole["finish_reason"]
        assert text.strip() == (whole["message"]["content"] or "").strip()


def test_legacy_functions_api(qwen):
    ch = qwen.create_chat_completion(ASK, functions=[t["function"] for t in TOOLS],
                                     function_call={"name": "get_weather"}, max_tokens=60, temperature=0)
    c = ch["choices"][0]
    assert c["finish_reason"] in ("function_call", "length")
    assert c["message"]["function_call"]["name"] == "get_weather"
    jsonschema.validate(json.loads(c["message"]["function_call"]["arguments"]), SCHEMAS["get_weather"])
    with pytest.raises(ValueError, match="tools or functions"):
        qwen.create_chat_completion(ASK, tools=TOOLS, functions=[ADD["function"]])
    with pytest.raises(ValueError, match="response_format"):
        qwen.create_chat_completion(ASK, tools=TOOLS, response_format={"type": "json_object"})
    with pytest.raises(ValueError, match="each tool"):
        qwen.create_chat_completion(ASK, tools=[{"type": "function"}])


def test_calls_in_batched_steps_and_with_prompt_lookup():
    """The grammar per sequence holds in a batched step, and a lookup draft changes nothing."""
    with pydecode.load(model_path("qwen2.5-coder-0.5b"), n_ctx=2048, n_threads=2, n_seq=4) as llm:
        p = tc.plan(llm.tokenizer, llm.template, TOOLS, "required")
        ids = llm.chat_tokens(p.messages(ASK), tools=p.tools)
        alone = llm.generate(ids, 60, grammar=p.grammar)
        looked = llm.generate(ids, 60, grammar=p.grammar, draft_tokens=4)
        assert looked.tokens == alone.tokens
        batch = llm.generate_batch([ids] * 3, 60, grammar=p.grammar, temperature=0.9, seed=7)
        for c in [alone] + batch:
            _, calls = p.parse(c.text)
            assert calls
            check_calls(calls)
        one = tc.plan(llm.tokenizer, llm.template, TOOLS, "required", parallel=False)
        for c in llm.generate_batch([ids] * 3, 120, grammar=one.grammar, temperature=1.0, seed=3):
            assert len(one.parse(c.text)[1]) == 1


def test_harmony_calls_on_gpt_oss_vocabulary(tmp_path):
    """gpt-oss's own vocabulary (o200k, its harmony markers shown as text, <|call|> an end of
    generation): a tiny random-weight gpt-oss under its template calls through harmony, the
    call parses whole and streamed, and a cut one closes."""
    import dataclasses
    import importlib.util
    spec = importlib.util.spec_from_file_location("synthetic", Path(__file__).resolve().parents[1] / "bench" / "synthetic.py")
    synthetic = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(synthetic)
    shape = dataclasses.replace(synthetic.SHAPES["gpt-oss-20b"], n_embd=96, n_ff=96, n_ff_exp=96, n_head=4,
                                n_head_kv=2, head_dim=64, n_expert=4, n_expert_used=2)
    path = synthetic.write(shape, "q8_0", tmp_path / "gpt-oss.gguf", layers=1)
    template = (TEMPLATES / "openai-gpt-oss-120b.jinja").read_text()
    llm = Llama(str(path), n_ctx=1024, n_threads=2, verbose=False)
    llm._llm.chat_template = template
    try:
        tok = llm._llm.tokenizer
        assert tok.eog_ids & set(tok.encode("<|call|>", add_special=False, parse_special=True))
        for max_tokens in (24, 60):   # cut by max_tokens: the call still closes and parses
            r = llm.create_chat_completion(ASK, tools=TOOLS, tool_choice="required", max_tokens=max_tokens)
            calls = r["choices"][0]["message"]["tool_calls"]
            assert calls
            check_calls(calls)
        rng = random.Random(3)
        for choice in ("required", "auto"):
            g = tc.tool_grammar(tok, TOOLS, "harmony", choice)
            constraint.compile_grammar(tok, g)
            prefix = "<|channel|>analysis<|message|>Weather.<|end|><|start|>assistant" + tc.SYNTAXES["harmony"].trigger \
                if choice == "auto" else ""
            _walk(tok, llm._llm.model.n_vocab, g, prefix, rng, 30, None)
    finally:
        llm.close()
