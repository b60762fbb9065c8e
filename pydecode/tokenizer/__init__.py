"""Text <-> token ids from the tokenizer stored in a GGUF file, matching llama.cpp.

The GGUF keys `tokenizer.ggml.*` hold the whole tokenizer. This module turns them into:

- a *backend* that encodes plain text (no special tokens) for one `tokenizer.ggml.model`:
  "gpt2" = byte-level BPE, run by Hugging Face `tokenizers`; "llama" = SentencePiece (Llama 2,
  Mistral, Phi-3, Gemma), run by `sentencepiece` from a model built out of the GGUF vocabulary;
- the model-independent rules around it, taken from llama.cpp (`llama-vocab.cpp`): which
  special tokens are matched in text and how, BOS/EOS insertion, end-of-generation ids and
  byte-exact detokenization (also incremental, for streaming).

The parts: common.py (token types, EOG markers, the error), bpe.py and spm.py (the two
backends), incremental.py (streaming decode); this module holds the Tokenizer itself. A new
tokenizer model is a new backend class registered in `_BACKENDS`.
"""

from __future__ import annotations

import os
import re

from .bpe import _PRE_TOKENIZERS, _ByteLevelBPE, _SpaceEscapedBPE
from .common import BYTE, CONTROL, EOG_MARKERS, NORMAL, UNKNOWN, USER_DEFINED, TokenizerError, check_text
from .incremental import IncrementalDecoder
from .spm import _SentencePiece

__all__ = ["Tokenizer", "TokenizerError", "IncrementalDecoder", "EOG_MARKERS"]

_BACKENDS = {"gpt2": _ByteLevelBPE, "llama": _SentencePiece, "gemma4": _SpaceEscapedBPE}


def _end_of_generation(eog: set[int], vocab: dict[str, int], types: list[int]) -> frozenset[int]:
    """The ids that end a generation: the metadata's (eos, eot, eom) and every end marker the
    vocabulary has, with llama.cpp's corrections by family; retypes `types` as llama.cpp does.

    - An end marker is a control token even if mis-typed as normal.
    - OpenAI harmony (gpt-oss): <|start|> <|channel|> <|message|> <|constrain|> are shown as
      text (user-defined), for the reasoning parser (pydecode/chat/reasoning.py) to read the
      channels in the generated text; with <|return|> and <|call|> present, <|end|> only closes
      a message (the analysis one, before the final answer): not an end, and shown as text too.
    - Gemma 4 (<|tool_response> present): </s> is a normal token, not an end.
    """
    for text in EOG_MARKERS:
        tid = vocab.get(text)
        if tid is not None:
            eog.add(tid)
            types[tid] = CONTROL
    for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
        if text in vocab:
            types[vocab[text]] = USER_DEFINED
    ids = {text: vocab.get(text) for text in ("<|return|>", "<|call|>", "<|end|>",
                                              "<|tool_response>", "</s>")}
    if ids["<|return|>"] is not None and ids["<|call|>"] is not None and ids["<|end|>"] is not None:
        types[ids["<|end|>"]] = USER_DEFINED
        eog.discard(ids["<|end|>"])
    if ids["<|tool_response>"] is not None and ids["</s>"] is not None:
        eog.discard(ids["</s>"])
        types[ids["</s>"]] = NORMAL
    return frozenset(eog)


class Tokenizer:
    """A GGUF model's tokenizer: encode text to ids, decode ids to text, byte-exact.

    Build it with `Tokenizer.from_metadata(meta)`. Attributes: `vocab_size`, `bos_id`,
    `eos_id` (None when absent), `add_bos`/`add_eos` (what `encode(add_special=True)` adds) and
    `eog_ids` (ids that end a generation).
    """

    @classmethod
    def from_metadata(cls, meta: dict, *, cache_path: str | os.PathLike | None = None) -> Tokenizer:
        """Build from GGUF key/values as plain Python (`{key: field.contents()}`).

        cache_path: where a SentencePiece vocabulary may keep the model it builds (for example
        `<model>.gguf.spm.model`), so that the next load skips building it. The file records a
        hash of the vocabulary it was made from and is rebuilt when that differs; it is
        written atomically, and not at all where it cannot be. Other tokenizers ignore it.
        """
        model = meta.get("tokenizer.ggml.model")
        backend_cls = _BACKENDS.get(model)
        if backend_cls is None:
            raise TokenizerError(f"unsupported tokenizer.ggml.model {model!r}")
        tokens = meta.get("tokenizer.ggml.tokens")
        if not tokens:
            raise TokenizerError("tokenizer.ggml.tokens is missing or empty")
        # llama.cpp renames empty entries, so that no special token matches the empty string.
        tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        vocab = {t: i for i, t in enumerate(tokens)}  # like llama.cpp, a duplicate's last id wins
        return cls(meta, tokens, vocab, backend_cls(meta, tokens, vocab, cache_path))

    def __init__(self, meta: dict, tokens: list[str], vocab: dict[str, int], backend):
        n = self.vocab_size = len(tokens)
        types = meta.get("tokenizer.ggml.token_type")
        types = [NORMAL] * n if types is None else [int(t) for t in types]
        if len(types) < n:
            raise TokenizerError(f"tokenizer.ggml.token_type has {len(types)} entries "
                                 f"for {n} tokens")

        def token_id(key: str, default: int | None = None) -> int | None:
            value = meta.get(key)
            if value is None or not 0 <= int(value) < n:  # llama.cpp: bad id -> the default
                value = default
            return int(value) if value is not None and 0 <= int(value) < n else None

        self.bos_id = token_id("tokenizer.ggml.bos_token_id", backend.default_ids.get("bos"))
        self.eos_id = token_id("tokenizer.ggml.eos_token_id", backend.default_ids.get("eos"))
        # The per-model default applies only when the file says nothing and has a BOS id.
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token",
                                     backend.default_add_bos and self.bos_id is not None))
        if getattr(backend, "always_add_bos", False) and self.bos_id is not None:
            self.add_bos = True  # llama.cpp overrides a file's add_bos_token=false (Gemma 4)
        self.add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
        for flag, tid, what in ((self.add_bos, self.bos_id, "bos"),
                                (self.add_eos, self.eos_id, "eos")):
            if flag and tid is None:
                raise TokenizerError(f"tokenizer.ggml.add_{what}_token is set but "
                                     f"tokenizer.ggml.{what}_token_id is missing or out of range")

        self.eog_ids = _end_of_generation(
            {self.eos_id, token_id("tokenizer.ggml.eot_token_id"),
             token_id("tokenizer.ggml.eom_token_id")} - {None}, vocab, types)

        self._tokens = tokens
        self._types = types
        self._backend = backend
        # SentencePiece puts a space before every plain-text fragment (add_space_prefix); decode
        # drops it again where encode put it: at the start and after a special token.
        self._space_prefix = bool(getattr(backend, "add_space_prefix", False))
        self._bytes: list[bytes | None] = [None] * n  # token_bytes cache, filled on demand
        self._shown: list[bytes | None] = [None] * n  # _piece(id, skip_special=True) cache, likewise
        # Special tokens cut out of the text before the backend sees it, longest (in UTF-8
        # bytes) first, as llama.cpp does. With parse_special=False only user-defined ones are
        # (as in llama.cpp and HF: they are part of the vocabulary's text, not markup).
        specials = sorted((i for i, t in enumerate(types[:n])
                           if t in (CONTROL, USER_DEFINED, UNKNOWN)),
                          key=lambda i: -len(tokens[i].encode()))
        self._rstrip = self._rstrip_ids(meta, vocab, specials)
        self._split_all = self._splitter(specials)
        self._split_user = self._splitter([i for i in specials if types[i] == USER_DEFINED])

    @staticmethod
    def _rstrip_ids(meta: dict, vocab: dict[str, int], specials: list[int]) -> frozenset[int]:
        """Special tokens that swallow the whitespace after them when cut out of text.

        llama.cpp sets this by model name (general.name): for Phi-3, every special token but
        <unk>, <s> and <|endoftext|>, so "<|user|>\nHi" encodes as <|user|> "Hi"."""
        name = str(meta.get("general.name", "")).lower()
        if "phi-3" not in name and "phi3" not in name:
            return frozenset()
        ids = set(specials)
        if "</s>" in vocab:
            ids.add(vocab["</s>"])
        return frozenset(ids - {vocab.get(t) for t in ("<unk>", "<s>", "<|endoftext|>")})

    def _splitter(self, ids: list[int]):
        """(texts and ids longest first, {first two characters: indexes into them})."""
        pairs = tuple((self._tokens[i], i) for i in ids)
        buckets: dict[str, list[int]] = {}
        for k, (text, _) in enumerate(pairs):
            buckets.setdefault(text[:2], []).append(k)
        return pairs, buckets

    def _partition(self, text: str, parse_special: bool) -> list:
        """Cut `text` into plain-text pieces (str) and special token ids (int).

        llama.cpp's algorithm: for each special token, longest first, split every remaining
        text piece at each of its occurrences. This differs from leftmost-longest matching
        when special texts overlap, so it is reproduced exactly.
        """
        pairs, buckets = self._split_all if parse_special else self._split_user
        if len(pairs) > 64:
            # Only specials whose first two characters occur in the text can occur (Gemma has
            # 6k of them: testing each with `in` would cost more than the encoding itself).
            starts = {text[i:i + 2] for i in range(len(text))} | set(text)
            found = sorted(k for key in starts for k in buckets.get(key, ()))
            candidates = [pairs[k] for k in found if pairs[k][0] in text]
        else:
            candidates = [pair for pair in pairs if pair[0] in text]
        if not candidates:  # the common, fast case
            return [text] if text else []
        rstrip = self._rstrip
        pieces: list = [text]
        for special, tid in candidates:
            strip = tid in rstrip
            out: list = []
            for piece in pieces:
                if isinstance(piece, int) or special not in piece:
                    out.append(piece)
                    continue
                for j, part in enumerate(piece.split(special)):
                    if j:
                        out.append(tid)
                        if strip:
                            part = part.lstrip(" \t\n\v\f\r")  # C isspace()
                    if part:
                        out.append(part)
            pieces = out
        return pieces

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`.

        add_special: add BOS (and EOS) as the model asks (`add_bos`/`add_eos`).
        parse_special: control tokens written in the text ("<|im_start|>") become their id;
        when False they are tokenized as plain text. User-defined tokens always match.
        Text that is not valid Unicode (a lone surrogate) is a TokenizerError (a ValueError).
        """
        check_text(text)
        ids: list[int] = []
        if add_special and self.add_bos:
            ids.append(self.bos_id)
        encode = self._backend.encode
        for piece in self._partition(text, parse_special):
            if isinstance(piece, int):
                ids.append(piece)
            else:
                ids.extend(encode(piece))
        if add_special and self.add_eos:
            ids.append(self.eos_id)
        return ids

    def _check(self, token_id: int) -> None:
        if not 0 <= token_id < self.vocab_size:
            raise TokenizerError(f"token id {token_id} out of range [0, {self.vocab_size})")

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes `token_id` stands for (special tokens: their text as UTF-8)."""
        self._check(token_id)
        cached = self._bytes[token_id]
        if cached is None:
            text = self._tokens[token_id]
            kind = self._types[token_id]
            if kind in (CONTROL, USER_DEFINED, UNKNOWN):
                cached = text.encode()
            elif kind == BYTE and re.fullmatch("<0x[0-9A-Fa-f]{2}>", text):
                cached = bytes([int(text[3:5], 16)])  # byte fallback token <0xNN>
            else:
                cached = self._backend.token_bytes(text)
            self._bytes[token_id] = cached
        return cached

    def piece_bytes(self, token_id: int, skip_special: bool = False) -> bytes:
        """What `token_id` contributes to decoded text, as bytes (nothing for a control token
        when skip_special)."""
        self._check(token_id)
        return self._piece(token_id, skip_special)

    def _piece(self, token_id: int, skip_special: bool) -> bytes:
        data = self.token_bytes(token_id)
        # Like llama.cpp, skipping drops control/unknown tokens; user-defined ones are text.
        if skip_special and self._types[token_id] in (CONTROL, UNKNOWN):
            return b""
        return data

    def _follows_special(self, token_id: int) -> bool:
        """Whether encode starts a new text fragment after this token (see _space_prefix)."""
        return self._types[token_id] in (CONTROL, USER_DEFINED, UNKNOWN)

    def is_special(self, token_id: int) -> bool:
        """True for control and user-defined tokens."""
        self._check(token_id)
        return self._types[token_id] in (CONTROL, USER_DEFINED)

    def decode(self, ids, skip_special: bool = False) -> str:
        """Text of `ids`; bytes that are not valid UTF-8 become U+FFFD.

        With SentencePiece, the space encode prefixes to each text fragment (at the start and
        after a special token) is dropped, so that decode(encode(text)) == text."""
        if not self._space_prefix:
            return b"".join([self._piece(i, skip_special) for i in ids]).decode("utf-8", "replace")
        dec = IncrementalDecoder(self, skip_special, start=True)
        return "".join([dec.feed(i) for i in ids]) + dec.flush()

    def decoder(self, skip_special: bool = False, *, start: bool = False) -> IncrementalDecoder:
        """A fresh streaming decoder (one per generated sequence).

        start=False (for generation): the ids continue a prompt, so a leading space is text
        (" Paris" after "The capital of France is"). start=True: they begin a text, as
        `decode` assumes."""
        return IncrementalDecoder(self, skip_special, start=start)
