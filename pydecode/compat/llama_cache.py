"""llama-cpp-python's saved states and prompt caches: LlamaState (Llama.save_state / load_state),
LlamaRAMCache and LlamaDiskCache (Llama.set_cache: a completion whose prompt extends a cached
state's tokens starts from that state instead of recomputing them).

A LlamaState's llama_state bytes are pydecode's own state format (pydecode/kvstate.py: the
tokens, their K/V, the model's fingerprint and a checksum), so a state is refused, with the
reason, by a model it does not belong to."""
from __future__ import annotations

import hashlib
import os
import pickle
from collections import OrderedDict

import numpy as np


class LlamaState:
    """One Llama's context: the tokens evaluated (input_ids[:n_tokens]), the logits kept for them
    (`scores`: the last position's row, or every position's with logits_all; None when the
    context ended without them), the KV state (`llama_state`, bytes) and the sampling seed."""

    def __init__(self, input_ids: np.ndarray, scores: np.ndarray | None, n_tokens: int, llama_state: bytes,
                 llama_state_size: int, seed: int):
        self.input_ids, self.scores, self.n_tokens = input_ids, scores, n_tokens
        self.llama_state, self.llama_state_size, self.seed = llama_state, llama_state_size, seed


def longest_token_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class BaseLlamaCache:
    def __init__(self, capacity_bytes: int = 2 << 30):
        if not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be an integer >= 0, got {capacity_bytes!r}")
        self.capacity_bytes = capacity_bytes

    def _keys(self):
        raise NotImplementedError

    def _find_longest_prefix_key(self, key: tuple[int, ...]) -> tuple[int, ...] | None:
        best, best_n = None, 0
        for k in self._keys():
            n = longest_token_prefix(k, key)
            if n > best_n:
                best, best_n = k, n
        return best


class LlamaRAMCache(BaseLlamaCache):
    """States in memory, least recently used dropped first beyond capacity_bytes."""

    def __init__(self, capacity_bytes: int = 2 << 30):
        super().__init__(capacity_bytes)
        self.cache_state: OrderedDict[tuple[int, ...], LlamaState] = OrderedDict()

    def _keys(self):
        return self.cache_state.keys()

    @property
    def cache_size(self) -> int:
        return sum(s.llama_state_size for s in self.cache_state.values())

    def __getitem__(self, key) -> LlamaState:
        k = self._find_longest_prefix_key(tuple(key))
        if k is None:
            raise KeyError("no cached state shares a prefix with these tokens")
        self.cache_state.move_to_end(k)
        return self.cache_state[k]

    def __contains__(self, key) -> bool:
        return self._find_longest_prefix_key(tuple(key)) is not None

    def __setitem__(self, key, value: LlamaState) -> None:
        key = tuple(key)
        self.cache_state.pop(key, None)
        self.cache_state[key] = value
        while self.cache_state and self.cache_size > self.capacity_bytes:
            self.cache_state.popitem(last=False)


LlamaCache = LlamaRAMCache   # llama-cpp-python's old name


class LlamaDiskCache(BaseLlamaCache):
    """States in files under cache_dir (one pickle per state, named by a hash of its tokens; the
    index of their tokens in memory), oldest dropped first beyond capacity_bytes. The files are
    pickles, as llama-cpp-python's (diskcache) are: point it only at a directory you trust."""

    def __init__(self, cache_dir: str = ".cache/llama_cache", capacity_bytes: int = 2 << 30):
        super().__init__(capacity_bytes)
        self.cache_dir = cache_dir
        os.makedirs(cache_dir, exist_ok=True)
        self._index: OrderedDict[tuple[int, ...], str] = OrderedDict()
        for name in sorted(os.listdir(cache_dir), key=lambda n: os.path.getmtime(os.path.join(cache_dir, n))):
            if name.endswith(".state"):
                try:
                    with open(os.path.join(cache_dir, name), "rb") as f:
                        self._index[tuple(pickle.load(f)[0])] = name
                except Exception:   # not one of ours, or cut short: skipped, not fatal
                    continue

    def _keys(self):
        return self._index.keys()

    def _path(self, key) -> str:
        return os.path.join(self.cache_dir, hashlib.sha256(np.asarray(key, np.int64).tobytes()).hexdigest()[:32]
                            + ".state")

    @property
    def cache_size(self) -> int:
        return sum(os.path.getsize(os.path.join(self.cache_dir, n)) for n in self._index.values()
                   if os.path.exists(os.path.join(self.cache_dir, n)))

    def __getitem__(self, key) -> LlamaState:
        k = self._find_longest_prefix_key(tuple(key))
        if k is None:
            raise KeyError("no cached state shares a prefix with these tokens")
        with open(os.path.join(self.cache_dir, self._index[k]), "rb") as f:
            return pickle.load(f)[1]

    def __contains__(self, key) -> bool:
        return self._find_longest_prefix_key(tuple(key)) is not None

    def __setitem__(self, key, value: LlamaState) -> None:
        key = tuple(key)
        path = self._path(key)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            pickle.dump((list(key), value), f)
        os.replace(tmp, path)
        self._index.pop(key, None)
        self._index[key] = os.path.basename(path)
        while len(self._index) > 1 and self.cache_size > self.capacity_bytes:
            _, name = self._index.popitem(last=False)
            try:
                os.remove(os.path.join(self.cache_dir, name))
            except FileNotFoundError:
                pass
