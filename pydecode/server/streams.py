"""Waiting for a request's pieces on the event loop, and sending them as Server-Sent Events.

The Engine's driver thread steps; the loop never blocks on it: Handle.take() gives what is
ready and set_waker's callback (loop.call_soon_threadsafe) says when more is.
"""
from __future__ import annotations

import asyncio
import json

from starlette.requests import Request
from starlette.responses import StreamingResponse

from .. import openai_format as oai
from ..constraint import ConstraintError
from ..errors import ModelClosedError
from .params import APIError


async def events(handles):
    """(i, pieces) as handle i produces them, then (i, None) once it has ended; never blocks
    the event loop (the Engine's driver wakes it through set_waker)."""
    loop, ready = asyncio.get_running_loop(), asyncio.Event()

    def wake():
        loop.call_soon_threadsafe(ready.set)

    for h in handles:
        h.set_waker(wake)
    waiting = set(range(len(handles)))
    while waiting:
        ready.clear()
        for i in sorted(waiting):
            got, done = handles[i].take()
            if got:
                yield i, got
            if done:
                waiting.discard(i)
                yield i, None
        if waiting:
            await ready.wait()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


async def collect(request: Request, handles) -> list[list]:
    """Every piece of every handle, once all have ended; ClientGone if the client leaves first."""
    pieces = [[] for _ in handles]

    async def run():
        async for i, got in events(handles):
            if got:
                pieces[i] += got

    work, gone = asyncio.ensure_future(run()), asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            raise ClientGone
        work.result()
        return pieces
    finally:
        work.cancel()
        gone.cancel()


def failure(h) -> APIError | None:
    e = h.error
    if e is None:
        return None
    if isinstance(e, ModelClosedError):
        return APIError.shutting_down()
    if isinstance(e, ConstraintError):   # the request's grammar failed (too big, never matches): its fault
        return APIError(400, str(e), code="grammar_failed")
    return APIError(500, f"generation failed: {type(e).__name__}: {e}", code="generation_failed")


class EventStream(StreamingResponse):
    """Server-Sent Events; `on_close` runs however the response ends (done, client gone)."""

    media_type = "text/event-stream"

    def __init__(self, content, on_close):
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


async def text_chunks(handles):
    """What a stream sends of each choice k: (k, pieces) whenever they add text (pieces that
    add none, e.g. half a UTF-8 character, wait for the next, so their logprobs go with it),
    then (k, finish_reason), or (k, APIError) if its generation failed."""
    held = [[] for _ in handles]
    async for k, got in events(handles):
        if got is not None:
            held[k] += got
            if any(p.text for p in held[k]):
                yield k, held[k]
                held[k] = []
            continue
        if held[k]:
            yield k, held[k]
            held[k] = []
        err = failure(handles[k])
        yield k, err if err is not None else oai.finish_reason(handles[k].completion.finish_reason)
