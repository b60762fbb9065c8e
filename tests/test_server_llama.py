"""`pydecode serve` as llama-server and Anthropic clients see it: the native /completion,
/apply-template, /props, /slots (save / restore / erase under --slot-save-path), Anthropic's
/v1/messages, OpenAI's /v1/responses, CORS, X-Api-Key, the llamacpp:* metrics, the error shapes.
One server with llama-server's flags (as bench/llama_server_shim.py passes them). Greedy answers
are checked against llm.generate in this process."""
import json
import math

import httpx
import pytest

from serving import Server

KEY = "llama-key"


@pytest.fixture(scope="module")
def ls(tmp_path_factory):
    slots = tmp_path_factory.mktemp("slots")
    s = Server("-np", "2", "-c", "256", "-t", "2", "--temp", "0", "--seed", "42", "--n-predict", "16", "--metrics",
               "--slot-save-path", str(slots), "--alias", "tiny,code", "--tags", "chat,small", "--api-key", KEY,
               "-ngl", "99", "--jinja", "-fa", "on").wait_ready()
    s.slot_dir = slots
    yield s
    assert s.stop() == 0, "".join(s.lines)


@pytest.fixture(scope="module")
def llm(smollm_path):
    import pydecode
    with pydecode.load(smollm_path, n_ctx=256, n_threads=2) as m:
        yield m


def post(s, path, body, key=KEY, **kw):
    return httpx.post(s.url + path, json=body, headers={"Authorization": f"Bearer {key}"} if key else {},
                      timeout=120, **kw)


def events(r):
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def test_gpu_flags_are_noted_not_refused(ls):
    assert any("change nothing here" in line and "gpu-layers" in line for line in ls.lines), ls.lines


def test_native_completion_fields_and_greedy_text(ls, llm):
    r = post(ls, "/completion", {"prompt": "The capital of France is", "n_predict": 8, "return_tokens": True})
    assert r.status_code == 200, r.text
    b = r.json()
    want = llm.generate("The capital of France is", 8)
    assert b["content"] == want.text and b["tokens"] == want.tokens
    t = b["timings"]
    assert t["predicted_n"] == len(want.tokens) and t["prompt_n"] + t["cache_n"] == len(llm.tokenize("The capital of France is"))
    assert b["stop_type"] in ("limit", "eos") and isinstance(b["has_new_line"], bool) and b["truncated"] is False
    assert b["generation_settings"]["seed"] == 42 and b["generation_settings"]["n_predict"] == 8
    # the generation rate is over the decode steps after the first token
    assert math.isclose(t["predicted_per_second"], 1e3 / t["predicted_ms"] * (t["predicted_n"] - 1))
    # --n-predict is the default length
    assert post(ls, "/completion", {"prompt": "Once upon a time"}).json()["timings"]["predicted_n"] <= 16


def test_native_stream_matches_the_answer_and_ends_with_stop(ls):
    body = {"prompt": "Once upon a time", "n_predict": 8}
    whole = post(ls, "/completion", body).json()["content"]
    chunks = events(post(ls, "/completion", {**body, "stream": True}))
    assert "".join(c["content"] for c in chunks) == whole
    assert chunks[-1]["stop"] is True and all(c["stop"] is False for c in chunks[:-1])
    assert "timings" in chunks[-1] and "generation_settings" in chunks[-1]


def test_prompt_forms_and_probabilities(ls, llm):
    ids = llm.tokenize("The sky is")
    many = post(ls, "/completion", {"prompt": [ids, "The sky is", {"prompt_string": "The sky is"}], "n_predict": 4}).json()
    assert isinstance(many, list) and len({m["content"] for m in many}) == 1
    p = post(ls, "/completion", {"prompt": "The sky is", "n_predict": 3, "n_probs": 5}).json()["completion_probabilities"]
    assert len(p) == 3 and all(len(x["top_logprobs"]) == 5 and x["logprob"] <= 0 for x in p)
    bad = post(ls, "/completion", {"prompt": {"prompt_string": "x", "multimodal_data": ["AAAA"]}})
    assert bad.status_code == 400


def test_logit_bias_bans_tokens_by_id_and_by_text(ls, llm):
    first = llm.generate("The capital of France is", 4).tokens[0]
    for bias in ({str(first): -100}, [[first, False]], [[llm.detokenize([first]), -100]]):
        b = post(ls, "/completion", {"prompt": "The capital of France is", "n_predict": 4, "logit_bias": bias}).json()
        assert b["content"] and llm.tokenize(b["content"], False)[0] != first, bias
    ignore = post(ls, "/completion", {"prompt": "Hi", "n_predict": 2, "ignore_eos": True}).json()
    assert ignore["generation_settings"]["logit_bias"] and all(e["bias"] is None
                                                               for e in ignore["generation_settings"]["logit_bias"])


def test_context_exceeded_has_llama_servers_shape(ls):
    r = post(ls, "/completion", {"prompt": "hello " * 400})
    e = r.json()["error"]
    assert r.status_code == 400 and e["type"] == "exceed_context_size_error"
    assert e["n_ctx"] == 256 and e["n_prompt_tokens"] > 256 and "exceeds the available context size" in e["message"]


def test_apply_template_named_template_and_prefill(ls):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    p = post(ls, "/apply-template", {"messages": msgs}).json()["prompt"]
    assert p.endswith("<|im_start|>assistant\n")
    pre = post(ls, "/apply-template", {"messages": msgs + [{"role": "assistant", "content": "Hel"}]}).json()["prompt"]
    assert pre.endswith("<|im_start|>assistant\nHel")
    both = post(ls, "/chat/completions", {"messages": msgs + [{"role": "assistant", "content": "x"}],
                                          "add_generation_prompt": True, "continue_final_message": True})
    assert both.status_code == 400
    n = post(ls, "/chat/completions/input_tokens", {"messages": msgs}).json()["input_tokens"]
    assert n > 5


def test_props_models_and_slots(ls, tmp_path):
    props = httpx.get(ls.url + "/props", headers={"X-Api-Key": KEY}, timeout=10).json()
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 256
    assert props["default_generation_settings"]["params"]["seed"] == 42 and ".gguf" in props["model_path"]
    models = httpx.get(ls.url + "/models", headers={"X-Api-Key": KEY}, timeout=10).json()["data"]
    assert models[0]["id"] == "code" and set(models[0]["aliases"]) == {"tiny", "code"}
    assert set(models[0]["tags"]) == {"chat", "small"}
    slots = httpx.get(ls.url + "/slots", headers={"X-Api-Key": KEY}, timeout=10).json()
    assert len(slots) == 2 and not any(s["is_processing"] for s in slots)


def test_slot_save_restore_erase(ls, llm):
    prompt = "What is the capital of France?"
    a = post(ls, "/completion", {"prompt": prompt, "id_slot": 1, "n_predict": 4}).json()
    assert a["id_slot"] == 1
    saved = post(ls, "/slots/1?action=save", {"filename": "one.bin"}).json()
    assert saved["n_saved"] > 0 and (ls.slot_dir / "one.bin").exists()
    assert post(ls, "/slots/1?action=erase", {}).json()["n_erased"] == saved["n_saved"]
    restored = post(ls, "/slots/0?action=restore", {"filename": "one.bin"}).json()
    assert restored["n_restored"] == saved["n_saved"]
    again = post(ls, "/completion", {"prompt": prompt, "id_slot": 0, "n_predict": 4}).json()
    assert again["timings"]["cache_n"] > 0 and again["content"] == a["content"]
    for name in ("../x.bin", "/etc/passwd", ".hidden", "a/b"):
        r = post(ls, "/slots/0?action=save", {"filename": name})
        assert r.status_code == 400, name
    assert post(ls, "/slots/0?action=restore", {"filename": "missing.bin"}).status_code == 404


def test_chat_verbose_answer_carries_the_prompt(ls, llm):
    """llama-server's "verbose": true: the rendered prompt and its tokens beside the answer."""
    msgs = [{"role": "user", "content": "Hi"}]
    r = post(ls, "/chat/completions", {"messages": msgs, "max_tokens": 2, "verbose": True})
    assert r.status_code == 200, r.text
    v = r.json()["__verbose"]
    assert v["prompt"] == llm.chat_prompt(msgs) and v["prompt_tokens"] == llm.chat_tokens(msgs)


def test_anthropic_messages(ls, llm):
    body = {"model": "claude", "max_tokens": 8, "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]}
    r = httpx.post(ls.url + "/v1/messages", json=body, headers={"X-Api-Key": KEY}, timeout=120).json()
    assert r["type"] == "message" and r["content"][0]["type"] == "text"
    assert r["stop_reason"] in ("end_turn", "max_tokens") and r["usage"]["output_tokens"] > 0
    want = llm.chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], 8)
    assert r["content"][0]["text"] == want.text
    ev = events(httpx.post(ls.url + "/v1/messages", json={**body, "stream": True}, headers={"X-Api-Key": KEY},
                           timeout=120))
    kinds = [e["type"] for e in ev]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    assert "".join(e["delta"]["text"] for e in ev if e["type"] == "content_block_delta") == want.text
    n = httpx.post(ls.url + "/v1/messages/count_tokens", json=body, headers={"X-Api-Key": KEY}, timeout=10).json()
    assert n == {"input_tokens": len(llm.chat_tokens(body_messages(body)))}


def body_messages(body):
    return [{"role": "system", "content": body["system"]}] + body["messages"]


def test_responses_api(ls, llm):
    r = post(ls, "/v1/responses", {"input": "Say hi", "max_output_tokens": 6}).json()
    assert r["id"].startswith("resp_") and r["output"][0]["id"].startswith("msg_")
    text = r["output"][0]["content"][0]["text"]
    assert text == llm.chat([{"role": "user", "content": "Say hi"}], 6).text
    ev = events(post(ls, "/v1/responses", {"input": "Say hi", "max_output_tokens": 6, "stream": True}))
    assert ev[-1]["type"] == "response.completed"
    assert "".join(e["delta"] for e in ev if e["type"] == "response.output_text.delta") == text


def test_cors_and_api_key_headers(ls):
    pre = httpx.options(ls.url + "/completion", headers={"Origin": "http://web.example", "Access-Control-Request-Method": "POST"},
                        timeout=10)
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://web.example"
    assert pre.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    assert post(ls, "/completion", {"prompt": "x"}, key=None).status_code == 401
    assert httpx.post(ls.url + "/completion", json={"prompt": "x", "n_predict": 1}, headers={"X-Api-Key": KEY},
                      timeout=60).status_code == 200


def test_llamacpp_metrics(ls):
    text = httpx.get(ls.url + "/metrics", headers={"X-Api-Key": KEY}, timeout=10).text
    for name in ("prompt_tokens_total", "tokens_predicted_total", "n_decode_total", "requests_processing"):
        assert f"# TYPE llamacpp:{name} " in text and f"\nllamacpp:{name} " in text


def test_metrics_and_slots_off_are_501():
    s = Server("-c", "128", "-t", "1", "--no-slots").wait_ready()
    try:
        assert httpx.get(s.url + "/metrics", timeout=10).status_code == 501
        assert httpx.get(s.url + "/slots", timeout=10).status_code == 501
        assert httpx.post(s.url + "/slots/0?action=save", json={"filename": "a.bin"}, timeout=10).status_code == 501
    finally:
        assert s.stop() == 0


def test_sleep_frees_the_model_and_the_next_request_reloads_it(llm):
    """--sleep-idle-seconds: idle past it, the model is closed (its memory freed: the server's
    resident memory drops); monitoring reads neither wake it nor keep it awake; the next request
    reloads it and answers as before."""
    import os
    import time

    def rss(pid):
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) << 10

    s = Server("-c", "4096", "-np", "4", "-t", "2", "--temp", "0", "--sleep-idle-seconds", "1", "--metrics").wait_ready()
    try:
        want = llm.generate("The capital of France is", 8).text
        r = httpx.post(s.url + "/completion", json={"prompt": "The capital of France is", "n_predict": 8}, timeout=60)
        assert r.json()["content"] == want
        awake = rss(s.proc.pid)
        deadline = time.monotonic() + 30
        while not httpx.get(s.url + "/props", timeout=10).json()["is_sleeping"]:
            assert time.monotonic() < deadline, "never fell asleep"
            time.sleep(0.2)
        time.sleep(0.3)
        asleep = rss(s.proc.pid)
        assert asleep < awake - (64 << 20), (awake, asleep)   # the KV cache (4 x 4096 positions) went back
        for path in ("/health", "/models", "/slots", "/metrics", "/props"):   # monitoring: still asleep
            r = httpx.get(s.url + path, timeout=10)
            assert r.status_code == 200, (path, r.text)
        assert httpx.get(s.url + "/health", timeout=10).json()["sleeping"] is True
        assert all(x["n_cached"] == 0 for x in httpx.get(s.url + "/slots", timeout=10).json())
        assert httpx.get(s.url + "/props", timeout=10).json()["is_sleeping"] is True
        r = httpx.post(s.url + "/completion", json={"prompt": "The capital of France is", "n_predict": 8}, timeout=60)
        assert r.status_code == 200 and r.json()["content"] == want
        assert httpx.get(s.url + "/props", timeout=10).json()["is_sleeping"] is False
        assert "llamacpp:tokens_predicted_total 16" in httpx.get(s.url + "/metrics", timeout=10).text
        assert any("asleep" in line for line in s.lines)
    finally:
        assert s.stop() == 0, "".join(s.lines)
