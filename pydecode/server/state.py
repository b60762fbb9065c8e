"""What `pydecode serve`'s routes share: the model once it has loaded, the names it answers to,
the API key, the generations in flight, the metrics."""
from __future__ import annotations

import asyncio
import sys
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

from .. import __version__
from .metrics import Metrics
from .params import APIError

SHUTDOWN_DETAIL = "the server is shutting down"
GRAMMAR_BUDGET_S = 10.0   # the longest a request's grammar may take to convert and check
GRAMMAR_THREADS = 2       # grammars converted at once (more wait their turn, within the budget)


class ServerState:
    """What the routes share: the model once loaded, its names, the API key, the generations in
    flight (ended at shutdown), the metrics."""

    def __init__(self, model_id: str, aliases=(), api_key=None, max_body: int = 8 << 20,
                 read_timeout: float = 60.0, settings=None):
        from .settings import Settings
        self.settings = settings or Settings(aliases=tuple(aliases))
        self.model_id = model_id
        self.names = {model_id, *aliases}
        self.llm = None
        self.status = "loading"          # loading -> ok -> shutting down; or error
        self.error: str | None = None
        keys = [api_key] if isinstance(api_key, str) else list(api_key or ())
        self.api_keys = [k.encode() for k in keys if k]   # any of them opens every route but /health
        self.api_key = self.api_keys[0] if self.api_keys else None
        self.max_body = max_body
        self.read_timeout = read_timeout  # seconds between parts of a request body (408 beyond)
        self.created = int(time.time())
        self.started = time.time()       # (llama-server's Process-Start-Time-Unix header on /metrics)
        self.last_request = time.monotonic()
        self.sleeping = False
        self.metrics_snapshot = None
        # --sleep-idle-seconds: reload() brings the model up again after it was closed asleep;
        # busy counts the requests being answered (a model in use never falls asleep).
        self.reload = None
        self.busy = 0
        self.meta: dict | None = None    # the loaded model's facts (/models), kept while asleep
        self.shape = (0, 0)              # (slots, n_ctx), kept while asleep
        self._waking: asyncio.Lock | None = None
        self.live: set = set()           # Handles of the requests in flight
        self.fingerprint = f"pydecode-{__version__}"
        self.metrics = Metrics(self)
        self._counted = weakref.WeakSet()   # handles whose generation the metrics have seen
        # Grammars are converted and checked here, off the event loop (see app._compiled).
        self.grammar_threads = ThreadPoolExecutor(GRAMMAR_THREADS, thread_name_prefix="pydecode-grammar")
        self.grammar_budget_s = GRAMMAR_BUDGET_S

    def touch(self) -> None:
        """A request that is not monitoring arrived (--sleep-idle-seconds): the idle time restarts."""
        self.last_request = time.monotonic()

    def check_sleep(self) -> bool:
        """(On the event loop.) Whether the server sleeps: once idle past --sleep-idle-seconds,
        with no request being answered, it falls asleep: the model is closed, so its KV cache,
        repacked weights and scratch go back to the system (the weights' file-backed pages the
        OS reclaims by itself), and the next request that is not monitoring reloads it (wake)."""
        s = self.settings.sleep_idle_s
        if s is not None and not self.sleeping and self.status == "ok" and self.llm is not None \
                and not self.busy and not self.live and self.llm.engine.n_active == 0 \
                and self.llm.engine.n_queued == 0 and time.monotonic() - self.last_request > s:
            self.sleeping = True
            self.metrics_snapshot = self.metrics.text()   # what /metrics says while asleep (first scrape)
            if self.reload is not None:
                llm, self.llm = self.llm, None
                llm.close()
                _log(f"idle for {s:g} s: asleep, the model closed (its memory freed) until the next request")
        return self.sleeping

    async def wake(self) -> None:
        """Brings a sleeping server up again (the model reloaded in a thread; requests that
        arrive meanwhile wait for the same load). A failed reload is the model's 503 after."""
        if not self.sleeping:
            return
        if self._waking is None:
            self._waking = asyncio.Lock()
        async with self._waking:
            if not self.sleeping:
                return
            if self.llm is None and self.reload is not None:
                t0 = time.perf_counter()
                try:
                    self.llm = await asyncio.to_thread(self.reload)
                    _log(f"awake: the model reloaded in {time.perf_counter() - t0:.2f} s")
                except Exception as e:   # (a file removed meanwhile, say): said by model()'s 503
                    self.failed(f"reloading after --sleep-idle-seconds: {e}")
                    _log(f"error: {self.error}")
            self.sleeping = False

    def ready(self, llm) -> None:
        import os
        self.llm, self.status = llm, "ok"
        self.fingerprint = f"pydecode-{__version__}-{llm.model.isa}"
        m, path = llm.model, self.settings.model_path
        self.meta = {"n_vocab": m.n_vocab, "n_ctx_train": m.config.n_ctx_train, "n_ctx": llm.n_ctx,
                     "n_embd": m.config.n_embd, "size": os.path.getsize(path) if path and os.path.exists(path) else None}
        self.shape = (llm.engine.model.n_seq, llm.n_ctx)

    def failed(self, message: str) -> None:
        self.status, self.error = "error", message

    def settle(self, handles) -> None:
        """(On the event loop.) A request is over: its handles leave the in-flight set, and each
        generation is counted in the metrics once it has ended (a cancelled one, at its next step)."""
        loop = asyncio.get_running_loop()
        for h in handles:
            self.live.discard(h)
            if h.done:
                self._count(h)
            else:
                h.set_waker(lambda h=h: loop.call_soon_threadsafe(self._count, h))

    def _count(self, h) -> None:
        if h.done and h.error is None and h not in self._counted:
            self._counted.add(h)
            self.metrics.observe(h.completion)

    def shutdown(self) -> None:
        """Stops taking requests and ends every generation in flight at its next step (each
        stream then sends its final chunk, finish_reason "length")."""
        if self.status != "error":
            self.status = "shutting down"
        for h in list(self.live):
            h.cancel(SHUTDOWN_DETAIL)
        self.grammar_threads.shutdown(wait=False, cancel_futures=True)

    def model(self):
        """The LLM, or the 503 that says why there is none to use."""
        if self.status == "ok" and self.llm is not None and not self.llm.closed:
            return self.llm
        if self.status == "shutting down":
            raise APIError.shutting_down()
        if self.status == "loading":
            raise APIError(503, "the model is still loading; GET /health says when it is ready", code="model_loading")
        if self.status == "ok" and self.sleeping:   # (a monitoring route: it does not wake the server)
            raise APIError(503, "the server is asleep (--sleep-idle-seconds); any request that is not "
                                "monitoring wakes it", code="sleeping")
        raise APIError(503, f"the model failed to load: {self.error}", code="model_failed")


def _log(msg: str) -> None:
    print(f"pydecode serve: {msg}", file=sys.stderr, flush=True)
