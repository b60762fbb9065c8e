"""`pydecode serve`: an OpenAI-compatible HTTP server over one model's batching Engine.

Needs the optional extra: pip install 'pydecode[server]' (starlette, uvicorn, prometheus-client).
create_app(state) is the ASGI application (for tests, or to mount in another server); serve()
runs it with uvicorn. See app.py for the routes, params.py for the fields each takes.
"""
from __future__ import annotations

HINT = "pydecode serve needs its optional dependencies: pip install 'pydecode[server]'"


def require() -> None:
    """Raises ImportError with a one-line hint when the server's libraries are missing."""
    import importlib.util

    missing = [m for m in ("starlette", "uvicorn", "prometheus_client") if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(f"{HINT} (missing: {', '.join(missing)})")


def __getattr__(name):
    if name in ("create_app", "ServerState", "serve"):
        require()
        from . import app, run, state
        return {"create_app": app.create_app, "ServerState": state.ServerState, "serve": run.serve}[name]
    raise AttributeError(name)
