"""llama-cpp-python's llama_speculative module: LlamaPromptLookupDecoding, the draft "model" of
Llama(draft_model=...). pydecode drafts by prompt lookup itself (load(draft="lookup"), which tunes
its n-gram and draft length as it goes); this class carries llama-cpp-python's settings and its
n-gram search (find_candidate_pred_tokens), which is what the drafts are made of."""
from __future__ import annotations

import numpy as np


class LlamaPromptLookupDecoding:
    """Llama(draft_model=LlamaPromptLookupDecoding(max_ngram_size, num_pred_tokens)): speculative
    decoding by prompt lookup, with up to num_pred_tokens drafted per pass."""

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10):
        for name, v in (("max_ngram_size", max_ngram_size), ("num_pred_tokens", num_pred_tokens)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        self.max_ngram_size, self.num_pred_tokens = max_ngram_size, num_pred_tokens

    @staticmethod
    def find_candidate_pred_tokens(input_ids: np.ndarray, max_ngram_size: int, num_pred_tokens: int) -> np.ndarray:
        """The tokens that followed the first occurrence of the input's last n-gram (n from
        max_ngram_size down to 1; an occurrence with nothing after it does not count), at most
        num_pred_tokens of them; empty when no n-gram recurs."""
        ids = np.asarray(input_ids)
        n_ids = len(ids)
        for n in range(min(max_ngram_size, n_ids - 1), 0, -1):
            tail = ids[n_ids - n:]
            for i in range(n_ids - n):   # (the tail itself, at n_ids - n, has nothing after it)
                if np.array_equal(ids[i:i + n], tail):
                    start = i + n
                    end = min(start + num_pred_tokens, n_ids)
                    if start < end:
                        return ids[start:end]
        return np.array([], dtype=ids.dtype if ids.size else np.intc)

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        return self.find_candidate_pred_tokens(input_ids, self.max_ngram_size, self.num_pred_tokens)
