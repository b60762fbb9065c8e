"""`pydecode serve`'s HTTP application (Starlette): reading requests, submitting them to the
Engine, OpenAI's completions route, and the route table (chat: chat_route.py; llama-server's
own routes: native.py; Anthropic's: anthropic.py; responses: responses.py; models, health,
metrics, tokenize: info.py; the API key and CORS: guard.py).

Every generation is an Engine submission (llm.stream); the Engine's driver thread steps the
whole batch, and the event loop only waits for pieces (Handle.take / set_waker), so one slow or
vanished client never holds up the others. A request that ends early (its client disconnects,
or the server shuts down) cancels its sequences at the next step, which frees their slots.
"""
from __future__ import annotations

import asyncio
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
    if name not in state.names and state.settings.strict_model:
        raise APIError.unknown_model(name, state.model_id)


async def begin(request: Request) -> tuple[ServerState, object, dict]:
    """What every generating route starts with: the state, the loaded model (or its 503), the
    request body read and checked as JSON, and its model name checked."""
    state: ServerState = request.app.state.pd
    llm = state.model()
    body = await read_json(request, state.max_body)
    check_model(state, body)
    return state, llm, body


# The request fields an Engine.submit ValueError may name: the sampler's and the policy's.
FIELDS = set(SamplingParams.__dataclass_fields__) | {"max_tokens", "stop", "logprobs", "ignore_eos",
                                                     "response_format", "json_schema", "grammar"}


def _param_of(e: ValueError) -> str | None:
    """The request field an API ValueError names (its messages start with it: 'top_p must ...')."""
    word = str(e).split(" ", 1)[0].split(".", 1)[0]   # "response_format.type must ..." too
    return word if word in FIELDS else None


def openai_generation(state: ServerState, llm, body: dict, chat: bool, default_max_tokens) -> params.Generation:
    """params.generation with the server's defaults (--temp, --seed, ...), its --n-predict cap
    and the request's logit_bias."""
    b = body
    if "n_predict" in body and "max_tokens" not in body:   # llama-server takes its name on every route
        b = {**body, "max_tokens": body["n_predict"] if body["n_predict"] >= 0 else None} \
            if params._is_int(body["n_predict"]) else body
    g = params.generation(b, chat=chat, default_max_tokens=default_max_tokens, defaults=state.settings.sampling)
    if g.max_tokens is None and state.settings.n_predict >= 0 and "max_tokens" not in b:   # --n-predict: the default
        g.max_tokens = state.settings.n_predict or None
    g.sampling["logit_bias"] = params.resolve_logit_bias(llm, body.get("logit_bias"))
    return g


def shift_of(state: ServerState, g: params.Generation) -> dict:
    """Engine.submit's context-shift keywords: under --context-shift, the request's n_keep
    (default --keep) and n_discard (default 0: half), as llama-server reads them."""
    if not state.settings.context_shift:
        return {}
    return dict(context_shift=True, n_keep=g.shift.get("n_keep", state.settings.keep),
                n_discard=g.shift.get("n_discard", 0))


async def submit(state: ServerState, llm, prompts: list[list[int]], g: params.Generation, what: str,
                 extra: dict | None = None) -> list:
    """Queues n sequences per prompt; on any refusal, none stays queued. The grammar (if any)
    is converted and checked first, off the event loop (it may take seconds). extra: more
    Engine.submit keywords (slot, on_prefill)."""
    e = llm.engine
    for ids in prompts:   # a prompt must leave room for a token (llama-server's check, its error's
        if len(ids) >= llm.n_ctx:   # shape; a context shift only ever drops generated context)
            raise APIError.context_exceeded(len(ids), llm.n_ctx, what)
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
                                        ignore_eos=g.ignore_eos, **structure, **shift_of(state, g),
                                        **(extra or {}),
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
        return APIError(400, f"{what}: {e}", param=what, code="context_length_exceeded",
                        type="exceed_context_size_error")
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
    g = openai_generation(state, llm, body, chat=False, default_max_tokens=16)   # OpenAI's default for completions
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
    from .chat_route import chat_completions as route   # (it imports this module)
    return await route(request)


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


# ---------------------------------------------------------------- the app

def create_app(state: ServerState, cors_origins=()):
    """The ASGI application over `state` (its model may load later: see ServerState.ready):
    OpenAI's routes (with and without /v1, as llama-server), llama-server's own (native.py),
    Anthropic's (anthropic.py), OpenAI's responses (responses.py); the API key and CORS
    outermost (guard.py)."""
    from . import anthropic, embeddings, guard, info, native, responses

    if cors_origins:
        state.settings.cors = tuple(cors_origins)
    routes = []
    for prefix in ("/v1", ""):
        routes += [Route(f"{prefix}/completions", completions, methods=["POST"]) if prefix else None,
                   Route(f"{prefix}/chat/completions", chat_completions, methods=["POST"]),
                   Route(f"{prefix}/models", info.list_models, methods=["GET"]),
                   Route(f"{prefix}/models/{{name:path}}", info.get_model, methods=["GET"]),
                   Route(f"{prefix}/health", info.health, methods=["GET"]),
                   # (/embeddings is llama-server's native shape, as there; /v1/embeddings OpenAI's)
                   Route(f"{prefix}/embeddings", embeddings.oai if prefix else embeddings.native, methods=["POST"])]
    routes = [r for r in routes if r is not None]
    routes += [Route("/metrics", info.metrics, methods=["GET"]),
               Route("/tokenize", info.tokenize, methods=["POST"]),
               Route("/detokenize", info.detokenize, methods=["POST"]),
               Route("/predict", info.predict, methods=["POST"]),
               Route("/embedding", embeddings.native, methods=["POST"])]
    routes += native.routes() + anthropic.routes() + responses.routes()
    app = Starlette(routes=routes, exception_handlers={APIError: guard.api_error, HTTPException: guard.http_error,
                                                       Exception: guard.server_error})
    app.state.pd = state
    return guard.Guard(app, state)
