"""The server under hostile requests (issue 35): clients that never finish their headers or
body, a request for more sequences than the server can ever hold, grammars too large or too slow
to convert, and CPU-heavy requests that must not stall the event loop (/health answers while
they run)."""
import asyncio
import json
import socket
import threading
import time

import httpx
import pytest

import pydecode
from pydecode import constraint
from pydecode.server import app as server_app
from pydecode.server import info as server_info
from pydecode.server.params import APIError
from pydecode.server.state import ServerState
from serving import MODEL, TIMEOUT, Server

READ_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def server():
    s = Server("--n-seq", "2", "--max-queue", "1", "-c", "256", "-t", "1", "--timeout", str(READ_TIMEOUT)).wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.lines)


def _connect(server) -> socket.socket:
    host, port = server.url[len("http://"):].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.settimeout(10 * READ_TIMEOUT + 10)
    return sock


def _read_all(sock) -> bytes:
    out = b""
    while True:
        got = sock.recv(65536)
        if not got:
            return out
        out += got


def chain_gbnf(n: int) -> str:
    """n GBNF rules, each referring to the next: llguidance's conversion is superlinear in them."""
    return "root ::= r0\n" + "".join(f'r{i} ::= "a{i}" r{i + 1} | "b"\n' for i in range(n)) + f'r{n} ::= "z"\n'


# ---------------------------------------------------------------- slow clients

@pytest.mark.parametrize("sent", [b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"], ids=["nothing", "half-headers"])
def test_headers_that_never_finish_get_408(server, sent):
    with _connect(server) as sock:
        t0 = time.monotonic()
        sock.sendall(sent)
        reply = _read_all(sock)           # answered, then closed by the server
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert READ_TIMEOUT * 0.9 <= time.monotonic() - t0 < READ_TIMEOUT + 8
    assert server.health()[0] == 200


def test_a_slow_next_request_on_a_kept_alive_connection_gets_408(server):
    with _connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200"), first
        sock.sendall(b"GET /health HTTP/1.1\r\n")   # and no more: within uvicorn's keep-alive, slowly
        for _ in range(3):
            time.sleep(READ_TIMEOUT / 3)
            try:
                sock.sendall(b"X")
            except OSError:
                break
        reply = _read_all(sock)
    assert b"408" in reply.split(b"\r\n", 1)[0], reply


def test_a_body_that_stops_arriving_gets_408(server):
    with _connect(server) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"pro")
        t0 = time.monotonic()
        reply = _read_all(sock)
        waited = time.monotonic() - t0
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), reply
    assert b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert waited < READ_TIMEOUT + 3, waited   # closed with the answer, not after the keep-alive (5 s)


def test_a_body_nested_past_the_parser_is_400_naming_it(server):
    schema = '{"type":"object","properties":{"a":' * 600 + '{"type":"integer"}' + "}}" * 600
    body = '{"messages":[{"role":"user","content":"x"}],"max_tokens":2,' \
           '"response_format":{"type":"json_schema","json_schema":{"name":"d","schema":' + schema + "}}}"
    r = httpx.post(server.url + "/v1/chat/completions", timeout=TIMEOUT, content=body,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert "too deep" in r.json()["error"]["message"]


# ---------------------------------------------------------------- what can never succeed

def test_more_sequences_than_the_server_can_hold_is_400_not_429(server):
    url = server.url + "/v1/completions"
    r = httpx.post(url, json={"model": MODEL, "prompt": ["a", "b", "c", "d"], "max_tokens": 1}, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_sequences", r.text
    assert "2 slots" in r.json()["error"]["message"] and "1 queued" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/chat/completions", timeout=TIMEOUT, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 4, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    ok = httpx.post(url, json={"model": MODEL, "prompt": ["a", "b", "c"], "max_tokens": 1}, timeout=TIMEOUT)
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 3, ok.text


@pytest.mark.parametrize("field, value, limit", [
    ("grammar", chain_gbnf(constraint.MAX_GBNF_RULES + 5), "rules"),
    ("grammar", 'start: "' + "x" * (constraint.MAX_GRAMMAR_BYTES + 1) + '"', "bytes"),
])
def test_a_grammar_past_a_size_limit_is_400_at_once(server, field, value, limit):
    t0 = time.monotonic()
    r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "x", field: value}, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert limit in r.json()["error"]["message"] and time.monotonic() - t0 < 10


# ---------------------------------------------------------------- the event loop stays free

def _health_while(server, request) -> tuple[object, list[float]]:
    """Runs request() in a thread and polls /health until it is done: (its result, the /health
    latencies seen while it was still running)."""
    out, done = [], threading.Event()

    def run():
        try:
            out.append(request())
        finally:
            done.set()

    t = threading.Thread(target=run)
    t.start()
    seen = []
    with httpx.Client(timeout=TIMEOUT) as c:
        while not done.is_set():
            t0 = time.monotonic()
            assert c.get(server.url + "/health").status_code == 200
            if not done.is_set():
                seen.append(time.monotonic() - t0)
            time.sleep(0.01)
    t.join()
    return out[0], seen


def test_health_answers_while_a_slow_grammar_converts(server):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2, "grammar": chain_gbnf(constraint.MAX_GBNF_RULES - 24)}
    r, seen = _health_while(server, lambda: httpx.post(server.url + "/v1/completions", json=body, timeout=TIMEOUT))
    assert r.status_code == 200, r.text
    assert seen, "/health was not answered while the grammar converted"


def test_health_answers_while_megabytes_are_tokenized_with_pieces(server):
    text = "The quick brown fox jumps over the lazy dog. " * 20000   # 900 KB
    r, seen = _health_while(server, lambda: httpx.post(server.url + "/tokenize", timeout=TIMEOUT, json={
        "content": text, "with_pieces": True, "add_special": False}))
    assert r.status_code == 200
    assert "".join(p["piece"] for p in r.json()["tokens"]) == text
    assert seen, "/health was not answered while /tokenize ran"


@pytest.mark.parametrize("pieces", [False, True])
def test_long_tokenize_lets_other_threads_run(smollm_path, pieces):
    """The event loop is another thread of the same process: tokenizers' encode and one json.dumps
    of the whole answer held the GIL for 0.4 s on 900 KB, and every client waited that long.
    Now the encode goes through tokenizers' GIL-free batch call and the JSON is built in slices,
    so a thread that sleeps 1 ms at a time keeps running throughout."""
    with pydecode.load(smollm_path, n_ctx=256, n_threads=1) as llm:
        text = "The quick brown fox jumps over the lazy dog. " * 20000
        ticks, stop = [], threading.Event()

        def tick():
            while not stop.is_set():
                ticks.append(time.monotonic())
                time.sleep(0.001)
        t = threading.Thread(target=tick)
        t.start()
        try:
            t0 = time.monotonic()
            r = server_info._tokenized(llm, text, False, pieces)
            t1 = time.monotonic()
        finally:
            stop.set()
            t.join()
        during = [x for x in ticks if t0 <= x <= t1]
        gaps = max(b - a for a, b in zip([t0] + during, during + [t1]))
        assert gaps < 0.5 * (t1 - t0), f"another thread was held off {gaps:.3f} s of {t1 - t0:.3f} s"
        got = json.loads(r.body)["tokens"]
        if pieces:
            assert "".join(p["piece"] for p in got) == text
        else:
            assert got == llm.tokenize(text, add_special=False)


def test_a_grammar_over_the_time_budget_is_400(smollm_path):
    with pydecode.load(smollm_path, n_ctx=256, n_threads=1) as llm:
        state = ServerState(MODEL)
        state.grammar_budget_s = 0.001
        try:
            with pytest.raises(APIError) as e:
                asyncio.run(server_app._compiled(state, llm, {"grammar": chain_gbnf(800)}))
            assert e.value.status == 400 and e.value.code == "grammar_too_complex" and e.value.param == "grammar"
            state.grammar_budget_s = 60
            got = asyncio.run(server_app._compiled(state, llm, {"grammar": 'root ::= "yes" | "no"'}))
            assert got["grammar"].checked is llm.tokenizer
        finally:
            state.grammar_threads.shutdown(wait=True)
