"""`pydecode serve`'s HTTP routes (Starlette): OpenAI's completions and chat completions, models,
health, metrics, tokenize / detokenize.

Every generation is an Engine submission (llm.stream); the Engine's driver thread steps the
whole batch, and the event loop only waits for pieces (Handle.take / set_waker), so one slow or
vanished client never holds up the others. A request that ends early (its client disconnects,
or the server shuts down) cancels its sequences at the next step, which frees their slots.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import re

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import constraint
from .. import openai_format as oai
from ..chat.reasoning import ReasoningSplitter, assistant_message, opens_reasoning, split_reasoning
from ..chat.templates import TemplateError
from ..errors import ContextFullError, ModelClosedError, ModelError, QueueFullError
from ..sampling import SamplingParams
from . import params
from .params import APIError, bad
from .state import ServerState
from .streams import DONE, ClientGone, EventStream, collect, failure, sse, text_chunks

PUBLIC = ("/health",)      # answered without the API key


# ---------------------------------------------------------------- reading requests

async def read_json(request: Request, cap: int) -> dict:
    """The body as a JSON object, read up to `cap` bytes (413 beyond: a huge body is refused
    before it is all held in memory)."""
    size = request.headers.get("content-length", "")
    if size.isdigit() and int(size) > cap:
        raise APIError(413, f"the request body is {int(size)} bytes; this server takes at most {cap} "
                            f"(--max-body)", code="body_too_large")
    chunks, n = [], 0
    parts = request.stream()
    while True:
        try:   # a client that stops sending mid-body is let go (as one slow with its headers is)
            chunk = await asyncio.wait_for(parts.__anext__(), request.app.state.pd.read_timeout)
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            raise APIError(408, f"the request body stopped arriving (nothing for {request.app.state.pd.read_timeout:g} s, "
                                f"--timeout)", code="request_timeout") from None
        n += len(chunk)
        if n > cap:
            raise APIError(413, f"the request body is over {cap} bytes (--max-body)", code="body_too_large")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        body = json.loads(raw)
    except RecursionError:   # Python's parser recurses per level: ~1000 levels is its stack
        raise APIError(400, "the request body nests objects and arrays too deep to parse (about 1000 levels; "
                            "no request of this API needs more than 128)", code="invalid_json") from None
    except ValueError as e:   # bad JSON, bad UTF-8
        raise APIError(400, f"the request body is not valid JSON: {str(e)[:200]}", code="invalid_json") from None
    _refuse_lone_surrogates(raw, body)
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}",
                       code="invalid_json")
    return body


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _refuse_lone_surrogates(raw: bytes, body) -> None:
    """JSON's "\\ud800" escape parses to a str no encoder takes (every later step would fail on
    it: the tokenizer, the template, the reply): 400 here, for every field at once. Raw UTF-8
    cannot hold a surrogate (json.loads refused it), so only a body with such an escape is
    checked, by encoding it back (its pairs are fine: they parse to one character)."""
    if not _SURROGATE_ESCAPE.search(raw):
        return
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise APIError(400, "the request body is nested too deeply", code="invalid_json") from None
    except UnicodeEncodeError as e:
        raise APIError(400, f"the request body is not valid text: a string holds a lone surrogate "
                            f"({e.object[e.start:e.end]!r}), which is not a Unicode character",
                       code="invalid_json") from None


def check_model(state: ServerState, body: dict) -> None:
    name = body.get("model")
    if name is None:
        return
    if not isinstance(name, str):
        raise bad("model", f"must be a string, got {name!r}")
    if name not in state.names:
        raise APIError.unknown_model(name, state.model_id)


# The request fields an Engine.submit ValueError may name: the sampler's and the policy's.
FIELDS = set(SamplingParams.__dataclass_fields__) | {"max_tokens", "stop", "logprobs", "ignore_eos",
                                                     "response_format", "json_schema", "grammar"}


def _param_of(e: ValueError) -> str | None:
    """The request field an API ValueError names (its messages start with it: 'top_p must ...')."""
    word = str(e).split(" ", 1)[0].split(".", 1)[0]   # "response_format.type must ..." too
    return word if word in FIELDS else None


async def submit(state: ServerState, llm, prompts: list[list[int]], g: params.Generation, what: str) -> list:
    """Queues n sequences per prompt; on any refusal, none stays queued. The grammar (if any)
    is converted and checked first, off the event loop (it may take seconds)."""
    e = llm.engine
    wanted, room = len(prompts) * g.n, e.max_seqs + (e.max_queue if e.max_queue is not None else 1 << 62)
    if wanted > room:   # a 429 would never turn into a success
        raise APIError(400, f"{what}: this request asks for {wanted} sequences ({len(prompts)} prompt(s) x n={g.n}); "
                            f"this server holds at most {room} at once ({e.max_seqs} slots (--n-seq) + "
                            f"{e.max_queue} queued (--max-queue))", param="prompt" if what == "prompt" else "n",
                       code="too_many_sequences")
    structure = await _compiled(state, llm, g.structure)
    handles = []
    try:
        for ids in prompts:
            max_tokens = g.max_tokens or llm.n_ctx   # no limit given: the full context ends it
            for i in range(g.n):
                handles.append(e.submit(ids, max_tokens, stop=g.stop, logprobs=g.logprobs,
                                        ignore_eos=g.ignore_eos, **structure,
                                        **{**g.sampling, "seed": g.seed(i)}))
    except BaseException as err:
        _cancel(handles)
        refusal = _refusal(err, what)
        if refusal is None:
            raise
        raise refusal from None
    state.live.update(handles)
    return handles


async def _compiled(state: ServerState, llm, structure: dict) -> dict:
    """The request's structured-output keywords as one checked grammar, converted and checked in
    the server's grammar threads within its time budget (the thread of a grammar over budget
    runs on to its end, bounded by constraint's size limits, but nothing waits for it)."""
    if not structure:
        return {}
    try:
        job = state.grammar_threads.submit(constraint.prepare, llm.tokenizer, **structure)
    except RuntimeError:   # shut down meanwhile
        raise APIError.shutting_down() from None
    try:
        return {"grammar": await asyncio.wait_for(asyncio.wrap_future(job), state.grammar_budget_s)}
    except asyncio.TimeoutError:
        name = next(iter(structure))
        raise APIError(400, f"{name}: converting and checking it took more than {state.grammar_budget_s:g} s "
                            f"(this server's limit); give a smaller one", param=name,
                       code="grammar_too_complex") from None
    except (ValueError, TypeError) as err:
        raise APIError(400, str(err), param=_param_of(err), code="invalid_value") from None


def _refusal(e: BaseException, what: str) -> APIError | None:
    """The HTTP error for what Engine.submit raised (None: not a refusal, let it through)."""
    if isinstance(e, QueueFullError):
        return APIError(429, f"the server is busy: {e}; retry later", code="queue_full")
    if isinstance(e, ContextFullError):
        return APIError(400, f"{what}: {e}", param=what, code="context_length_exceeded")
    if isinstance(e, ModelClosedError):
        return APIError.shutting_down()
    if isinstance(e, ModelError):        # the model file changed under it: nothing here can run
        return APIError(500, str(e), code="model_failed")
    if isinstance(e, (ValueError, TypeError)):
        return APIError(400, str(e), param=_param_of(e), code="invalid_value")
    return None


def _cancel(handles) -> None:
    for h in handles:
        h.cancel()


# ---------------------------------------------------------------- the OpenAI routes

async def completions(request: Request) -> Response:
    state: ServerState = request.app.state.pd
    llm = state.model()
    body = await read_json(request, state.max_body)
    check_model(state, body)
    g = params.generation(body, chat=False, default_max_tokens=16)   # OpenAI's default for completions
    echo = params.flag(body, "echo", False)
    if body.get("suffix"):
        raise bad("suffix", "insertion (fill in the middle) is not supported by this server", "unsupported")
    given = params.prompts(body, llm.model.n_vocab)
    ids = await run_in_threadpool(lambda: [llm.tokenize(p) if isinstance(p, str) else p for p in given])
    texts = await run_in_threadpool(lambda: [p if isinstance(p, str) else llm.detokenize(p) for p in given]) \
        if echo else None
    handles = await submit(state, llm, ids, g, "prompt")
    model, tok = body.get("model") or state.model_id, llm.tokenizer

    def choice(k, text, lp, finish):
        return {"text": text, "index": k, "logprobs": lp, "finish_reason": finish}

    def logprobs(pieces, offset):
        return oai.completion_logprobs(tok, pieces, g.logprobs, offset) if g.logprobs is not None else None

    if g.stream:
        head = oai.head("text_completion", model)

        async def stream():
            offsets = [len(texts[k // g.n]) if echo else 0 for k in range(len(handles))]
            if echo:
                for k in range(len(handles)):
                    yield sse({**head, "choices": [choice(k, texts[k // g.n], None, None)]})
            async for k, chunk in text_chunks(handles):
                if isinstance(chunk, APIError):
                    yield sse(chunk.body())
                elif isinstance(chunk, str):     # the finish reason
                    yield sse({**head, "choices": [choice(k, "", None, chunk)]})
                else:
                    text = "".join(p.text for p in chunk)
                    yield sse({**head, "choices": [choice(k, text, logprobs(chunk, offsets[k]), None)]})
                    offsets[k] += len(text)
            if g.include_usage:
                yield sse({**head, "choices": [], "usage": _usage(handles, g.n)})
            yield DONE

        return _streamed(state, handles, stream())

    pieces = await _finished(state, request, handles)
    choices = []
    for k, (h, ps) in enumerate(zip(handles, pieces)):
        prefix = texts[k // g.n] if echo else ""
        c = h.completion
        choices.append(choice(k, prefix + c.text, logprobs(ps, len(prefix)), oai.finish_reason(c.finish_reason)))
    return JSONResponse({**oai.head("text_completion", model), "system_fingerprint": state.fingerprint,
                         "choices": choices, "usage": _usage(handles, g.n)})


async def chat_completions(request: Request) -> Response:
    state: ServerState = request.app.state.pd
    llm = state.model()
    body = await read_json(request, state.max_body)
    check_model(state, body)
    g = params.generation(body, chat=True, default_max_tokens=None)
    msgs = params.messages(body)
    kwargs = params.template_kwargs(body)
    fmt = llm.reasoning_format
    try:
        ids = await run_in_threadpool(llm.chat_tokens, msgs, **kwargs)
        opened = fmt is not None and opens_reasoning(await run_in_threadpool(llm.chat_prompt, msgs, **kwargs), fmt)
    except (TemplateError, ValueError) as e:
        raise APIError(400, f"messages: {e}", param="messages", code="invalid_messages") from None
    handles = await submit(state, llm, [ids], g, "messages")
    model, tok = body.get("model") or state.model_id, llm.tokenizer

    def logprobs(pieces):
        return oai.chat_logprobs(tok, pieces, g.logprobs) if g.logprobs is not None else None

    if g.stream:
        head = oai.head("chat.completion.chunk", model)
        # A reasoning model's text is split as it streams: deltas of reasoning_content, then content.
        splitters = [ReasoningSplitter(fmt, opened) for _ in handles]

        def chunk(k, delta, lp=None, finish=None):
            return sse({**head, "system_fingerprint": state.fingerprint,
                        "choices": [{"index": k, "delta": delta, "logprobs": lp, "finish_reason": finish}]})

        def deltas(k, parts, lp=None):
            out = [chunk(k, oai.chat_delta(kind, text)) for kind, text in parts]
            if lp is not None:   # a token's logprobs go out even when it adds no text (a marker)
                out = out[:-1] + [chunk(k, oai.chat_delta(*parts[-1]) if parts else {"content": ""}, lp)]
            return out

        async def stream():
            for k in range(len(handles)):
                yield chunk(k, {"role": "assistant", "content": ""})
            async for k, c in text_chunks(handles):
                if isinstance(c, APIError):
                    yield sse(c.body())
                elif isinstance(c, str):
                    for out in deltas(k, splitters[k].flush()):
                        yield out
                    yield chunk(k, {}, finish=c)
                else:
                    for out in deltas(k, splitters[k].feed("".join(p.text for p in c)), logprobs(c)):
                        yield out
            if g.include_usage:
                yield sse({**head, "choices": [], "usage": _usage(handles, g.n)})
            yield DONE

        return _streamed(state, handles, stream())

    pieces = await _finished(state, request, handles)
    choices = [{"index": k, "message": assistant_message(*split_reasoning(h.completion.text, fmt, opened)),
                "logprobs": logprobs(ps), "finish_reason": oai.finish_reason(h.completion.finish_reason)}
               for k, (h, ps) in enumerate(zip(handles, pieces))]
    return JSONResponse({**oai.head("chat.completion", model), "system_fingerprint": state.fingerprint,
                         "choices": choices, "usage": _usage(handles, g.n)})


def _usage(handles, n: int) -> dict:
    """Prompt tokens counted once per prompt (its n choices share it), completion tokens of all."""
    done = [h.completion for h in handles if h.completion is not None]
    firsts = [c for k, c in enumerate(done) if k % n == 0]
    return oai.usage(sum(c.stats.prompt_tokens for c in firsts), sum(len(c.tokens) for c in done),
                     sum(c.stats.cached_tokens for c in firsts))


def _ended(state: ServerState, handles) -> None:
    """A request's sequences are over, or abandoned (its client left): cancel what runs."""
    for h in handles:
        if not h.done:
            h.cancel("the client disconnected")
    state.settle(handles)


def _streamed(state: ServerState, handles, body) -> Response:
    return EventStream(body, on_close=lambda: _ended(state, handles))


async def _finished(state: ServerState, request: Request, handles) -> list[list]:
    try:
        pieces = await collect(request, handles)
    except ClientGone:
        raise APIError(499, "the client disconnected", code="client_disconnected") from None
    finally:
        _ended(state, handles)
    for h in handles:
        err = failure(h)
        if err is not None:
            raise err
    return pieces


# ---------------------------------------------------------------- the other routes

def _model_card(state: ServerState) -> dict:
    return {"id": state.model_id, "object": "model", "created": state.created, "owned_by": "pydecode"}


async def list_models(request: Request) -> Response:
    state: ServerState = request.app.state.pd
    return JSONResponse({"object": "list", "data": [_model_card(state)]})


async def get_model(request: Request) -> Response:
    state: ServerState = request.app.state.pd
    name = request.path_params["name"]
    if name not in state.names:
        raise APIError.unknown_model(name, state.model_id)
    return JSONResponse(_model_card(state))


async def health(request: Request) -> Response:
    state: ServerState = request.app.state.pd
    if state.status == "ok":
        e = state.llm.engine
        return JSONResponse({"status": "ok", "model": state.model_id, "active": e.n_active, "queued": e.n_queued,
                             "slots": e.max_seqs})
    if state.status == "error":
        return JSONResponse({"status": "error", "message": state.error}, 500)
    return JSONResponse({"status": state.status}, 503)


async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.pd
    return Response(state.metrics.text(), media_type=state.metrics.content_type)


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


# ---------------------------------------------------------------- the app

class Guard:
    """Outermost: the API key on every route but /health (compared in constant time), and each
    answer counted in /metrics by route and status."""

    def __init__(self, app, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = [500]

        async def counted(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            if self.state.api_key is not None and scope["path"] not in PUBLIC and scope["method"] != "OPTIONS" \
                    and not self._authorized(scope):
                err = APIError(401, "a valid API key is required: send the header 'Authorization: Bearer KEY'",
                               code="invalid_api_key")
                await JSONResponse(err.body(), 401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, counted)
            else:
                await self.app(scope, receive, counted)
        finally:
            self.state.metrics.count_request(scope["path"], status[0])

    def _authorized(self, scope) -> bool:
        given = b""
        for k, v in scope.get("headers", ()):
            if k == b"authorization":
                given = v
        scheme, _, key = given.partition(b" ")
        # compare_digest takes time independent of where the keys differ.
        return hmac.compare_digest(key.strip(), self.state.api_key) and scheme.lower() == b"bearer"


async def _api_error(request: Request, e: APIError) -> Response:
    if e.status == 499:
        return Response(status_code=499)
    # 408 / 413: the rest of the body was never read, so the connection cannot carry another
    # request; closing it frees the client at once (else it waits out the keep-alive, 5 s).
    return JSONResponse(e.body(), e.status, headers={"connection": "close"} if e.status in (408, 413) else None)


async def _http_error(request: Request, e: HTTPException) -> Response:
    if e.status_code == 404:
        msg, code = f"no route {request.method} {request.url.path}", "unknown_route"
    elif e.status_code == 405:
        msg, code = f"{request.url.path} does not take {request.method}", "method_not_allowed"
    else:
        msg, code = str(e.detail), None
    return JSONResponse(APIError(e.status_code, msg, code=code).body(), e.status_code, headers=e.headers)


async def _server_error(request: Request, e: Exception) -> Response:
    err = APIError(500, f"internal error: {type(e).__name__}: {e}", code="internal_error")
    return JSONResponse(err.body(), 500)


def create_app(state: ServerState, cors_origins=()):
    """The ASGI application over `state` (its model may load later: see ServerState.ready)."""
    from starlette.middleware import Middleware
    from starlette.middleware.cors import CORSMiddleware

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{name:path}", get_model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
    ]
    middleware = [Middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["*"],
                             allow_headers=["*"])] if cors_origins else []
    app = Starlette(routes=routes, middleware=middleware,
                    exception_handlers={APIError: _api_error, HTTPException: _http_error, Exception: _server_error})
    app.state.pd = state
    return Guard(app, state)
