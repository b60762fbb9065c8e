"""OpenAI's Responses API on the same Engine: POST /v1/responses (streamed or not) and
/v1/responses/input_tokens. The input (a string, or messages and items) becomes chat messages,
generated as /v1/chat/completions does; the answer comes back as a response object, or as the
response.* event stream (with llama-server's timings and prompt_progress when asked)."""
from __future__ import annotations

import json
import time
import uuid

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..chat.reasoning import ReasoningSplitter, opens_reasoning, split_reasoning
from ..chat.templates import TemplateError
from . import params
from .app import _ended, _finished, begin, openai_generation, read_json, submit
from .native import Progress, timings
from .params import APIError, bad
from .streams import EventStream, failure


def to_chat(body: dict) -> list[dict]:
    msgs = []
    if isinstance(body.get("instructions"), str):
        msgs.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    if isinstance(given, str):
        return msgs + [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise bad("input", "must be a string or a non-empty list of messages", "missing" if given is None else None)
    for i, item in enumerate(given):
        if not isinstance(item, dict):
            raise bad(f"input[{i}]", "must be an object")
        kind = item.get("type", "message")
        if kind == "function_call_output":
            msgs.append({"role": "tool", "tool_call_id": item.get("call_id", ""), "content": str(item.get("output", ""))})
            continue
        if kind == "function_call":
            msgs.append({"role": "assistant", "content": "", "tool_calls": [{
                "id": item.get("call_id", ""), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}]})
            continue
        if kind != "message":
            raise bad(f"input[{i}].type", f"unsupported input item {kind!r}")
        content = item.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                pk = part.get("type") if isinstance(part, dict) else None
                if pk in ("input_text", "output_text", "text"):
                    texts.append(str(part.get("text", "")))
                else:
                    raise bad(f"input[{i}].content[{j}]", f"this model reads text only, not {pk!r}", "unsupported")
            content = "\n".join(texts)
        msgs.append({"role": item.get("role", "user"), "content": content})
    return msgs


def _chat_body(body: dict) -> dict:
    out = {k: body[k] for k in ("temperature", "top_p", "top_k", "seed", "stream", "min_p") if k in body}
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    out["messages"] = to_chat(body)
    return out


async def input_tokens(request: Request) -> Response:
    state = request.app.state.pd
    llm = state.model()
    body = await read_json(request, state.max_body)
    msgs = params.messages(_chat_body(body))
    try:
        ids = await run_in_threadpool(llm.chat_tokens, msgs)
    except (TemplateError, ValueError) as e:
        raise APIError(400, f"input: {e}", param="input", code="invalid_messages") from None
    return JSONResponse({"object": "response.input_tokens", "input_tokens": len(ids)})


async def responses(request: Request) -> Response:
    state, llm, body = await begin(request)
    chat = _chat_body(body)
    g = openai_generation(state, llm, chat, chat=True, default_max_tokens=None)
    msgs = params.messages(chat)
    fmt = llm.reasoning_format if state.settings.reasoning_format != "none" else None
    try:
        ids = await run_in_threadpool(llm.chat_tokens, msgs)
        opened = fmt is not None and opens_reasoning(await run_in_threadpool(llm.chat_prompt, msgs), fmt)
    except (TemplateError, ValueError) as e:
        raise APIError(400, f"input: {e}", param="input", code="invalid_messages") from None
    progress, extra = None, {}
    if g.stream and body.get("return_progress"):
        import asyncio
        loop = asyncio.get_running_loop()
        wake_ev = asyncio.Event()
        progress = Progress(lambda: loop.call_soon_threadsafe(wake_ev.set))
        extra["on_prefill"] = progress
    handles = await submit(state, llm, [ids], g, "input", extra)
    resp_id, msg_id, created = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}", int(time.time())
    model = body.get("model") or state.model_id

    def response(status, text, c=None):
        item = {"id": msg_id, "type": "message", "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}] if text is not None else []}
        out = {"id": resp_id, "object": "response", "created_at": created, "status": status, "model": model,
               "output": [item] if text is not None else [], "parallel_tool_calls": False, "tool_choice": "auto",
               "tools": [], "error": None, "incomplete_details": None, "instructions": body.get("instructions"),
               "metadata": {}, "temperature": g.sampling["temperature"], "top_p": g.sampling["top_p"],
               "max_output_tokens": g.max_tokens, "text": {"format": {"type": "text"}}}
        if c is not None:
            if c.finish_reason == "length":
                out["status"], out["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
                item["status"] = "incomplete"
            n_in, n_out = c.stats.prompt_tokens, len(c.tokens)
            out["usage"] = {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": c.stats.cached_tokens},
                            "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": 0},
                            "total_tokens": n_in + n_out}
        return out

    if not g.stream:
        await _finished(state, request, handles)
        c = handles[0].completion
        reasoning, answer = split_reasoning(c.text, fmt, opened)
        out = response("completed", answer, c)
        if reasoning:
            out["output"].insert(0, {"id": f"rs_{uuid.uuid4().hex}", "type": "reasoning", "summary": [],
                                     "content": [{"type": "reasoning_text", "text": reasoning}]})
        return JSONResponse(out)

    per_token = bool(body.get("timings_per_token"))
    seq = [0]

    def event(kind, data) -> bytes:
        seq[0] += 1
        payload = {"type": kind, "sequence_number": seq[0], **data}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()

    where = {"item_id": msg_id, "output_index": 0, "content_index": 0}

    async def stream():
        import asyncio
        h = handles[0]
        loop, ready = asyncio.get_running_loop(), asyncio.Event()
        h.set_waker(lambda: loop.call_soon_threadsafe(ready.set))
        if progress is not None:
            progress.wake = lambda: loop.call_soon_threadsafe(ready.set)
        yield event("response.created", {"response": response("in_progress", None)})
        yield event("response.in_progress", {"response": response("in_progress", None)})
        if progress is not None:
            progress.first(h._s.policy.stats.cached_tokens, len(h.prompt))
        opened_item = False
        splitter, text = ReasoningSplitter(fmt, opened), []
        while True:
            ready.clear()
            while progress is not None and progress.events:
                done, total, ms = progress.events.pop(0)
                cache = progress.cache or 0
                yield event("response.in_progress", {"response": response("in_progress", None),
                            "prompt_progress": {"total": total, "cache": cache, "processed": done, "time_ms": ms},
                            "timings": timings(None, (done, cache, ms))})
            got, finished = h.take()
            pairs = splitter.feed("".join(p.text for p in got)) if got else []
            if finished:
                pairs += splitter.flush()
            for kind, t in pairs:
                if kind == "reasoning" or not t:
                    continue
                if not opened_item:
                    opened_item = True
                    yield event("response.output_item.added", {"output_index": 0, "item": {
                        "id": msg_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}})
                    yield event("response.content_part.added", {**where, "part": {
                        "type": "output_text", "text": "", "annotations": []}})
                text.append(t)
                data = {**where, "delta": t, "logprobs": []}
                if per_token:
                    data["timings"] = timings(h.completion) if h.completion else timings(None, (len(h.prompt), 0, 0.0))
                yield event("response.output_text.delta", data)
            if finished:
                break
            await ready.wait()
        err = failure(h)
        if err is not None:
            yield event("error", {"code": err.code, "message": err.message})
            return
        full = "".join(text)
        if not opened_item:
            yield event("response.output_item.added", {"output_index": 0, "item": {
                "id": msg_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}})
            yield event("response.content_part.added", {**where, "part": {"type": "output_text", "text": "",
                                                                          "annotations": []}})
        part = {"type": "output_text", "text": full, "annotations": []}
        yield event("response.output_text.done", {**where, "text": full, "logprobs": []})
        yield event("response.content_part.done", {**where, "part": part})
        final = response("completed", full, h.completion)
        yield event("response.output_item.done", {"output_index": 0, "item": final["output"][0]})
        done = {"response": final}
        if per_token or progress is not None:
            done["timings"] = timings(h.completion)
        yield event("response.completed", done)

    return EventStream(stream(), on_close=lambda: _ended(state, handles))


def routes():
    from starlette.routing import Route
    return [Route(f"{p}/responses", responses, methods=["POST"]) for p in ("/v1", "")] + \
        [Route(f"{p}/responses/input_tokens", input_tokens, methods=["POST"]) for p in ("/v1", "")]
