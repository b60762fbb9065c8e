"""OpenAI's response shapes, made of pydecode's Pieces and Completions: written once for the two
places that speak them, llama-cpp-python's `Llama` (compat/llama.py) and `pydecode serve`
(pydecode/server/)."""
from __future__ import annotations

import time
import uuid


def finish_reason(reason: str) -> str:
    """OpenAI's finish_reason for a Completion's: "stop" (an end-of-generation token or a stop
    string) or "length" (max_tokens, a full context, or a generation cut short: cancelled, or a
    server shutting down)."""
    return "stop" if reason == "stop" else "length"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict:
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def head(kind: str, model: str) -> dict:
    """The fields every response and chunk of one request shares. kind: "text_completion",
    "chat.completion" or "chat.completion.chunk"."""
    prefix = "cmpl" if kind == "text_completion" else "chatcmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": model}


def forced(logprob):
    """A token a structured-output grammar forced was never scored by the model: under the
    constraint it was certain (log-probability 0)."""
    return 0.0 if logprob is None else logprob


def completion_logprobs(tokenizer, pieces, n: int, offset: int = 0) -> dict:
    """/v1/completions' logprobs of `pieces` (their tokens; text offsets counted from `offset`):
    each token's text, offset, log-probability and its n most likely alternatives."""
    out = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
    for p in pieces:
        if p.token < 0:    # the text released at the end, no token of its own
            offset += len(p.text)
            continue
        out["tokens"].append(tokenizer.decode([p.token]))
        out["text_offset"].append(offset)
        out["token_logprobs"].append(forced(p.logprob))
        out["top_logprobs"].append({tokenizer.decode([t]): lp for t, lp in (p.top_logprobs or [])[:n]})
        offset += len(p.text)
    return out


def chat_logprobs(tokenizer, pieces, n: int) -> dict:
    """/v1/chat/completions' logprobs of `pieces`: {"content": [each token's text, bytes,
    log-probability and its n most likely alternatives]}."""
    def entry(t, lp):
        return {"token": tokenizer.decode([t]), "logprob": forced(lp), "bytes": list(tokenizer.token_bytes(t))}

    return {"content": [{**entry(p.token, p.logprob),
                         "top_logprobs": [entry(t, lp) for t, lp in (p.top_logprobs or [])[:n]]}
                        for p in pieces if p.token >= 0]}


def chat_delta(kind: str, text: str) -> dict:
    """A streamed chunk's delta for a part of kind "reasoning" or "content" (chat/reasoning.py)."""
    return {"reasoning_content" if kind == "reasoning" else "content": text}


def tool_delta(d: tuple) -> dict:
    """A streamed chunk's delta for one of chat/tools.py's ToolStream deltas: text, a call's
    head (index, id, name: its arguments start empty), or a fragment of its arguments."""
    if d[0] == "content":
        return {"content": d[1]}
    if d[0] == "call":
        return {"tool_calls": [{"index": d[1], "id": d[2], "type": "function",
                                "function": {"name": d[3], "arguments": ""}}]}
    return {"tool_calls": [{"index": d[1], "function": {"arguments": d[2]}}]}
