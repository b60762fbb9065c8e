"""Exceptions of pydecode's public API: every one names the file, tensor, key or parameter at fault."""


class PydecodeError(Exception):
    """Base class of pydecode's errors."""


class ModelError(PydecodeError, ValueError):
    """A model file (or model name) that cannot be used: unreadable, truncated, unsupported, inconsistent."""


class ModelFileChangedError(ModelError):
    """The model file was truncated or written to while it was loaded (its bytes are mapped, not
    copied): what was computed from it since may be wrong, so the model refuses to go on. Load it
    again. Replacing the file by a new one (a rename, as `pydecode pull` does) is safe."""


class ModelClosedError(PydecodeError, ValueError):
    """The model (or the LLM over it) was closed: close() cancels what was running and frees it."""


class ContextFullError(PydecodeError, ValueError):
    """The prompt (plus what must be generated) does not fit in the context window."""


class QueueFullError(PydecodeError, RuntimeError):
    """An Engine's bounded queue (max_queue) holds as many waiting requests as it may."""
