"""Running the server: bind at once, load the model in the background (/health says 503
"loading" meanwhile), serve until SIGTERM or Ctrl-C, then end the streams in flight with a final
chunk and exit 0 within a few seconds."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import threading

import uvicorn

from .. import constraint
from .app import create_app
from .state import ServerState

GRACE_S = 5          # after a stop signal, how long in-flight responses get to send their last chunk
READ_TIMEOUT_S = 60  # default --timeout: a request's headers, and each part of its body, arrive within it
TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\ncontent-length: 44\r\n" \
            b"connection: close\r\n\r\nthe request headers did not arrive in time\r\n"


def deadline_protocol(timeout: float):
    """uvicorn's HTTP protocol, with a deadline on the request headers: from the connection (or,
    between keep-alive requests, from the next request's first byte) a client has `timeout`
    seconds to send them all, else it gets a 408 and is disconnected (uvicorn has no such
    limit: a client that sends a byte now and then, or nothing, would hold its connection forever)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class HeaderDeadline(AutoHTTPProtocol):
        _header_timer = None
        _header_cycle = None     # the request cycle when the deadline was set: a new one means headers came

        def connection_made(self, transport):
            super().connection_made(transport)
            self._set_header_deadline()

        def data_received(self, data: bytes) -> None:
            if self._between_requests() and (self._header_timer is None or self._header_cycle is not self.cycle):
                self._set_header_deadline()
            super().data_received(data)

        def connection_lost(self, exc):
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().connection_lost(exc)

        def _between_requests(self) -> bool:
            c = self.cycle
            return c is None or c.response_complete

        def _set_header_deadline(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_cycle = self.cycle
            self._header_timer = self.loop.call_later(timeout, self._headers_late)

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.cycle is self._header_cycle and self._between_requests() and not self.transport.is_closing():
                self.transport.write(TIMED_OUT)
                self.transport.close()

    return HeaderDeadline


class _Server(uvicorn.Server):
    """uvicorn's Server, told about the stop signal (to end the streams in flight) and not
    re-raising it afterwards (the process exits 0 once it has shut down cleanly)."""

    def __init__(self, config, state: ServerState):
        super().__init__(config)
        self.state, self.loop = state, None

    async def startup(self, sockets=None):
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)

    async def on_tick(self, counter: int) -> bool:
        if counter % 10 == 0 and self.state.settings.sleep_idle_s is not None:   # about once a second
            self.state.check_sleep()
        return await super().on_tick(counter)

    def handle_exit(self, sig, frame):
        super().handle_exit(sig, frame)
        self.stop_generations()

    def stop_generations(self):
        if self.loop is not None:   # the signal handler may interrupt anything: defer to the loop
            try:
                self.loop.call_soon_threadsafe(self.state.shutdown)
            except RuntimeError:    # the loop has closed already
                pass

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound now (port 0: any free one), or OSError naming the address."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)   # connections queue from now on, even before uvicorn accepts them
    except OSError as e:
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def serve(load, model_id: str, *, host: str = "127.0.0.1", port: int = 8080, aliases=(), api_key=None,
          api_keys=(), settings=None, max_body: int = 8 << 20, max_queue: int | None = 256, cors=(), log=None,
          verbose: bool = False, read_timeout: float = READ_TIMEOUT_S) -> int:
    """Serves the LLM that load() returns (called in a background thread) until a stop signal;
    returns the exit status: 0, or 1 if the model failed to load. host: one address or several,
    comma-separated. settings: the server-wide settings (server/settings.py; defaults if None).
    read_timeout: seconds a client has to send its request headers, and then each part of its
    body (408 beyond)."""
    from .settings import Settings
    settings = settings or Settings(aliases=tuple(aliases), cors=tuple(cors))
    keys = [k for k in ([api_key] if api_key else []) + list(api_keys) if k]
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    state = ServerState(model_id, settings.aliases or aliases, keys, max_body, read_timeout, settings)
    config = uvicorn.Config(create_app(state), host=host, port=port, lifespan="off",
                            http=deadline_protocol(read_timeout),
                            log_level="info" if verbose else "warning", access_log=verbose,
                            timeout_graceful_shutdown=GRACE_S, timeout_keep_alive=5)
    server = _Server(config, state)
    socks = [bind(h.strip(), port) for h in host.split(",") if h.strip()]
    if not socks:
        raise OSError(f"no address to listen on in --host {host!r}")
    where = []
    for sock in socks:
        w = sock.getsockname()
        where.append(f"http://{f'[{w[0]}]' if sock.family == socket.AF_INET6 else w[0]}:{w[1]}")
    log(f"pydecode serve: listening on {', '.join(where)} (loading {model_id}; GET /health says when ready)")

    def bring_up():
        """load(), and the engine made ready to serve (also what a wake from sleep reloads)."""
        llm = load()
        try:
            if max_queue is not None:
                llm.engine.max_queue = max_queue
            constraint.warm(llm.tokenizer)   # holds the GIL 0.1-1 s: now, not under the first grammar request
            llm.engine.start()
        except BaseException:
            llm.close()
            raise
        return llm

    def load_in_background():
        try:
            llm = bring_up()
        except BaseException as e:   # its message is the whole story: no traceback
            state.failed(str(e) or type(e).__name__)
            log(f"pydecode serve: error: the model failed to load: {state.error}")
            server.should_exit = True
            return
        if server.should_exit:       # stopped while it loaded
            llm.close()
            return
        state.ready(llm)
        if settings.sleep_idle_s is not None:
            state.reload = bring_up
        m = llm.model
        log(f"pydecode serve: ready: {model_id} ({m.config.arch}, {m.n_threads} threads, {m.isa}, "
            f"{llm.engine.max_seqs} sequences of {m.n_ctx} tokens)")

    loader = threading.Thread(target=load_in_background, name="pydecode-load", daemon=True)
    loader.start()
    logging.getLogger("uvicorn.error").setLevel(logging.INFO if verbose else logging.WARNING)
    try:
        server.run(sockets=socks)
    finally:
        state.shutdown()
        if state.llm is not None:
            state.llm.close()
        for sock in socks:
            sock.close()
    if state.status == "error":
        return 1
    log("pydecode serve: stopped")
    return 0
