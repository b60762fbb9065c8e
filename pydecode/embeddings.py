"""Embeddings: the model's final hidden states (after the output norm, what its head reads),
pooled over each input's tokens, as llama.cpp computes them.

The pooling is the GGUF's `<arch>.pooling_type` (llama.cpp's enum: 0 none, 1 mean, 2 cls, 3 last,
4 rank), absent meaning none as in llama.cpp, unless the caller names one. Normalization is
llama.cpp's embd_normalize (2, Euclidean, by default; -1 none; 0 max-abs scaled to int16's range;
1 taxicab; p > 2 the p-norm), applied to the pooled vector, or to each token's with pooling none.

Each input runs in a KV slot leased from the model's SlotLedger (through the Engine's waiting
take where an LLM calls this, so it never races a generation) and is released with the tokens
whose K/V it left there: a later prompt that starts with them reuses them, as after a generation.
The input runs in chunks of n_batch, each its own C call, so the Engine's steps interleave with a
long input instead of waiting for all of it.
"""
from __future__ import annotations

import numpy as np

from .errors import ContextFullError, ModelError
from .model import token_ids

# llama.cpp's llama_pooling_type values, as written in GGUF files
POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
POOLINGS = ("none", "mean", "cls", "last")   # the ones pydecode computes


def model_pooling(model) -> str:
    """The pooling the model's GGUF asks for, as a name ("none" when it says nothing, as llama.cpp)."""
    key = f"{model.config.arch}.pooling_type"
    v = model.gguf.metadata.get(key)
    if v is None:
        return "none"
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) not in POOLING_TYPES:
        raise ModelError(f"{model.path}: {key} is {v!r}, not one of llama.cpp's pooling types "
                         f"({', '.join(f'{k} {n}' for k, n in POOLING_TYPES.items())})")
    return POOLING_TYPES[int(v)]


def resolve_pooling(model, pooling: str | None) -> str:
    """The pooling a call uses: `pooling` when given, else the model's; rank is refused (it needs a
    reranker's classification head, which the core does not run)."""
    if pooling is None:
        pooling = model_pooling(model)
        if pooling == "rank":
            raise ValueError(f"{model.path.name} asks for rank pooling (a reranker); pydecode computes no "
                             f"reranking scores: pass pooling= one of {', '.join(POOLINGS)}")
    elif pooling not in POOLINGS:
        why = " (rank pooling, a reranker's score, is not supported)" if pooling == "rank" else ""
        raise ValueError(f"pooling must be one of {', '.join(map(repr, POOLINGS))} or None (the model's), "
                         f"got {pooling!r}{why}")
    return pooling


def norm_mode(normalize) -> int:
    """normalize as llama.cpp's embd_normalize: True -> 2 (Euclidean), False -> -1 (none), or the int."""
    if normalize is True or normalize is False:
        return 2 if normalize else -1
    if isinstance(normalize, (int, np.integer)) and normalize >= -1:
        return int(normalize)
    raise ValueError(f"normalize must be True, False or an int >= -1 (llama.cpp's embd_normalize), got {normalize!r}")


def normalized(v: np.ndarray, mode: int) -> np.ndarray:
    """Each row of v (float64) scaled by llama.cpp's embd_normalize rule; all-zero rows stay zero."""
    a = np.abs(v)
    if mode < 0:
        return v
    if mode == 0:      # the largest magnitude becomes 32760 (what llama.cpp's int16 output wants)
        size = a.max(axis=-1, keepdims=True) / 32760.0
    elif mode == 2:
        size = np.sqrt((v * v).sum(axis=-1, keepdims=True))
    else:              # 1: taxicab; p > 2: the p-norm
        size = (a ** mode).sum(axis=-1, keepdims=True) ** (1.0 / mode)
    return np.divide(v, size, out=np.zeros_like(v), where=size > 0)


def input_ids(tokenizer, inputs, n_vocab: int) -> list[list[int]]:
    """The inputs as token-id lists: a string, a list of strings, a list of token ids (one input)
    or a list of such lists; strings are tokenized with the model's special tokens (BOS, and EOS
    where it asks), as llama.cpp does for embeddings."""
    if isinstance(inputs, str):
        return [tokenizer.encode(inputs)]
    if isinstance(inputs, np.ndarray):
        inputs = inputs.tolist()
    if not isinstance(inputs, (list, tuple)):
        raise TypeError(f"inputs must be a string, a list of strings, a list of token ids or a list of such "
                        f"lists, got {type(inputs).__name__}")
    if not inputs:
        raise ValueError("inputs is empty: give a string, token ids, or a non-empty list of them")
    if all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in inputs):
        return [token_ids(inputs, n_vocab, "inputs").tolist()]
    out = []
    for i, x in enumerate(inputs):
        if isinstance(x, str):
            out.append(tokenizer.encode(x))
        elif isinstance(x, (list, tuple, np.ndarray)):
            out.append(token_ids(x, n_vocab, f"inputs[{i}]").tolist() if len(x) else [])
        else:
            raise TypeError(f"inputs[{i}] must be a string or a list of token ids, got {type(x).__name__}")
    return out


def check_lengths(ids: list[list[int]], n_ctx: int) -> None:
    """Every input has tokens and fits in the context (all checked before any runs)."""
    for i, x in enumerate(ids):
        if not x:
            raise ValueError(f"input {i} is empty: it has no tokens (this model adds no BOS to an empty text)")
        if len(x) > n_ctx:
            raise ContextFullError(f"input {i} has {len(x)} tokens, more than the context of {n_ctx} tokens")


def embed(model, inputs, *, pooling: str | None = None, normalize=True, take=None) -> list[np.ndarray]:
    """Embeddings of `inputs` (see input_ids), in order: float32 (n_embd,) each when pooled,
    (n_tokens, n_embd) with pooling "none". take(slot, lessee, latest): how a slot is leased
    (default the ledger's own take, which raises SlotBusy while every slot is leased;
    Engine._taker waits its turn)."""
    pool = resolve_pooling(model, pooling)
    mode = norm_mode(normalize)
    ids = input_ids(model.tokenizer, inputs, model.n_vocab)
    check_lengths(ids, model.n_ctx)
    return [embed_ids(model, x, pool, mode, take) for x in ids]


def embed_ids(model, ids: list[int], pooling: str, mode: int, take=None) -> np.ndarray:
    """One input's embedding, in a slot leased for it (then released holding its tokens)."""
    me = object()
    slot = (take or model.slots.take)(None, me, latest=False)
    held: list[int] = []
    try:
        acc, rows = None, []
        nb = model.n_batch
        for start in range(0, len(ids), nb):
            h = model.prefill_hidden(ids[start:start + nb], start, slot, lease=me)
            if pooling == "none":
                rows.append(h)
            elif pooling == "mean":   # summed in float64: a long input's mean does not drift
                s = h.sum(axis=0, dtype=np.float64)
                acc = s if acc is None else acc + s
            elif pooling == "cls":
                acc = h[0].astype(np.float64) if acc is None else acc
            else:
                acc = h[-1].astype(np.float64)
        held = list(ids)
    finally:
        model.slots.release(slot, me, held)   # [] after an error: what the slot holds is unknown
    if pooling == "none":
        return normalized(np.concatenate(rows).astype(np.float64), mode).astype(np.float32)
    if pooling == "mean":
        acc = acc / len(ids)
    return normalized(acc, mode).astype(np.float32)
