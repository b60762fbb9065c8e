"""Tool calls over HTTP: OpenAI's chat completions (tool_calls, streamed as deltas), Anthropic's
/v1/messages (tool_use blocks, input_json_delta) and OpenAI's /v1/responses (function_call
items), on SmolLM2, whose template has no tool syntax (hermes is taught by a system message):
every call parses and validates against its function's schema."""
import json

import httpx
import jsonschema
import pytest

from serving import Server

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
          "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": PARAMS}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def srv():
    s = Server("-c", "2048", "-t", "2", "--temp", "0").wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.lines)


def post(s, path, body, **kw):
    return httpx.post(s.url + path, json=body, timeout=120, **kw)


def events(r):
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def valid(name, arguments):
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments) if isinstance(arguments, str) else arguments, PARAMS)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_chat_completions_tool_calls(srv, choice):
    body = {"model": "x", "messages": ASK, "tools": TOOLS, "tool_choice": choice, "max_tokens": 60}
    r = post(srv, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    calls = ch["message"]["tool_calls"]
    assert calls and ch["finish_reason"] in ("tool_calls", "length")
    for c in calls:
        assert c["type"] == "function" and c["id"].startswith("call_")
        valid(c["function"]["name"], c["function"]["arguments"])
    # streamed: the same calls, assembled from deltas
    got = {}
    ev = events(post(srv, "/v1/chat/completions", {**body, "stream": True}))
    for e in ev:
        for t in (e["choices"][0]["delta"].get("tool_calls") or []) if e.get("choices") else []:
            if "id" in t:
                got[t["index"]] = [t["function"]["name"], ""]
            got[t["index"]][1] += t["function"].get("arguments", "")
    assert [(n, json.loads(a)) for n, a in got.values()] == \
           [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    assert [e for e in ev if e.get("choices") and e["choices"][0]["finish_reason"]][-1]["choices"][0][
        "finish_reason"] == ch["finish_reason"]


def test_chat_completions_tool_errors(srv):
    base = {"messages": ASK, "tools": TOOLS, "max_tokens": 8}
    for extra, word in [({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
                        ({"tool_choice": "sometimes"}, "tool_choice"),
                        ({"response_format": {"type": "json_object"}}, "response_format"),
                        ({"tools": [{"type": "function"}]}, "tool")]:
        r = post(srv, "/v1/chat/completions", {**base, **extra})
        assert r.status_code == 400 and word in r.text, (extra, r.text)
    r = post(srv, "/v1/chat/completions", {**base, "tool_choice": "required", "max_tokens": 3})
    assert r.status_code == 400 and "too small" in r.text


def test_tool_choice_none_answers_in_text(srv):
    r = post(srv, "/v1/chat/completions", {"messages": ASK, "tools": TOOLS, "tool_choice": "none", "max_tokens": 8})
    ch = r.json()["choices"][0]
    assert not ch["message"].get("tool_calls") and ch["message"]["content"]


def test_anthropic_tool_use(srv):
    body = {"model": "x", "max_tokens": 60, "messages": ASK, "tool_choice": {"type": "any"},
            "tools": [{"name": "get_weather", "description": "The weather in a city", "input_schema": PARAMS}]}
    r = post(srv, "/v1/messages", body)
    assert r.status_code == 200, r.text
    b = r.json()
    uses = [c for c in b["content"] if c["type"] == "tool_use"]
    assert uses and b["stop_reason"] in ("tool_use", "max_tokens")
    for u in uses:
        assert u["id"].startswith("toolu_") or u["id"]
        valid(u["name"], u["input"])
    ev = events(post(srv, "/v1/messages", {**body, "stream": True}))
    starts = [e for e in ev if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"]
    parts = {}
    for e in ev:
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
            parts[e["index"]] = parts.get(e["index"], "") + e["delta"]["partial_json"]
    assert [s["content_block"]["name"] for s in starts] == [u["name"] for u in uses]
    assert [json.loads(p) for p in parts.values()] == [u["input"] for u in uses]
    assert [e for e in ev if e["type"] == "message_delta"][-1]["delta"]["stop_reason"] == b["stop_reason"]


def test_responses_function_calls(srv):
    body = {"model": "x", "input": "What is the weather in Paris?", "max_output_tokens": 60, "tool_choice": "required",
            "tools": [{"type": "function", "name": "get_weather", "description": "The weather in a city",
                       "parameters": PARAMS}]}
    r = post(srv, "/v1/responses", body)
    assert r.status_code == 200, r.text
    b = r.json()
    fcs = [o for o in b["output"] if o["type"] == "function_call"]
    assert fcs and b["tool_choice"] == "required" and b["tools"][0]["name"] == "get_weather"
    for f in fcs:
        assert f["call_id"] and f["status"] == "completed"
        valid(f["name"], f["arguments"])
    ev = events(post(srv, "/v1/responses", {**body, "stream": True}))
    args = "".join(e["delta"] for e in ev if e["type"] == "response.function_call_arguments.delta")
    done = [e for e in ev if e["type"] == "response.function_call_arguments.done"]
    assert [json.loads(d["arguments"]) for d in done] == [json.loads(f["arguments"]) for f in fcs]
    assert json.loads(args) == json.loads(fcs[0]["arguments"]) if len(fcs) == 1 else True
    final = [e for e in ev if e["type"] == "response.completed"][-1]["response"]
    assert [o["type"] for o in final["output"]] == [o["type"] for o in b["output"]]
    r = post(srv, "/v1/responses", {**body, "tools": [{"type": "web_search"}]})
    assert r.status_code == 400 and "web_search" in r.text


TEMPLATES = __import__("pathlib").Path(__file__).resolve().parent / "data" / "chat-templates"


@pytest.fixture(scope="module", params=["openai-gpt-oss-120b", "meetkai-functionary-medium-v3.1",
                                        "ibm-granite-granite-3.3-2B-Instruct", "Qwen3.5-4B"])
def templated(request):
    """The same model under the templates of the syntaxes that write calls their own way:
    gpt-oss's harmony (the call is a message to functions.NAME), Functionary v3.1's
    <function=NAME>, Granite 3.3's <|tool_call|>[...], Qwen3.5's (and Qwen3-Coder's) XML
    <function=NAME><parameter=P>."""
    s = Server("-c", "2048", "-t", "2", "--temp", "0",
               "--chat-template-file", str(TEMPLATES / f"{request.param}.jinja")).wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.lines)


@pytest.mark.parametrize("stream", [False, True])
def test_calls_in_each_templates_own_syntax(templated, stream):
    body = {"model": "x", "messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": 60,
            "stream": stream}
    r = post(templated, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    if not stream:
        ch = r.json()["choices"][0]
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in ch["message"]["tool_calls"]]
        assert ch["finish_reason"] in ("tool_calls", "length") and not ch["message"]["content"]
    else:
        got = {}
        for e in events(r):
            for t in (e["choices"][0]["delta"].get("tool_calls") or []) if e.get("choices") else []:
                if "id" in t:
                    got[t["index"]] = [t["function"]["name"], ""]
                got[t["index"]][1] += t["function"].get("arguments", "")
            if e.get("choices"):
                assert not e["choices"][0]["delta"].get("content")   # the call's text is not content
        calls = list(map(tuple, got.values()))
    assert calls
    for name, args in calls:
        valid(name, args)
