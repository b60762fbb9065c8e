"""Exceptions of pydecode's public API: every one names the file, tensor, key or parameter at fault."""


class PydecodeError(Exception):
    """Base class of pydecode's errors."""


class ModelError(PydecodeError, ValueError):
    """A model file (or model name) that cannot be used: unreadable, truncated, unsupported, inconsistent."""


class ContextFullError(PydecodeError, ValueError):
    """The prompt (plus what must be generated) does not fit in the context window."""


class QueueFullError(PydecodeError, RuntimeError):
    """An Engine's bounded queue (max_queue) holds as many waiting requests as it may."""
