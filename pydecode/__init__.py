"""pydecode: a CPU-first LLM decode runtime. GGUF models, a hand-written C/SIMD core, Python policy.

    import pydecode
    llm = pydecode.load("smollm2-135m")
    print(llm.generate("Once upon a time", max_tokens=32).text)
"""
import os

# numpy's OpenBLAS starts a thread per core that spins (~0.1 s) after its start and after every
# BLAS call; in a short run that was 6% of a 1-thread decode's CPU samples, competing with our
# own pool. pydecode does no BLAS work on the hot path, so unless the user chose a thread count
# (or imported numpy first), BLAS runs on the calling thread.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .engine import Engine, Handle  # noqa: E402
from .errors import (ContextFullError, ModelClosedError, ModelError, ModelFileChangedError,  # noqa: E402
                     PydecodeError, QueueFullError)
from .generation import Completion, Piece, Stats  # noqa: E402
from .llm import LLM, load  # noqa: E402
from .compat import Llama, LlamaGrammar, LlamaPromptLookupDecoding  # noqa: E402
from .model import Model  # noqa: E402
from .kvstate import StateFileError  # noqa: E402

__all__ = ["load", "LLM", "Llama", "LlamaGrammar", "LlamaPromptLookupDecoding", "Model", "Engine", "Handle", "Completion", "Piece", "Stats", "ModelError",
           "ModelFileChangedError", "ModelClosedError", "ContextFullError", "QueueFullError", "PydecodeError",
           "StateFileError"]
__version__ = "0.1.0"
