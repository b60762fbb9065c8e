"""What `pydecode serve`'s routes share: the model once it has loaded, the names it answers to,
the API key, the generations in flight, the metrics."""
from __future__ import annotations

import asyncio
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
        self.live: set = set()           # Handles of the requests in flight
        self.fingerprint = f"pydecode-{__version__}"
        self.metrics = Metrics(self)
        self._counted = weakref.WeakSet()   # handles whose generation the metrics have seen
        # Grammars are converted and checked here, off the event loop (see app._compiled).
        self.grammar_threads = ThreadPoolExecutor(GRAMMAR_THREADS, thread_name_prefix="pydecode-grammar")
        self.grammar_budget_s = GRAMMAR_BUDGET_S

    def touch(self) -> None:
        """A request that is not monitoring arrived: the server is awake (--sleep-idle-seconds)."""
        self.last_request = time.monotonic()
        self.sleeping = False

    def check_sleep(self) -> bool:
        """Whether the server has been idle past --sleep-idle-seconds (then it says it sleeps:
        the model's weights are file-backed pages the OS may take back, nothing to reload)."""
        s = self.settings.sleep_idle_s
        if s is not None and not self.sleeping and self.llm is not None and self.llm.engine.n_active == 0 \
                and time.monotonic() - self.last_request > s:
            self.sleeping = True
            self.metrics_snapshot = self.metrics.text()   # what /metrics says while asleep (first scrape)
        return self.sleeping

    def ready(self, llm) -> None:
        self.llm, self.status = llm, "ok"
        self.fingerprint = f"pydecode-{__version__}-{llm.model.isa}"

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
        raise APIError(503, f"the model failed to load: {self.error}", code="model_failed")
