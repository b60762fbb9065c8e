"""Embeddings over HTTP (served with --embedding, else 501 as llama-server): OpenAI's
POST /v1/embeddings, and llama-server's native POST /embedding and /embeddings.

Shapes and errors are llama-server's (tools/server/server-context.cpp, handle_embeddings_impl):
- /v1/embeddings: {"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
  "model", "usage"}; encoding_format "base64" sends each vector as little-endian float32 bytes
  in base64, as OpenAI does. Pooling "none" (one vector per token) does not fit OpenAI's shape:
  400, with llama-server's message.
- /embedding, /embeddings (and a body with "content" instead of "input" on any route): a list of
  {"index", "embedding": [[...]]}, one vector per token with pooling none (not normalized, as
  llama-server), else the one pooled vector.
The vectors themselves are LLM.embed's (pydecode/embeddings.py), computed off the event loop.
"""
from __future__ import annotations

import base64

import numpy as np
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import embeddings
from ..errors import ContextFullError, ModelClosedError
from .app import begin
from .params import APIError, _is_int, bad


async def oai(request: Request) -> Response:
    return await _embeddings(request, oai=True)


async def native(request: Request) -> Response:
    return await _embeddings(request, oai=False)


async def _embeddings(request: Request, oai: bool) -> Response:
    if not request.app.state.pd.settings.embeddings:
        raise APIError(501, "This server does not support embeddings. Start it with `--embeddings`",
                       code="not_supported")
    state, llm, body = await begin(request)
    try:
        pooling = embeddings.resolve_pooling(llm.model, state.settings.pooling)
    except ValueError as e:   # a reranker's GGUF (rank pooling) without --pooling
        raise APIError(501, str(e), code="not_supported") from None
    if oai and pooling == "none":
        raise APIError(400, "Pooling type 'none' is not OAI compatible. Please use a different pooling type",
                       param="pooling", code="invalid_value")
    if "input" in body:
        given = body["input"]
    elif "content" in body:
        given, oai = body["content"], False   # llama-server: "content" is not OpenAI's, so its shape is native
    else:
        raise bad("input", '"input" or "content" must be provided', "missing")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise bad("encoding_format", f"must be 'float' or 'base64', got {fmt!r}")
    if body.get("dimensions") is not None and body["dimensions"] != llm.n_embd:
        raise bad("dimensions", f"this model's embeddings have {llm.n_embd} dimensions; shortening them "
                                f"(dimensions={body['dimensions']!r}) is not supported", "unsupported")
    norm = body.get("embd_normalize", 2)
    if not _is_int(norm) or norm < -1:
        raise bad("embd_normalize", f"must be an integer >= -1 (-1 none, 0 max-abs, 1 taxicab, 2 Euclidean, "
                                    f"p > 2 p-norm), got {norm!r}")
    if pooling == "none":
        norm = -1                         # llama-server normalizes pooled vectors only
    try:
        # Tokenizing and the forward passes take a while: off the event loop, as every model call.
        ids, vectors = await run_in_threadpool(_run, llm, given, pooling, norm)
    except ModelClosedError:
        raise APIError.shutting_down() from None
    except ContextFullError as e:
        raise APIError(400, str(e), param="input", code="invalid_value") from None
    if not oai:
        return JSONResponse([{"index": i, "embedding": (v if v.ndim == 2 else v[None]).tolist()}
                             for i, v in enumerate(vectors)])
    data = [{"object": "embedding", "index": i, "embedding": v.tolist()} if fmt == "float" else
            {"object": "embedding", "index": i, "encoding_format": "base64",
             "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()} for i, v in enumerate(vectors)]
    n = sum(map(len, ids))
    name = body.get("model") or state.model_id
    return JSONResponse({"object": "list", "data": data, "model": name,
                         "usage": {"prompt_tokens": n, "total_tokens": n}})


def _run(llm, given, pooling: str, norm: int) -> tuple[list[list[int]], list[np.ndarray]]:
    ids = inputs_of(llm, given)
    n_ctx = llm.n_ctx
    for i, x in enumerate(ids):
        if len(x) > n_ctx:   # llama-server's words ("too large"), our limit: the context
            e = APIError(400, f"input {i} ({len(x)} tokens) is too large to process: it exceeds the context size "
                              f"({n_ctx} tokens); shorten it or start the server with a larger -c",
                         param="input", code="context_length_exceeded", type="exceed_context_size_error")
            e.extra = {"n_prompt_tokens": len(x), "n_ctx": n_ctx}
            raise e
    return ids, llm.embed(ids, pooling=pooling, normalize=norm)


def inputs_of(llm, given) -> list[list[int]]:
    """llama-server's input forms: one prompt (a string, token ids, ids mixed with strings,
    {"prompt_string"} or {"content": [text parts]}), or a list of them; every one with tokens."""
    many = isinstance(given, list) and not any(_is_int(x) for x in given)
    if many and not given:
        raise bad("input", '"input" must not be empty')
    ids = [_prompt(llm, p, f"input[{i}]" if many else "input") for i, p in enumerate(given if many else [given])]
    for i, x in enumerate(ids):
        if not x:
            raise bad("input", f"Input content cannot be empty (input {i} has no tokens)")
    return ids


def _prompt(llm, p, name: str) -> list[int]:
    if isinstance(p, dict):
        if "content" in p:
            return llm.tokenize(_text_parts(p["content"], name))
        if p.get("multimodal_data"):
            raise bad(name, "multimodal_data: this model reads text only (no image or audio input)", "unsupported")
        p = p.get("prompt_string")
        if not isinstance(p, str):
            raise bad(name, "must hold a string prompt_string or a content list")
    if isinstance(p, str):
        return llm.tokenize(p)
    if isinstance(p, list) and all(isinstance(x, str) or _is_int(x) for x in p):
        out: list[int] = []
        for k, x in enumerate(p):   # ids as they are; strings tokenized, the first with BOS/EOS
            if isinstance(x, str):
                out += llm.tokenize(x, k == 0)
            elif not 0 <= x < llm.model.n_vocab:
                raise bad(name, f"token id {x} is outside the vocabulary (0..{llm.model.n_vocab - 1})")
            else:
                out.append(x)
        return out
    raise bad(name, "must be a string, token ids (and strings), {\"prompt_string\": ...}, "
                    "{\"content\": [{\"type\": \"text\", \"text\": ...}]}, or a list of those")


def _text_parts(content, name: str) -> str:
    """OpenAI's content parts, text only (this runtime reads no images or audio)."""
    if not isinstance(content, list):
        raise bad(name, '"content" must be an array of parts')
    text = ""
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise bad(name, f"content[{k}]: only text parts ({{\"type\": \"text\", \"text\": ...}}) are read here "
                            f"(this model reads no images, audio or video), got {part!r}"[:300], "unsupported")
        text += part["text"]
    return text
