"""Anthropic's Messages API on the same Engine: POST /v1/messages (streamed or not) and
/v1/messages/count_tokens. A request is turned into the chat messages a template reads (system,
text blocks, tool_use as tool_calls, tool_result as tool messages, thinking as reasoning_content)
and generated as /v1/chat/completions does; the answer comes back in Anthropic's shapes."""
from __future__ import annotations

import json
import uuid

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..chat.reasoning import ReasoningSplitter, split_reasoning
from ..chat.templates import TemplateError
from . import params
from .app import _ended, _finished, begin, openai_generation, read_json, submit
from .chat_route import rendered_prompt, tools_after_reasoning
from .chat_tools import template_tools
from .params import APIError, bad
from .streams import EventStream, text_chunks

STOP = {"stop": "end_turn", "length": "max_tokens"}


def _text_of(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for j, b in enumerate(content):
            kind = b.get("type") if isinstance(b, dict) else None
            if kind == "text" and isinstance(b.get("text"), str):
                out.append(b["text"])
            elif kind in ("image", "document"):
                raise APIError(500, f"{where}[{j}]: image input is not supported by this model (it reads text only)",
                               code="unsupported")
            else:
                raise bad(f"{where}[{j}]", f"unsupported content block {b!r}")
        return "\n".join(out)
    raise bad(where, f"must be a string or a list of content blocks, got {content!r}")


def to_chat(body: dict) -> list[dict]:
    """Anthropic's system + messages -> OpenAI-style chat messages."""
    msgs = []
    system = body.get("system")
    if system is not None:
        msgs.append({"role": "system", "content": _text_of(system, "system")})
    given = body.get("messages")
    if not isinstance(given, list):
        raise bad("messages", "is required: a list of {\"role\", \"content\"}", "missing")
    for i, m in enumerate(given):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad(f"{where}.role", "must be user or assistant")
        content = m.get("content")
        if isinstance(content, str):
            msgs.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise bad(f"{where}.content", "must be a string or a list of content blocks")
        text, calls, thinking, results = [], [], [], []
        for j, b in enumerate(content):
            kind = b.get("type") if isinstance(b, dict) else None
            if kind == "text":
                text.append(str(b.get("text", "")))
            elif kind == "tool_use":
                calls.append({"id": b.get("id") or f"toolu_{j}", "type": "function",
                              "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input", {}))}})
            elif kind == "tool_result":
                out = b.get("content", "")
                out = _text_of(out, f"{where}.content[{j}].content") if not isinstance(out, str) else out
                if b.get("is_error"):
                    out = f"Error: {out}"
                results.append({"role": "tool", "tool_call_id": b.get("tool_use_id", ""), "content": out})
            elif kind in ("thinking", "redacted_thinking"):
                thinking.append(str(b.get("thinking", "")))
            elif kind in ("image", "document"):
                raise APIError(500, f"{where}.content[{j}]: image input is not supported by this model "
                                    f"(it reads text only)", code="unsupported")
            else:
                raise bad(f"{where}.content[{j}]", f"unsupported content block type {kind!r}")
        if m["role"] == "assistant":
            msg = {"role": "assistant", "content": "\n".join(text)}
            if calls:
                msg["tool_calls"] = calls
            if thinking:
                msg["reasoning_content"] = "\n".join(thinking)
            msgs.append(msg)
        else:
            msgs += results
            if text or not results:
                msgs.append({"role": "user", "content": "\n".join(text)})
    if not any(m["role"] != "system" for m in msgs):   # llama-server is permissive: an empty conversation
        msgs.append({"role": "user", "content": ""})
    return msgs


def _chat_body(body: dict) -> dict:
    """The chat-completion fields of an Anthropic request."""
    out = {k: body[k] for k in ("temperature", "top_p", "top_k", "seed", "stream", "min_p") if k in body}
    if "max_tokens" in body:
        out["max_tokens"] = body["max_tokens"]
    if body.get("stop_sequences"):
        out["stop"] = body["stop_sequences"]
    out["messages"] = to_chat(body)
    return out


def _tool_plan(llm, body: dict, g=None):
    """Anthropic's tools and tool_choice ({"type": "auto" | "any" | "tool" | "none", "name",
    "disable_parallel_tool_use"}) as a ToolPlan (chat_route.tool_plan)."""
    from .chat_route import tool_plan
    choice = body.get("tool_choice")
    parallel = not (isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True)
    return tool_plan(llm, {"tools": body.get("tools"), "tool_choice": choice, "parallel_tool_calls": parallel}, g)


def _template_args(state, llm, body: dict, chat: dict, plan=None) -> tuple[list[dict], dict]:
    msgs = params.messages(chat)
    kwargs = {}
    if plan is None:
        plan = _tool_plan(llm, body)
    if plan is not None:
        msgs = plan.messages(msgs)
        kwargs["tools"] = plan.tools
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "disabled"):
        kwargs["enable_thinking"] = thinking["type"] == "enabled"
    else:
        kwargs["enable_thinking"] = state.settings.reasoning != "off"
    return msgs, kwargs


async def count_tokens(request: Request) -> Response:
    state = request.app.state.pd
    llm = state.model()
    body = await read_json(request, state.max_body)
    msgs, kwargs = _template_args(state, llm, body, _chat_body(body))
    try:
        ids = await run_in_threadpool(llm.chat_tokens, msgs, **kwargs)
    except (TemplateError, ValueError) as e:
        raise APIError(400, f"messages: {e}", param="messages", code="invalid_messages") from None
    return JSONResponse({"input_tokens": len(ids)})


async def messages(request: Request) -> Response:
    state, llm, body = await begin(request)
    chat = _chat_body(body)
    g = openai_generation(state, llm, chat, chat=True, default_max_tokens=None)
    plan = _tool_plan(llm, body, g)
    msgs, kwargs = _template_args(state, llm, body, chat, plan)
    ids, _, fmt, opened = await rendered_prompt(state, llm, msgs, kwargs, "messages")
    tools_after_reasoning(llm, plan, g, fmt, opened)
    handles = await submit(state, llm, [ids], g, "messages")
    tools = plan is not None
    msg_id, model = f"msg_{uuid.uuid4().hex}", body.get("model") or state.model_id

    def usage(c, out_tokens=None):
        return {"input_tokens": c.stats.prompt_tokens - c.stats.cached_tokens if c else len(ids),
                "cache_read_input_tokens": c.stats.cached_tokens if c else 0, "cache_creation_input_tokens": 0,
                "output_tokens": len(c.tokens) if out_tokens is None else out_tokens}

    def stop_of(c, has_calls):
        if has_calls:
            return "tool_use", None
        if c.stop_detail.startswith("stop string "):
            return "stop_sequence", c.stop_detail[len("stop string "):].strip("'\"")
        return STOP.get(c.finish_reason, "end_turn"), None

    if not g.stream:
        await _finished(state, request, handles)
        c = handles[0].completion
        reasoning, answer = split_reasoning(c.text, fmt, opened)
        answer, calls = plan.parse(answer) if tools else (answer, [])
        content = []
        if reasoning:
            content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
        if answer or not calls:
            content.append({"type": "text", "text": answer})
        for call in calls:
            content.append({"type": "tool_use", "id": "toolu_" + call["id"][5:], "name": call["function"]["name"],
                            "input": json.loads(call["function"]["arguments"])})
        reason, seq = stop_of(c, bool(calls))
        return JSONResponse({"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": content,
                             "stop_reason": reason, "stop_sequence": seq, "usage": usage(c)})

    def event(kind, data) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n".encode()

    async def stream():
        yield event("message_start", {"message": {"id": msg_id, "type": "message", "role": "assistant", "model": model,
                                                  "content": [], "stop_reason": None, "stop_sequence": None,
                                                  "usage": {"input_tokens": len(ids), "output_tokens": 0}}})
        splitter = ReasoningSplitter(fmt, opened)
        index, open_kind = -1, None
        reader = plan.stream() if tools else None   # tool calls read as they stream

        def block(kind):
            nonlocal index, open_kind
            out = []
            if open_kind is not None:
                if open_kind == "thinking":
                    out.append(event("content_block_delta", {"index": index, "delta": {"type": "signature_delta",
                                                                                        "signature": ""}}))
                out.append(event("content_block_stop", {"index": index}))
            index += 1
            start = ({"type": "text", "text": ""} if kind == "text" else
                     {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else kind)
            open_kind = kind if isinstance(kind, str) else "tool_use"
            out.append(event("content_block_start", {"index": index, "content_block": start}))
            return out

        def calls(deltas):
            out = []
            for d in deltas:
                if d[0] == "content":
                    out += parts([("content", d[1])], direct=True)
                elif d[0] == "call":
                    out += block({"type": "tool_use", "id": "toolu_" + d[2][5:], "name": d[3], "input": {}})
                else:
                    out.append(event("content_block_delta", {"index": index, "delta": {
                        "type": "input_json_delta", "partial_json": d[2]}}))
            return out

        def parts(pairs, direct=False):
            out = []
            for kind, text in pairs:
                if not text:
                    continue
                if kind != "reasoning" and tools and not direct:
                    out += calls(reader.feed(text))
                    continue
                k = "thinking" if kind == "reasoning" else "text"
                if open_kind != k:
                    out += block(k)
                delta = {"type": "thinking_delta", "thinking": text} if k == "thinking" else \
                    {"type": "text_delta", "text": text}
                out.append(event("content_block_delta", {"index": index, "delta": delta}))
            return out

        async for _, c in text_chunks(handles):
            if isinstance(c, APIError):
                yield event("error", {"error": {"type": c.type, "message": c.message}})
                return
            if isinstance(c, str):
                for e in parts(splitter.flush()):
                    yield e
                break
            for e in parts(splitter.feed("".join(p.text for p in c))):
                yield e
        comp = handles[0].completion
        if tools:
            for e in calls(reader.finish()):
                yield e
        if open_kind is None:
            for e in block("text"):
                yield e
        yield event("content_block_stop", {"index": index})
        reason, seq = stop_of(comp, bool(reader and reader.calls)) if comp is not None else ("end_turn", None)
        yield event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": seq},
                                      "usage": {"output_tokens": len(comp.tokens) if comp else 0}})
        yield event("message_stop", {})

    return EventStream(stream(), on_close=lambda: _ended(state, handles))


def routes():
    from starlette.routing import Route
    return [Route("/v1/messages", messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", count_tokens, methods=["POST"])]
