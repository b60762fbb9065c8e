"""Outermost layer of `pydecode serve`: the API key, CORS, the request count in /metrics, the
idle timer of --sleep-idle-seconds, and the error answers' shapes."""
from __future__ import annotations

import hmac
import time

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .params import APIError
from .state import ServerState

PUBLIC = ("/health", "/v1/health")   # answered without the API key
# Routes that do not count as activity for --sleep-idle-seconds (monitoring reads them).
# Reads not counted in pydecode_requests_total (a scrape or a health poll would change what it reads).
UNCOUNTED = ("/health", "/v1/health", "/props", "/metrics")
PASSIVE = ("/health", "/v1/health", "/props", "/metrics", "/models", "/v1/models", "/slots")
CORS_METHODS = "GET, POST, DELETE, OPTIONS"


class Guard:
    """The API key on every route but /health (compared in constant time; `Authorization:
    Bearer KEY` or Anthropic's `X-Api-Key: KEY`), CORS for browser pages (Settings.cors_allows),
    and each answer counted in /metrics by route and status."""

    def __init__(self, app, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = [500]
        headers = dict(scope.get("headers", ()))
        origin = headers.get(b"origin", b"").decode("latin-1")
        cors = []
        if origin and self.state.settings.cors_allows(origin, bool(self.state.api_keys)):
            # (title case, as llama-server sends them: some clients compare header names exactly)
            cors = [(b"Access-Control-Allow-Origin", origin.encode("latin-1")),
                    (b"Access-Control-Allow-Credentials", b"true"), (b"Vary", b"Origin")]

        async def counted(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                if cors:
                    message = {**message, "headers": list(message.get("headers", [])) + cors}
            await send(message)

        path = scope["path"]
        active = path not in PASSIVE   # (monitoring neither wakes the server nor keeps it awake)
        try:
            if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
                extra = [(b"Access-Control-Allow-Methods", CORS_METHODS.encode()),
                         (b"Access-Control-Allow-Headers", b"*"), (b"Access-Control-Max-Age", b"600")] if cors else []
                await counted({"type": "http.response.start", "status": 200,
                               "headers": [(b"content-length", b"0")] + extra})
                await counted({"type": "http.response.body", "body": b""})
            elif self.state.api_keys and path not in PUBLIC and scope["method"] != "OPTIONS" \
                    and not self._authorized(headers):
                err = APIError(401, "a valid API key is required: send the header 'Authorization: Bearer KEY' "
                                    "(or 'X-Api-Key: KEY')", code="invalid_api_key")
                await JSONResponse(err.body(), 401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, counted)
            elif not active:
                await self.app(scope, receive, counted)
            else:
                self.state.touch()
                self.state.busy += 1
                try:
                    await self.state.wake()
                    await self.app(scope, receive, counted)
                finally:
                    self.state.busy -= 1
                    self.state.touch()   # (idle counts from the end of the last answer)
        finally:   # (monitoring reads are not counted: a scrape would change what it reads)
            if path not in UNCOUNTED:
                self.state.metrics.count_request(path, status[0])

    def _authorized(self, headers: dict) -> bool:
        scheme, _, key = headers.get(b"authorization", b"").partition(b" ")
        given = key.strip() if scheme.lower() == b"bearer" else headers.get(b"x-api-key", b"").strip()
        # compare_digest takes time independent of where the keys differ; every key is compared.
        ok = False
        for k in self.state.api_keys:
            ok |= hmac.compare_digest(given, k)
        return ok and bool(given)


async def api_error(request: Request, e: APIError) -> Response:
    if e.status == 499:
        return Response(status_code=499)
    # 408 / 413: the rest of the body was never read, so the connection cannot carry another
    # request; closing it frees the client at once (else it waits out the keep-alive, 5 s).
    return JSONResponse(e.body(), e.status, headers={"connection": "close"} if e.status in (408, 413) else None)


async def http_error(request: Request, e: HTTPException) -> Response:
    if e.status_code == 404:
        msg, code = f"no route {request.method} {request.url.path}", "unknown_route"
    elif e.status_code == 405:
        msg, code = f"{request.url.path} does not take {request.method}", "method_not_allowed"
    else:
        msg, code = str(e.detail), None
    return JSONResponse(APIError(e.status_code, msg, code=code).body(), e.status_code, headers=e.headers)


async def server_error(request: Request, e: Exception) -> Response:
    err = APIError(500, f"internal error: {type(e).__name__}: {e}", code="internal_error")
    return JSONResponse(err.body(), 500)


def now() -> float:
    return time.monotonic()
