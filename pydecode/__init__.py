"""pydecode: a CPU-first LLM decode runtime. GGUF models, a hand-written C/SIMD core, Python policy.

    import pydecode
    llm = pydecode.load("smollm2-135m")
    print(llm.generate("Once upon a time", max_tokens=32).text)
"""
from .errors import ContextFullError, ModelError, PydecodeError
from .generation import Completion, Piece, Stats
from .llm import LLM, load
from .model import Model

__all__ = ["load", "LLM", "Model", "Completion", "Piece", "Stats", "ModelError", "ContextFullError",
           "PydecodeError"]
__version__ = "0.1.0"
