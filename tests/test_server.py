"""`pydecode serve`: the real server in a subprocess on a free loopback port, driven by the real
`openai` client (and raw HTTP where a client would hide what is tested).

Greedy answers are checked against the same request run in this process through pydecode's own
API (one sequence at a time), so "the server is right" means "the server says what llm.generate
says". Two servers: A (16 sequences, no key) for the API and load; B (an API key, one sequence, no
queue) for authentication, 429 and the small limits.
"""
import json
import signal
import socket
import sys
import threading
import time

import httpx
import openai
import pytest

import pydecode
from serving import MODEL, TIMEOUT, Server, gauge

KEY = "test-key-123"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village, there lived",
           "Water boils at a temperature of", "The three primary colors are", "import numpy as np\n",
           "My favourite recipe for pancakes", "The first law of thermodynamics", "Dear hiring manager,",
           "In 1969, astronauts", "A haiku about autumn:", "SELECT name FROM users WHERE",
           "The best way to learn a language is", "Photosynthesis converts", "Rust and C++ differ in",
           "Three tips for better sleep:"]


@pytest.fixture(scope="module")
def server():
    s = Server("--n-seq", "16", "-c", "512", "-t", "2", "--metrics").wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.lines)


@pytest.fixture(scope="module")
def keyed():
    s = Server("--n-seq", "1", "--max-queue", "0", "-c", "256", "-t", "2", "--api-key", KEY,
               "--max-body", "65536", "--metrics", "--strict-model").wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.lines)


@pytest.fixture(scope="module")
def llm(smollm_path):
    with pydecode.load(smollm_path, n_ctx=512, n_threads=2) as m:
        yield m


@pytest.fixture(scope="module")
def client(server):
    return server.client()


# ---------------------------------------------------------------- answers equal the API's

def test_completion_equals_generate(client, llm):
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=20, temperature=0)
    want = llm.generate(PROMPTS[0], 20)
    assert r.choices[0].text == want.text
    assert r.choices[0].finish_reason == "length"
    assert r.object == "text_completion" and r.model == MODEL
    assert r.usage.prompt_tokens == len(llm.tokenize(PROMPTS[0]))
    assert r.usage.completion_tokens == 20 and r.usage.total_tokens == r.usage.prompt_tokens + 20


def test_chat_equals_llm_chat(client, llm):
    msgs = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name a fruit."}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24, temperature=0)
    want = llm.chat(msgs, 24)
    assert r.choices[0].message.content == want.text
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == ("stop" if want.finish_reason == "stop" else "length")
    assert r.usage.prompt_tokens == len(llm.chat_tokens(msgs))
    assert r.usage.completion_tokens == len(want.tokens)


def test_chat_content_parts_and_developer_role(client, llm):
    msgs = [{"role": "developer", "content": "You are brief."},
            {"role": "user", "content": [{"type": "text", "text": "Name a fruit."}]}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=12, temperature=0)
    want = llm.chat([{"role": "system", "content": "You are brief."},
                     {"role": "user", "content": "Name a fruit."}], 12)
    assert r.choices[0].message.content == want.text


def test_chat_reasoning_fields_pass_through(server, llm):
    # SmolLM2 is no reasoning model: its answer has no reasoning_content, and the history's
    # reasoning_content and chat_template_kwargs reach a template that ignores them.
    msgs = [{"role": "user", "content": "Name a fruit."},
            {"role": "assistant", "content": "Apple.", "reasoning_content": "Any fruit."},
            {"role": "user", "content": "Another?"}]
    r = httpx.post(server.url + "/v1/chat/completions", timeout=TIMEOUT, json={
        "messages": msgs, "max_tokens": 8, "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert "reasoning_content" not in message
    assert message["content"] == llm.chat(msgs, 8).text


def test_streaming_completion(client, llm):
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == llm.generate(PROMPTS[1], 16).text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert len({c.id for c in chunks}) == 1


def test_streaming_chat(client, llm):
    msgs = [{"role": "user", "content": "Say hello."}]
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=20, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    want = llm.chat(msgs, 20)
    assert text == want.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        ["stop" if want.finish_reason == "stop" else "length"]
    assert chunks[-1].usage.prompt_tokens == len(llm.chat_tokens(msgs))
    assert chunks[-1].usage.completion_tokens == len(want.tokens)
    # Without include_usage there is no usage chunk.
    plain = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0, stream=True))
    assert all(c.choices for c in plain)


def test_raw_sse_framing(server):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 3, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=TIMEOUT) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"


def test_stop_strings(client, llm):
    want = llm.generate(PROMPTS[2], 30)
    words = want.text.split()
    stop = " " + words[3]
    r = client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=30, temperature=0, stop=[stop, "zzzq"])
    assert r.choices[0].text == want.text[:want.text.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=PROMPTS[2], max_tokens=30, temperature=0, stop=stop, stream=True) if c.choices)
    assert streamed == r.choices[0].text


def test_seeded_sampling_is_reproducible(client):
    def draw(seed):
        return client.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=24, temperature=1.0,
                                         top_p=0.95, seed=seed).choices[0].text

    a, b = draw(1234), draw(1234)
    assert a == b
    assert any(draw(s) != a for s in (1, 2, 3))
    ext = dict(top_k=40, min_p=0.05, repeat_penalty=1.1)
    one = client.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=12, temperature=0.8, seed=7,
                                    presence_penalty=0.5, frequency_penalty=0.5, extra_body=ext).choices[0].text
    two = client.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=12, temperature=0.8, seed=7,
                                    presence_penalty=0.5, frequency_penalty=0.5, extra_body=ext).choices[0].text
    assert one == two


def test_n_choices(client, llm):
    r = client.completions.create(model=MODEL, prompt=PROMPTS[4], max_tokens=10, temperature=0, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert {c.text for c in r.choices} == {llm.generate(PROMPTS[4], 10).text}
    assert r.usage.completion_tokens == 30 and r.usage.prompt_tokens == len(llm.tokenize(PROMPTS[4]))
    sampled = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Tell a joke."}],
                                             max_tokens=16, temperature=1.0, seed=5, n=2)
    assert len(sampled.choices) == 2 and sampled.choices[0].message.content != sampled.choices[1].message.content
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[4], max_tokens=6, temperature=0, n=2,
                                            stream=True))
    for i in (0, 1):
        assert "".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) == \
            llm.generate(PROMPTS[4], 6).text


def test_logprobs(client, llm):
    r = client.completions.create(model=MODEL, prompt=PROMPTS[5], max_tokens=8, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    want = llm.generate(PROMPTS[5], 8, logprobs=3)
    assert lp.tokens == [llm.detokenize([t]) for t in want.tokens]
    assert lp.token_logprobs == pytest.approx([x[1] for x in want.logprobs], abs=1e-5)
    assert all(len(d) <= 3 and max(d.values()) == pytest.approx(v, abs=1e-5)
               for d, v in zip(lp.top_logprobs, lp.token_logprobs))   # greedy: the chosen is the top
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)

    c = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                       temperature=0, logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens
    assert all(e.logprob <= 0 and len(e.top_logprobs) == 2 and e.bytes for e in content)
    assert "".join(e.token for e in content) == c.choices[0].message.content
    streamed = [e for ch in client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0, logprobs=True,
        top_logprobs=2, stream=True) if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]


def test_cached_tokens_and_echo(client, llm):
    prompt = "A long shared preamble about the history of computing. " * 8
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    r = client.completions.create(model=MODEL, prompt=prompt + "And then", max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens >= len(llm.tokenize(prompt)) - 2
    e = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0, echo=True)
    assert e.choices[0].text == "Hello" + llm.generate("Hello", 3).text
    ids = llm.tokenize("Hello")
    t = client.completions.create(model=MODEL, prompt=ids, max_tokens=3, temperature=0)
    assert t.choices[0].text == llm.generate(ids, 3).text


def test_models_tokenize_detokenize(server, client, llm):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    # One model served: any name is it, as llama-server (--strict-model: 404, test_auth_and_strict_model).
    assert client.models.retrieve("gpt-4o").id == MODEL
    r = httpx.post(server.url + "/tokenize", json={"content": "Hello world"}, timeout=10).json()
    assert r["tokens"] == llm.tokenize("Hello world")
    r2 = httpx.post(server.url + "/tokenize", json={"content": "Hello world", "with_pieces": True,
                                                    "add_special": False}, timeout=10).json()
    assert "".join(p["piece"] for p in r2["tokens"]) == "Hello world"
    d = httpx.post(server.url + "/detokenize", json={"tokens": r["tokens"]}, timeout=10).json()
    assert d["content"] == llm.detokenize(r["tokens"])
    bad = httpx.post(server.url + "/detokenize", json={"tokens": [10**9]}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


# ---------------------------------------------------------------- errors

def _error(r, status, param="?", code="?"):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param != "?":
        assert err["param"] == param, err
    if code != "?":
        assert err["code"] == code, err
    return err


@pytest.mark.parametrize("field, value", [
    ("temperature", "hot"), ("temperature", -1), ("top_p", 1.5), ("max_tokens", 0), ("max_tokens", 2.5),
    ("n", 0), ("n", 17), ("stop", [1, 2]), ("stop", [""]), ("seed", "x"), ("logprobs", True), ("logprobs", 99),
    ("presence_penalty", 3), ("stream", "yes"), ("top_k", 1.5), ("min_p", 2), ("repeat_penalty", 0),
    ("best_of", 3), ("logit_bias", {"1": "x"}), ("suffix", "xyz"), ("stream_options", 5), ("model", 7),
])
def test_bad_completion_parameter_names_it(server, field, value):
    r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "x", field: value}, timeout=10)
    err = _error(r, 400, field)
    assert field in err["message"]


@pytest.mark.parametrize("body, param", [
    ({"messages": "hi"}, "messages"), ({"messages": []}, "messages"), ({}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}, "response_format"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}}}}},
     "response_format"),
    ({"messages": [{"role": "user", "content": "x"}], "grammar": "start: undefined_rule"}, "grammar"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": "x"}, "chat_template_kwargs"),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"bos_token": "x"}},
     "chat_template_kwargs"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "reasoning_content": 5}]},
     "messages[1].reasoning_content"),
])
def test_bad_chat_request_names_the_field(server, body, param):
    _error(httpx.post(server.url + "/v1/chat/completions", json=body, timeout=10), 400, param)


def test_malformed_bodies(server):
    url = server.url + "/v1/chat/completions"
    for content in (b"{bad", b"[1, 2]", b"\xff\xfe\x00garbage", b"", b"[" * 100000 + b"]" * 100000, b"null"):
        _error(httpx.post(url, content=content, timeout=10), 400, code="invalid_json")
    for route, body in (("/v1/chat/completions", rb'{"messages": [{"role": "user", "content": "a\ud800b"}]}'),
                        ("/v1/completions", rb'{"prompt": "\udcff"}'), ("/tokenize", rb'{"content": "x\ud800"}')):
        assert "surrogate" in _error(httpx.post(server.url + route, content=body, timeout=10), 400)["message"]
    assert httpx.post(server.url + "/tokenize", content=rb'{"content": "\ud83d\ude00 \\ud800"}').status_code == 200
    _error(httpx.post(server.url + "/v1/completions", json={"prompt": "x", "grammar": "root ::= x\nx ::= x"},
                      timeout=60), 400, code="grammar_failed")   # a grammar that fails was an empty 200 "stop"
    _error(httpx.post(server.url + "/v1/completions", json={"model": MODEL}, timeout=10), 400, "prompt")
    _error(httpx.post(server.url + "/v1/completions", json={"prompt": [[1, 2], "x"]}, timeout=10), 400, "prompt")
    _error(httpx.post(server.url + "/v1/completions", json={"prompt": [10**9]}, timeout=10), 400, "prompt")


def test_unknown_model_route_and_method(server, client, keyed):
    # Any model name is the one served (as llama-server); --strict-model refuses others.
    assert client.completions.create(model="gpt-4o", prompt="x", max_tokens=2).choices[0].text is not None
    with pytest.raises(openai.NotFoundError) as e:
        keyed.client(KEY).completions.create(model="gpt-4o", prompt="x", max_tokens=2)
    assert e.value.body["code"] == "model_not_found"
    _error(httpx.get(server.url + "/v2/nothing", timeout=10), 404, code="unknown_route")
    _error(httpx.get(server.url + "/v1/completions", timeout=10), 405)


def test_prompt_over_the_context(server, client):
    long = "word " * 700      # the server's context is 512 tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=long, max_tokens=4)
    assert e.value.body["code"] == "context_length_exceeded" and "512" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long}])
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "messages"
    # Generation that reaches the end of the context stops there ("length"), it is not an error.
    ok = client.completions.create(model=MODEL, prompt="word " * 500, max_tokens=100, temperature=0)
    assert ok.choices[0].finish_reason == "length" and ok.usage.total_tokens <= 513


def test_api_key(keyed):
    assert keyed.health()[0] == 200                         # /health needs no key
    for key in (None, "wrong", KEY + "x", "Bearer"):
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        _error(httpx.get(keyed.url + "/v1/models", headers=headers, timeout=10), 401, code="invalid_api_key")
    _error(httpx.get(keyed.url + "/v1/models", headers={"Authorization": f"Basic {KEY}"}, timeout=10), 401)
    _error(httpx.get(keyed.url + "/metrics", timeout=10), 401)
    with pytest.raises(openai.AuthenticationError):
        keyed.client("wrong").models.list()
    r = keyed.client(KEY).completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0)
    assert r.usage.completion_tokens == 2
    assert keyed.metrics({"Authorization": f"Bearer {KEY}"})[("pydecode_requests_total",
                                                               (("route", "/v1/models"), ("status", "401")))] >= 5


def test_huge_body_is_refused(keyed):
    headers = {"Authorization": f"Bearer {KEY}"}
    big = {"model": MODEL, "prompt": "x" * 70000}
    _error(httpx.post(keyed.url + "/v1/completions", json=big, headers=headers, timeout=10), 413,
           code="body_too_large")

    def chunks():   # no Content-Length: the cap counts what arrives
        for _ in range(100):
            yield b" " * 1000

    _error(httpx.post(keyed.url + "/v1/completions", content=chunks(), headers=headers, timeout=10), 413)
    assert keyed.health()[0] == 200


def test_queue_full_is_429(keyed):
    c = keyed.client(KEY)
    with c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=200, temperature=0,
                              stream=True) as s:
        next(iter(s))                                      # the one slot is taken, the queue holds 0
        with pytest.raises(openai.RateLimitError) as e:
            c.completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert e.value.body["code"] == "queue_full"
    deadline = time.monotonic() + 10                       # closing the stream frees the slot
    while keyed.health()[1]["active"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert c.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.completion_tokens == 2


# ---------------------------------------------------------------- load and faults

def test_sixteen_concurrent_streams_equal_one_at_a_time(server, client):
    def run(prompt):
        s = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stream=True)
        return "".join(c.choices[0].text for c in s if c.choices)

    alone = [run(p) for p in PROMPTS]
    out = [None] * len(PROMPTS)
    peak = []

    def worker(i):
        out[i] = run(PROMPTS[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak.append(server.health()[1]["active"])
        time.sleep(0.02)
    for t in threads:
        t.join(TIMEOUT)
    assert out == alone
    assert max(peak) > 1          # they did run together


def test_disconnect_mid_stream_frees_the_slot(server):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True,
            "ignore_eos": True}
    before = server.metrics()
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=TIMEOUT) as r:
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
        assert gauge(server.metrics(), "pydecode_active_sequences") == 1
    t0 = time.monotonic()
    while gauge(m := server.metrics(), "pydecode_active_sequences") and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    assert gauge(m, "pydecode_active_sequences") == 0 and gauge(m, "pydecode_kv_bytes_in_use") == 0
    key = ("pydecode_generations_total", (("finish_reason", "cancelled"),))
    assert m.get(key, 0) == before.get(key, 0) + 1
    assert m[("pydecode_generated_tokens_total", ())] < before[("pydecode_generated_tokens_total", ())] + 400


def test_metrics_parse(server, client):
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, temperature=0)
    m = server.metrics()
    for name in ("pydecode_queue_depth", "pydecode_active_sequences", "pydecode_kv_bytes_in_use",
                 "pydecode_kv_bytes_reserved", "pydecode_sequence_slots", "pydecode_model_ready"):
        assert (name, ()) in m, name
    assert gauge(m, "pydecode_sequence_slots") == 16 and gauge(m, "pydecode_model_ready") == 1
    assert m[("pydecode_generated_tokens_total", ())] >= 4 and m[("pydecode_prompt_tokens_total", ())] >= 1
    assert m[("pydecode_time_to_first_token_seconds_count", ())] >= 1
    assert m[("pydecode_inter_token_latency_seconds_count", ())] >= 3
    assert m[("pydecode_requests_total", (("route", "/v1/completions"), ("status", "200")))] >= 1


def test_slow_clients_do_not_block_others(server, client):
    host, port = server.url[len("http://"):].rsplit(":", 1)
    half = socket.create_connection((host, int(port)))
    half.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")  # never finished
    reader = socket.create_connection((host, int(port)))   # asks for a long stream and never reads it
    req = json.dumps({"model": MODEL, "prompt": "Once", "max_tokens": 300, "stream": True, "ignore_eos": True})
    reader.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(req)}\r\n\r\n{req}".encode())
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    try:
        t0 = time.monotonic()
        r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=0)
        assert r.usage.completion_tokens == 8 and time.monotonic() - t0 < 30
    finally:
        half.close()
        reader.close()


def test_health_while_loading_then_ready(tmp_path, smollm_path):
    """The model loads in the background: /health is 503 "loading" (and /v1 routes 503) until it
    is ready. Here the load waits for a file to appear, so the loading phase is seen for sure."""
    gate = tmp_path / "go"
    code = ("import os, sys, time, pydecode\n"
            "from pydecode.server.run import serve\n"
            "def load():\n"
            f"    while not os.path.exists({str(gate)!r}): time.sleep(0.02)\n"
            f"    return pydecode.load({str(smollm_path)!r}, n_ctx=256, n_threads=1)\n"
            f"sys.exit(serve(load, {MODEL!r}, port=0))\n")
    s = Server(cmd=[sys.executable, "-c", code])
    try:
        assert s.health() == (503, {"status": "loading"})
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "x"}, timeout=10)
        _error(r, 503, code="model_loading")
        gate.touch()
        s.wait_ready()
        assert s.health()[1]["status"] == "ok"
    finally:
        assert s.stop() == 0


def test_sigterm_with_streams_in_flight_exits_cleanly():
    s = Server("--n-seq", "4", "-c", "512", "-t", "2").wait_ready()
    results = [None] * 3

    def stream(i):
        body = {"model": MODEL, "prompt": PROMPTS[i], "max_tokens": 2000, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=TIMEOUT) as r:
            results[i] = [line for line in r.iter_lines() if line]

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while s.health()[1]["active"] < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)
    t0 = time.monotonic()
    assert s.stop(signal.SIGTERM) == 0, "".join(s.lines)
    assert time.monotonic() - t0 < 5
    for t in threads:
        t.join(10)
    for events in results:
        assert events[-1] == "data: [DONE]"
        last = json.loads(events[-2][6:])
        assert last["choices"][0]["finish_reason"] == "length"
        assert len(events) > 3


def test_unusable_model_exits_with_its_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    s = Server(cmd=[sys.executable, "-m", "pydecode", "serve", str(bad), "--port", "0"])
    assert s.proc.wait(60) == 1
    assert "failed to load" in "".join(s.lines)


def test_missing_extra_gives_a_one_line_hint(monkeypatch):
    import importlib.util

    from pydecode import server as srv

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a))
    with pytest.raises(ImportError, match=r"pip install 'pydecode\[server\]'"):
        srv.require()


# ---------------------------------------------------------------- structured output

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


def test_response_format_json_schema(client):
    import jsonschema
    msgs = [{"role": "user", "content": "Reply with JSON only: a person's name and age."}]
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=100, temperature=0, response_format=rf)
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    assert r.choices[0].finish_reason == "stop"
    parts = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=100, temperature=0,
                                           response_format=rf, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    assert text == r.choices[0].message.content
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=100, temperature=0,
                                       response_format={"type": "json_object"}, logprobs=True)
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    assert all(isinstance(t.logprob, float) for t in r.choices[0].logprobs.content)   # forced ones: 0.0
    r = httpx.post(client.base_url.join("completions").__str__(), json={
        "model": MODEL, "prompt": "Is water wet? Answer:", "max_tokens": 8, "grammar": 'root ::= " yes" | " no"'},
        timeout=30).json()
    assert r["choices"][0]["text"] in (" yes", " no")
