"""POST /v1/chat/completions (and /chat/completions): a conversation through the model's chat
template (or --chat-template), generated on the Engine, answered in OpenAI's shape, streamed or
not, with llama-server's extras: an assistant message last is a prefill the answer continues
(continue_final_message), tools rendered by the template and parsed back into tool_calls,
timings (timings_per_token), prompt_progress (return_progress), __verbose (verbose)."""
from __future__ import annotations

import json
from datetime import datetime

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import openai_format as oai
from ..chat.reasoning import ReasoningSplitter, assistant_message, opens_reasoning, split_reasoning
from ..chat.templates import TemplateError
from . import params
from .app import _finished, _streamed, _usage, check_model, openai_generation, read_json, submit
from ..chat import tools as tool_calls
from .chat_tools import template_tools
from .native import Progress, timings
from .params import APIError, bad
from .state import ServerState
from .streams import DONE, sse, text_chunks


def tool_plan(llm, body: dict, g: params.Generation | None = None):
    """The request's tools (chat/tools.py): None when it offers none or tool_choice is "none";
    with g, the answer is generated under the plan's grammar (the calls always parse)."""
    try:
        plan = tool_calls.plan(llm.tokenizer, llm.template, template_tools(body), body.get("tool_choice"),
                               body.get("parallel_tool_calls"))
    except ValueError as e:
        raise bad("tool_choice", str(e)) from None
    if plan is not None and g is not None:
        if g.structure:
            raise bad("tools", f"cannot be combined with {', '.join(sorted(g.structure))}: the answer is held to "
                      f"the tool-call syntax (set tool_choice to \"none\" for structured text)")
        g.structure = {"grammar": plan.grammar}
    return plan


def template_args(state: ServerState, body: dict, plan=None) -> tuple[list[dict], dict, str]:
    """(messages, template variables, prefill): the template's inputs for a chat request (tools
    unless tool_choice is "none", taught by a system message where the template has no tool
    syntax; --reasoning or chat_template_kwargs for thinking) and the text of a final assistant
    message the answer continues ("" when there is none)."""
    msgs = params.messages(body)
    if plan is not None:
        msgs = plan.messages(msgs)
    kwargs = params.template_kwargs(body)
    tools = template_tools(body) if body.get("tool_choice") != "none" else None
    if tools:
        kwargs["tools"] = tools
    reasoning = state.settings.reasoning
    if "enable_thinking" not in kwargs:   # (auto: the template's thinking stays on, as llama-server passes it)
        kwargs["enable_thinking"] = reasoning != "off"
    now = datetime.now()   # the date variables llama-server gives every template (Llama 3.x shows today's)
    kwargs.setdefault("date_string", now.strftime("%d %b %Y"))
    kwargs.setdefault("datetime", now.strftime("%b %d %Y"))
    # FireFunction-style templates read the tool list as a JSON text named `functions`.
    kwargs.setdefault("functions", json.dumps([t["function"] for t in tools or []], ensure_ascii=False, indent=2))
    add = params.flag(body, "add_generation_prompt", True)
    cont = body.get("continue_final_message")
    if cont is not None and not isinstance(cont, bool):
        raise bad("continue_final_message", f"must be true or false, got {cont!r}")
    if cont and "add_generation_prompt" in body and add:
        raise bad("continue_final_message", "cannot be combined with add_generation_prompt: true (the answer either "
                  "continues the last message or starts a new one)")
    prefill = ""
    if msgs[-1]["role"] == "assistant" and cont is not False:
        if len(msgs) > 1 and msgs[-2]["role"] == "assistant":
            raise bad("messages", "cannot end with two assistant messages")
        prefill = msgs[-1]["content"]
        msgs = msgs[:-1]
        if not msgs:
            raise bad("messages", "an assistant message alone has nothing to answer")
    elif cont:
        raise bad("continue_final_message", "needs an assistant message last")
    return msgs, kwargs, prefill


def prompt_of(llm, msgs, kwargs, prefill: str) -> tuple[list[int], str]:
    """The prompt's token ids and text (the prefill appended after the generation prompt)."""
    text = llm.chat_prompt(msgs, **kwargs) + prefill
    if not prefill:
        return llm.chat_tokens(msgs, **kwargs), text
    ids = llm.tokenizer.encode(text, add_special=False, parse_special=True)
    bos = llm.tokenizer.bos_id
    if llm.tokenizer.add_bos and bos is not None and (not ids or ids[0] != bos):
        ids = [bos] + ids
    return ids, text


async def rendered_prompt(state, llm, msgs, kwargs, param: str, prefill: str = ""):
    """(the prompt's token ids, rendered off the event loop; its text; the reasoning format its answer is
    split by, or None; whether the prompt opens a reasoning block itself, so the answer starts
    inside it). A template's refusal is a 400 naming `param`. One place for every chat route."""
    fmt = llm.reasoning_format if state.settings.reasoning_format != "none" else None
    try:
        ids, text = await run_in_threadpool(prompt_of, llm, msgs, kwargs, prefill)
        opened = fmt is not None and opens_reasoning(text, fmt)
    except (TemplateError, ValueError) as e:
        raise APIError(400, f"{param}: {e}", param=param, code="invalid_messages") from None
    return ids, text, fmt, opened


def tools_after_reasoning(llm, plan, g, fmt, opened) -> None:
    """A prompt that leaves a reasoning block open (Qwen3.5's `<think>\n`) is answered with the
    reasoning first: the tool grammar then lets the answer reason up to the block's end."""
    if plan is not None and opened and plan.reasoning_first(llm.tokenizer, fmt) and g is not None:
        g.structure = {"grammar": plan.grammar}


async def chat_completions(request: Request) -> Response:
    state: ServerState = request.app.state.pd
    llm = state.model()
    body = await read_json(request, state.max_body)
    check_model(state, body)
    g = openai_generation(state, llm, body, chat=True, default_max_tokens=None)
    plan = tool_plan(llm, body, g)
    msgs, kwargs, prefill = template_args(state, body, plan)
    ids, text, fmt, opened = await rendered_prompt(state, llm, msgs, kwargs, "messages", prefill)
    tools_after_reasoning(llm, plan, g, fmt, opened)
    slot = params._int(body, "id_slot", -1, lo=-1, hi=llm.engine.model.n_seq - 1)
    progress = Progress(lambda: None) if g.stream and body.get("return_progress") else None
    extra = {"slot": None if slot < 0 else slot}
    if progress is not None:
        extra["on_prefill"] = progress
    handles = await submit(state, llm, [ids], g, "messages", extra)
    model, tok = body.get("model") or state.model_id, llm.tokenizer
    tools = plan is not None
    verbose = body.get("verbose") is True or (state.settings.verbose and body.get("verbose") is not False)
    per_token = bool(body.get("timings_per_token"))

    def logprobs(pieces):
        return oai.chat_logprobs(tok, pieces, g.logprobs) if g.logprobs is not None else None

    if g.stream:
        head = oai.head("chat.completion.chunk", model)
        # A reasoning model's text is split as it streams: deltas of reasoning_content, then content.
        splitters = [ReasoningSplitter(fmt, opened) for _ in handles]
        readers = [plan.stream() if tools else None for _ in handles]   # calls read as they stream

        def chunk(k, delta, lp=None, finish=None, extra=None):
            out = {**head, "system_fingerprint": state.fingerprint,
                   "choices": [{"index": k, "delta": delta, "logprobs": lp, "finish_reason": finish}]}
            if per_token and k < len(handles) and "role" not in delta:
                h = handles[k]
                out["timings"] = timings(h.completion) if h.completion else timings(None, (len(h.prompt), 0, 0.0))
            return sse({**out, **(extra or {})})

        def deltas(k, parts, lp=None):
            if tools:   # the answer's text goes through the call reader: content, calls, arguments
                out = []
                for kind, text in parts:
                    out += ([chunk(k, oai.chat_delta(kind, text))] if kind == "reasoning" else
                            [chunk(k, oai.tool_delta(d)) for d in readers[k].feed(text)])
                if lp is not None:
                    out.append(chunk(k, {"content": ""}, lp))
                return out
            out = [chunk(k, oai.chat_delta(kind, text)) for kind, text in parts]
            if lp is not None:   # a token's logprobs go out even when it adds no text (a marker)
                out = out[:-1] + [chunk(k, oai.chat_delta(*parts[-1]) if parts else {"content": ""}, lp)]
            return out

        def progress_events():
            out = []
            if progress is not None:
                if progress.cache is None:
                    progress.first(handles[0].stats.cached_tokens, len(handles[0].prompt))
                while progress.events:
                    done, total, ms = progress.events.pop(0)
                    out.append(sse({**head, "choices": [], "prompt_progress": {
                        "total": total, "cache": progress.cache, "processed": done, "time_ms": ms},
                        "timings": timings(None, (done, progress.cache, ms))}))
            return out

        async def stream():
            yield chunk(0, {"role": "assistant", "content": None})
            for k in range(1, len(handles)):
                yield chunk(k, {"role": "assistant", "content": None})
            async for k, c in text_chunks(handles):
                for e in progress_events():
                    yield e
                if isinstance(c, APIError):
                    yield sse(c.body())
                elif isinstance(c, str):
                    for out in deltas(k, splitters[k].flush()):
                        yield out
                    if tools:
                        for d in readers[k].finish():
                            yield chunk(k, oai.tool_delta(d))
                        c = tool_calls.finish_reason(c, handles[k].completion, readers[k].calls)
                    yield chunk(k, {}, finish=c)
                else:
                    for out in deltas(k, splitters[k].feed("".join(p.text for p in c)), logprobs(c)):
                        yield out
            for e in progress_events():
                yield e
            if g.include_usage or per_token:
                last = {**head, "choices": [], "usage": _usage(handles, g.n)}
                if per_token and handles[0].completion is not None:
                    last["timings"] = timings(handles[0].completion)
                yield sse(last)
            yield DONE

        return _streamed(state, handles, stream())

    pieces = await _finished(state, request, handles)
    choices = []
    for k, (h, ps) in enumerate(zip(handles, pieces)):
        msg = assistant_message(*split_reasoning(h.completion.text, fmt, opened))
        finish = oai.finish_reason(h.completion.finish_reason)
        if tools:
            answer, calls = plan.parse(msg.get("content") or "")
            if calls:
                msg.update(content=answer or None, tool_calls=calls)
                finish = tool_calls.finish_reason(finish, h.completion, len(calls))
        choices.append({"index": k, "message": msg, "logprobs": logprobs(ps), "finish_reason": finish})
    out = {**oai.head("chat.completion", model), "system_fingerprint": state.fingerprint,
           "choices": choices, "usage": _usage(handles, g.n), "timings": timings(handles[0].completion)}
    if verbose:
        out["__verbose"] = {"prompt": text, "prompt_tokens": ids}
    return JSONResponse(out)

