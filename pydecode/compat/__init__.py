"""llama-cpp-python's Python API on pydecode, module for module: `pydecode.compat` is what
`import llama_cpp` gives (Llama, LlamaGrammar, LlamaRAMCache, LlamaState, LogitsProcessorList,
StoppingCriteriaList, the llama_types TypedDicts, ...), with the submodules llama_types,
llama_chat_format, llama_grammar, llama_speculative and llama_cache.

    import pydecode.compat
    pydecode.compat.install()      # from here on, `import llama_cpp` is pydecode's
    from llama_cpp import Llama

llama.cpp's C API (llama_cpp.llama_*, llama_cpp._internals) is not here: pydecode's own C core
has a different one (pydecode.Model). `_internals` exists so that modules importing it load;
its classes refuse with that reason."""
from __future__ import annotations

import sys

import numpy as np

from . import llama_cache, llama_chat_format, llama_grammar, llama_speculative, llama_types
from .llama import LEGACY, LLAMA_DEFAULT_SEED, NO_EFFECT, REFUSED, Llama, LlamaTokenizer
from .llama_cache import BaseLlamaCache, LlamaCache, LlamaDiskCache, LlamaRAMCache, LlamaState
from .llama_grammar import LlamaGrammar
from .llama_speculative import LlamaPromptLookupDecoding
from .llama_types import *  # noqa: F401,F403  (llama_cpp re-exports its types at the top level)

__version__ = "0.3.36"   # the llama-cpp-python version whose API this follows


class LogitsProcessorList(list):
    """Logits processors applied in order: f(input_ids, scores) -> scores."""

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        for f in self:
            scores = f(input_ids, scores)
        return scores


class StoppingCriteriaList(list):
    """Stopping criteria: the generation stops when any f(input_ids, logits) is true."""

    def __call__(self, input_ids: np.ndarray, logits: np.ndarray) -> bool:
        return any(f(input_ids, logits) for f in self)


class MinTokensLogitsProcessor:
    """Bans the end-of-sequence token until min_tokens tokens have been generated."""

    def __init__(self, min_tokens: int, token_eos: int):
        self.min_tokens, self.token_eos, self.prompt_tokens = min_tokens, token_eos, None

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if self.prompt_tokens is None:
            self.prompt_tokens = len(input_ids)
        if len(input_ids) - self.prompt_tokens < self.min_tokens:
            scores[self.token_eos] = -np.inf
        return scores


class _Internals:
    """llama_cpp._internals' place: llama.cpp's C objects, which pydecode does not have."""

    def __getattr__(self, name):
        def refuse(*args, **kwargs):
            raise NotImplementedError(f"llama_cpp._internals.{name} is llama.cpp's C API, which pydecode does not "
                                      f"have (use pydecode.compat.Llama's eval / sample / generate, or pydecode.Model)")
        return refuse


_internals = _Internals()

SUBMODULES = {"llama_types": llama_types, "llama_chat_format": llama_chat_format, "llama_grammar": llama_grammar,
              "llama_speculative": llama_speculative, "llama_cache": llama_cache}


def install(name: str = "llama_cpp") -> None:
    """Makes `import llama_cpp` (and llama_cpp.llama_types, .llama_chat_format, ...) pydecode's
    compat modules, for code written against llama-cpp-python. A llama_cpp imported before is
    replaced in sys.modules only (objects already taken from it stay what they were)."""
    this = sys.modules[__name__]
    sys.modules[name] = this
    for sub, mod in SUBMODULES.items():
        sys.modules[f"{name}.{sub}"] = mod
    sys.modules[f"{name}.llama"] = sys.modules[f"{__name__}.llama"]
    sys.modules[f"{name}._internals"] = _internals   # type: ignore[assignment]


__all__ = ["Llama", "LlamaGrammar", "LlamaState", "LlamaTokenizer", "LlamaRAMCache", "LlamaDiskCache", "LlamaCache",
           "BaseLlamaCache", "LlamaPromptLookupDecoding", "LogitsProcessorList", "StoppingCriteriaList",
           "MinTokensLogitsProcessor", "LLAMA_DEFAULT_SEED", "NO_EFFECT", "REFUSED", "LEGACY", "install",
           "__version__", *[n for n in dir(llama_types) if n[:1].isupper()]]
