"""The routes that generate nothing: models, health, metrics, tokenize / detokenize; and the
one that only wraps another: Vertex AI's /predict (embeddings: embeddings.py)."""
from __future__ import annotations

import json

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from . import params
from .app import read_json
from .params import APIError, bad
from .state import ServerState


def _model_card(state: ServerState) -> dict:
    s = state.settings
    return {"id": state.model_id, "object": "model", "created": state.created, "owned_by": "pydecode",
            "aliases": list(s.alias_names or (state.model_id,)), "tags": list(s.tags),
            "meta": _meta(state), "status": {"value": state.status if state.status != "ok" else "loaded"}}


def _meta(state: ServerState) -> dict | None:
    return state.meta if state.status == "ok" else None


async def list_models(request: Request) -> Response:
    state: ServerState = request.app.state.pd
    return JSONResponse({"object": "list", "data": [_model_card(state)]})


async def get_model(request: Request) -> Response:
    state: ServerState = request.app.state.pd
    name = request.path_params["name"]
    if name not in state.names and state.settings.strict_model:
        raise APIError.unknown_model(name, state.model_id)
    return JSONResponse(_model_card(state))


async def health(request: Request) -> Response:
    state: ServerState = request.app.state.pd
    if state.status == "ok":
        llm = state.llm
        if llm is None:   # asleep (--sleep-idle-seconds): ready, it loads again at the next request
            return JSONResponse({"status": "ok", "model": state.model_id, "active": 0, "queued": 0,
                                 "slots": state.shape[0], "sleeping": True})
        e = llm.engine
        return JSONResponse({"status": "ok", "model": state.model_id, "active": e.n_active, "queued": e.n_queued,
                             "slots": e.max_seqs})
    if state.status == "error":
        return JSONResponse({"status": "error", "message": state.error}, 500)
    return JSONResponse({"status": state.status}, 503)


async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.pd
    if not state.settings.metrics:
        raise APIError(501, "metrics are off: start the server with --metrics", code="not_supported")
    text = state.metrics.text() if not state.check_sleep() or state.metrics_snapshot is None else state.metrics_snapshot
    state.metrics_snapshot = None   # (asleep: the snapshot taken on falling asleep is sent once)
    r = Response(text, media_type=state.metrics.content_type)
    r.raw_headers.append((b"Process-Start-Time-Unix", str(int(state.started)).encode()))   # (llama-server's case)
    return r


async def tokenize(request: Request) -> Response:
    """llama-server's /tokenize: {"content", "add_special" (default true), "with_pieces"}."""
    state: ServerState = request.app.state.pd
    llm = state.model()
    body = await read_json(request, state.max_body)
    text = params.text_field(body, "content")
    add_special = params.flag(body, "add_special", True)
    with_pieces = params.flag(body, "with_pieces", False)
    # Tokenizing, and the answer's JSON, cost seconds on megabytes of text: off the event loop.
    return await run_in_threadpool(_tokenized, llm, text, add_special, with_pieces)


def _tokenized(llm, text: str, add_special: bool, with_pieces: bool) -> Response:
    ids = llm.tokenize(text, add_special)
    if not with_pieces:
        return _json_list("tokens", ids)
    pieces: dict[int, str] = {}   # each distinct token decoded once
    for t in ids:
        if t not in pieces:
            pieces[t] = llm.detokenize([t])
    return _json_list("tokens", [{"id": t, "piece": pieces[t]} for t in ids])


def _json_list(key: str, items: list, part: int = 4096) -> Response:
    """{key: items} as JSONResponse writes it, serialized a slice at a time: one json.dumps of a
    million items holds the GIL for 0.4 s, and the event loop (in another thread) waits with it."""
    dumps = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode
    body = ",".join(dumps(items[i:i + part])[1:-1] for i in range(0, len(items), part))
    return Response(f'{{{dumps(key)}:[{body}]}}'.encode(), media_type="application/json")


async def detokenize(request: Request) -> Response:
    state: ServerState = request.app.state.pd
    llm = state.model()
    body = await read_json(request, state.max_body)
    ids = params.tokens_field(body, "tokens", llm.model.n_vocab)
    return await run_in_threadpool(lambda: JSONResponse({"content": llm.detokenize(ids)}))


async def predict(request: Request) -> Response:
    """Vertex AI's prediction route: {"instances": [a chat completion request, ...]} ->
    {"predictions": [its answer, ...]}, each run as POST /v1/chat/completions."""
    from .app import chat_completions
    state: ServerState = request.app.state.pd
    body = await read_json(request, state.max_body)
    instances = body.get("instances")
    if not isinstance(instances, list) or not instances:
        raise bad("instances", "must be a non-empty list of requests")
    out = []
    for i, inst in enumerate(instances):
        if not isinstance(inst, dict):
            raise bad(f"instances[{i}]", "must be an object")
        fmt = inst.get("@requestFormat", "chatCompletions")
        if fmt != "chatCompletions":
            raise bad(f"instances[{i}].@requestFormat", f"only chatCompletions is served, got {fmt!r}")
        inner = {k: v for k, v in inst.items() if not k.startswith("@")}
        inner["stream"] = False
        res = await chat_completions(_Replay(request, inner))
        out.append(json.loads(res.body))
    return JSONResponse({"predictions": out})


class _Replay:
    """A Request whose body is a given object (the instances of /predict)."""

    def __init__(self, request: Request, body: dict):
        self._r, self._body = request, json.dumps(body).encode()
        self.app, self.headers = request.app, {"content-length": str(len(self._body))}

    async def stream(self):
        yield self._body

    async def receive(self):
        return await self._r.receive()
