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

from ..chat.reasoning import ReasoningSplitter, split_reasoning
from ..chat.templates import TemplateError
from . import params
from .app import _ended, _finished, begin, openai_generation, read_json, submit
from .chat_route import rendered_prompt
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
    out = {k: body[k] for k in ("temperature", "top_p", "top_k", "seed", "stream", "min_p", "tool_choice",
                                "parallel_tool_calls") if k in body}
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    tools = body.get("tools")
    if isinstance(tools, list):   # (its function tools are flat: {"type": "function", "name", "parameters"})
        for i, t in enumerate(tools):
            if isinstance(t, dict) and t.get("type", "function") != "function":
                raise bad(f"tools[{i}].type", f"only function tools are served here, not {t.get('type')!r}",
                          "unsupported")
    out["tools"] = tools
    out["messages"] = to_chat(body)
    return out


def _template_inputs(llm, chat: dict, plan) -> tuple[list[dict], dict]:
    msgs = params.messages(chat)
    if plan is None:
        return msgs, {}
    return plan.messages(msgs), {"tools": plan.tools}


async def input_tokens(request: Request) -> Response:
    from .chat_route import tool_plan
    state = request.app.state.pd
    llm = state.model()
    body = await read_json(request, state.max_body)
    chat = _chat_body(body)
    msgs, kwargs = _template_inputs(llm, chat, tool_plan(llm, chat))
    try:
        ids = await run_in_threadpool(llm.chat_tokens, msgs, **kwargs)
    except (TemplateError, ValueError) as e:
        raise APIError(400, f"input: {e}", param="input", code="invalid_messages") from None
    return JSONResponse({"object": "response.input_tokens", "input_tokens": len(ids)})


def _message(msg_id: str, text: str, status: str = "completed") -> dict:
    return {"id": msg_id, "type": "message", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if text is not None else []}


def _call(call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {"id": "fc_" + call_id[5:], "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}


async def responses(request: Request) -> Response:
    from .chat_route import tool_plan, tools_after_reasoning
    state, llm, body = await begin(request)
    chat = _chat_body(body)
    g = openai_generation(state, llm, chat, chat=True, default_max_tokens=None)
    plan = tool_plan(llm, chat, g)   # function calls always parse (chat/tools.py)
    msgs, kwargs = _template_inputs(llm, chat, plan)
    ids, _, fmt, opened = await rendered_prompt(state, llm, msgs, kwargs, "input")
    tools_after_reasoning(llm, plan, g, fmt, opened)
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

    def response(status, output, c=None):
        out = {"id": resp_id, "object": "response", "created_at": created, "status": status, "model": model,
               "output": output, "parallel_tool_calls": body.get("parallel_tool_calls", plan is not None),
               "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [], "error": None,
               "incomplete_details": None, "instructions": body.get("instructions"),
               "metadata": {}, "temperature": g.sampling["temperature"], "top_p": g.sampling["top_p"],
               "max_output_tokens": g.max_tokens, "text": {"format": {"type": "text"}}}
        if c is not None:
            if c.finish_reason == "length":
                out["status"], out["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
                if output and output[-1]["type"] == "message":
                    output[-1]["status"] = "incomplete"
            n_in, n_out = c.stats.prompt_tokens, len(c.tokens)
            out["usage"] = {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": c.stats.cached_tokens},
                            "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": 0},
                            "total_tokens": n_in + n_out}
        return out

    if not g.stream:
        await _finished(state, request, handles)
        c = handles[0].completion
        reasoning, answer = split_reasoning(c.text, fmt, opened)
        answer, calls = plan.parse(answer) if plan is not None else (answer, [])
        output = [_message(msg_id, answer)] if answer or not calls else []
        output += [_call(k["id"], k["function"]["name"], k["function"]["arguments"]) for k in calls]
        out = response("completed", output, c)
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

    async def stream():
        import asyncio
        h = handles[0]
        loop, ready = asyncio.get_running_loop(), asyncio.Event()
        h.set_waker(lambda: loop.call_soon_threadsafe(ready.set))
        if progress is not None:
            progress.wake = lambda: loop.call_soon_threadsafe(ready.set)
        yield event("response.created", {"response": response("in_progress", [])})
        yield event("response.in_progress", {"response": response("in_progress", [])})
        if progress is not None:
            progress.first(h._s.policy.stats.cached_tokens, len(h.prompt))
        splitter = ReasoningSplitter(fmt, opened)
        reader = plan.stream() if plan is not None else None   # function calls read as they stream
        done_items, cur = [], None   # cur: the item being streamed ({"type": ..., "parts": [...]})

        def close() -> list[bytes]:
            nonlocal cur
            if cur is None:
                return []
            i, text = len(done_items), "".join(cur["parts"])
            if cur["type"] == "message":
                where = {"item_id": msg_id, "output_index": i, "content_index": 0}
                item = _message(msg_id, text)
                out = [event("response.output_text.done", {**where, "text": text, "logprobs": []}),
                       event("response.content_part.done", {**where, "part": item["content"][0]})]
            else:
                item = _call(cur["call_id"], cur["name"], text)
                out = [event("response.function_call_arguments.done", {"item_id": item["id"], "output_index": i,
                                                                        "arguments": text})]
            done_items.append(item)
            cur = None
            return out + [event("response.output_item.done", {"output_index": i, "item": item})]

        def emit(d) -> list[bytes]:
            nonlocal cur
            out, i = [], len(done_items)
            if d[0] == "call" or (d[0] == "content" and (cur is None or cur["type"] != "message")):
                out += close()
                cur = ({"type": "message", "parts": []} if d[0] == "content" else
                       {"type": "function_call", "call_id": d[2], "name": d[3], "parts": []})
                item = _message(msg_id, None, "in_progress") if d[0] == "content" else \
                    _call(d[2], d[3], "", "in_progress")
                out.append(event("response.output_item.added", {"output_index": i, "item": item}))
                if d[0] == "content":
                    out.append(event("response.content_part.added", {
                        "item_id": msg_id, "output_index": i, "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": []}}))
            if d[0] == "content" and d[1]:
                cur["parts"].append(d[1])
                data = {"item_id": msg_id, "output_index": i, "content_index": 0, "delta": d[1], "logprobs": []}
                if per_token:
                    data["timings"] = timings(h.completion) if h.completion else timings(None, (len(h.prompt), 0, 0.0))
                out.append(event("response.output_text.delta", data))
            elif d[0] == "args":
                cur["parts"].append(d[2])
                out.append(event("response.function_call_arguments.delta", {
                    "item_id": "fc_" + cur["call_id"][5:], "output_index": i, "delta": d[2]}))
            return out

        while True:
            ready.clear()
            while progress is not None and progress.events:
                done, total, ms = progress.events.pop(0)
                cache = progress.cache or 0
                yield event("response.in_progress", {"response": response("in_progress", []),
                            "prompt_progress": {"total": total, "cache": cache, "processed": done, "time_ms": ms},
                            "timings": timings(None, (done, cache, ms))})
            got, finished = h.take()
            pairs = splitter.feed("".join(p.text for p in got)) if got else []
            if finished:
                pairs += splitter.flush()
            for kind, t in pairs:
                if kind == "reasoning" or not t:
                    continue
                for d in (reader.feed(t) if reader is not None else [("content", t)]):
                    for e in emit(d):
                        yield e
            if finished:
                break
            await ready.wait()
        err = failure(h)
        if err is not None:
            yield event("error", {"code": err.code, "message": err.message})
            return
        for d in (reader.finish() if reader is not None else []):
            for e in emit(d):
                yield e
        if cur is None and not done_items:   # an empty answer is still one (empty) message
            for e in emit(("content", "")):
                yield e
        for e in close():
            yield e
        final = response("completed", done_items, h.completion)
        done = {"response": final}
        if per_token or progress is not None:
            done["timings"] = timings(h.completion)
        yield event("response.completed", done)

    return EventStream(stream(), on_close=lambda: _ended(state, handles))


def routes():
    from starlette.routing import Route
    return [Route(f"{p}/responses", responses, methods=["POST"]) for p in ("/v1", "")] + \
        [Route(f"{p}/responses/input_tokens", input_tokens, methods=["POST"]) for p in ("/v1", "")]
