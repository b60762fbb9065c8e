"""Text <-> token ids from the tokenizer stored in a GGUF file, matching llama.cpp.

The GGUF keys `tokenizer.ggml.*` hold the whole tokenizer. This module turns them into:

- a *backend* that encodes plain text (no special tokens) for one `tokenizer.ggml.model`
  (today: "gpt2" = byte-level BPE, run by Hugging Face `tokenizers`);
- the model-independent rules around it, taken from llama.cpp (`llama-vocab.cpp`): which
  special tokens are matched in text and how, BOS/EOS insertion, end-of-generation ids and
  byte-exact detokenization (also incremental, for streaming).

A new tokenizer model (e.g. SentencePiece, `tokenizer.ggml.model == "llama"`) is a new backend
class registered in `_BACKENDS`; nothing else has to change.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

from tokenizers import Regex
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import models, pre_tokenizers

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

# Token texts that end a generation when present in the vocabulary (llama.cpp keeps the same
# kind of list, because GGUF files rarely name all of them in metadata).
EOG_MARKERS = (
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|endoftext|>", "<|end|>",
    "</s>", "<|end_of_text|>", "<EOT>", "<end_of_utterance>", "<\uff5cend\u2581of\u2581sentence\uff5c>",
)


class TokenizerError(ValueError):
    """The GGUF tokenizer metadata cannot be used, or a token id is out of range."""


# ---------------------------------------------------------------------------------------------
# Byte-level BPE ("gpt2")

# Pre-tokenizer split regexes per `tokenizer.ggml.pre`, as llama.cpp applies them (each regex
# splits every piece left by the previous one, keeping matches and the text between them).
# They are llama.cpp's versions: case-insensitive groups such as (?i:'s|'t) are spelled out
# ('[sS]) because Unicode case folding would also match e.g. U+017F (long s).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = _CONTRACTIONS + (
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = _CONTRACTIONS + (
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = _CONTRACTIONS + (
    r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+")
# GPT-4o / Tekken split upper-then-lower case letter runs; written with the Unicode classes of
# their tokenizer.json (Oniguruma has them; llama.cpp needs a lookahead emulation instead).
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_LLM = (
    "[\r\n]",
    # letters of cased scripts (Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee, ...)
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
    "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
    "\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
    "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc"
    "\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
    "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
    "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
    "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+$",
    _CJK,
    r"\p{N}+",
)
_DEEPSEEK_CODER = ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")
_DEEPSEEK_V3 = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
_BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"


@dataclass(frozen=True)
class _PreTokenizer:
    regexes: tuple[str, ...]
    add_bos: bool = False        # llama.cpp's default when the GGUF has no add_bos_token key
    ignore_merges: bool = False  # a pre-token that is itself in the vocabulary is kept whole


_PRE_TOKENIZERS: dict[str, _PreTokenizer] = {}


def _register(names: str, *regexes: str, **flags: bool) -> None:
    for name in names.split():
        _PRE_TOKENIZERS[name] = _PreTokenizer(regexes, **flags)


# Names and groupings follow llama.cpp's `tokenizer.ggml.pre` -> LLAMA_VOCAB_PRE_TYPE_* mapping.
_register("default", r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]")
_register("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2",
          _LLAMA3, add_bos=True, ignore_merges=True)
_register("dbrx smaug-bpe", _LLAMA3)
_register("deepseek-llm", *_DEEPSEEK_LLM)
_register("deepseek-coder", *_DEEPSEEK_CODER)
_register("deepseek-v3", *_DEEPSEEK_V3)
_register("falcon", r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]")
_register("starcoder refact command-r smollm codeshell exaone minerva-7b mellum2",
          r"\p{N}", _GPT2)
_register("gpt-2 phi-2 mpt olmo jais trillion granite-docling exaone4 gigachat mellum a.x-4.0",
          _GPT2)
_register("qwen2 deepseek-r1-qwen megrez stablelm2 hunyuan solar-open kormo", _QWEN2)
_register("qwen35", _QWEN35)
_register("gpt-4o llama4", _GPT4O)
_register("tekken", _TEKKEN, add_bos=True, ignore_merges=True)
_register("bloom poro-chat gpt3-finnish", _BLOOM)
_register("viking", _BLOOM, r"\p{N}")


def _byte_decoder() -> dict[int, int]:
    """GPT-2's byte <-> unicode map, inverted: ord(vocabulary char) -> the byte it stands for.

    Printable Latin-1 bytes stand for themselves; the others (controls, space, ...) were moved
    to U+0100 and up so that every byte has a visible, non-whitespace character.
    """
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    moved = [b for b in range(256) if b not in keep]
    table = {b: b for b in keep}
    table.update({0x100 + i: b for i, b in enumerate(moved)})
    return table


_BYTE_DECODER = _byte_decoder()


class _ByteLevelBPE:
    """Backend for `tokenizer.ggml.model == "gpt2"`: GPT-2 style byte-level BPE."""

    def __init__(self, meta: dict, vocab: dict[str, int]):
        pre_name = meta.get("tokenizer.ggml.pre") or "default"  # llama.cpp: missing -> default
        pre = _PRE_TOKENIZERS.get(pre_name)
        if pre is None:
            raise TokenizerError(f"unsupported tokenizer.ggml.pre {pre_name!r} "
                                 f"(known: {', '.join(sorted(_PRE_TOKENIZERS))})")
        merges = meta.get("tokenizer.ggml.merges")
        if merges is None:
            raise TokenizerError("tokenizer.ggml.merges is missing (needed by a gpt2 tokenizer)")
        # Byte-level tokens never contain a space (it is mapped to U+0120), so "a b" has one.
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        hf = _HFTokenizer(models.BPE(vocab, pairs, ignore_merges=pre.ignore_merges))
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        self.default_add_bos = pre.add_bos
        self._hf_encode = hf.encode

    def encode(self, text: str) -> list[int]:
        """Ids of plain text (special tokens were already cut out by the caller)."""
        return self._hf_encode(text, add_special_tokens=False).ids

    @staticmethod
    def token_bytes(text: str) -> bytes:
        """The bytes a normal vocabulary entry stands for."""
        try:
            return text.translate(_BYTE_DECODER).encode("latin-1")
        except UnicodeEncodeError:  # a char outside the byte map: keep it as UTF-8
            return b"".join(bytes([_BYTE_DECODER[ord(c)]]) if ord(c) in _BYTE_DECODER
                            else c.encode() for c in text)


_BACKENDS = {"gpt2": _ByteLevelBPE}
_NOT_YET = {"llama": "SentencePiece"}


# ---------------------------------------------------------------------------------------------

class Tokenizer:
    """A GGUF model's tokenizer: encode text to ids, decode ids to text, byte-exact.

    Build it with `Tokenizer.from_metadata(meta)`. Attributes: `vocab_size`, `bos_id`,
    `eos_id` (None when absent), `add_bos`/`add_eos` (what `encode(add_special=True)` adds) and
    `eog_ids` (ids that end a generation).
    """

    @classmethod
    def from_metadata(cls, meta: dict) -> Tokenizer:
        """Build from GGUF key/values as plain Python (`{key: field.contents()}`)."""
        model = meta.get("tokenizer.ggml.model")
        backend_cls = _BACKENDS.get(model)
        if backend_cls is None:
            if model in _NOT_YET:
                raise TokenizerError(f"tokenizer.ggml.model {model!r} ({_NOT_YET[model]}) "
                                     "is not yet supported")
            raise TokenizerError(f"unsupported tokenizer.ggml.model {model!r}")
        tokens = meta.get("tokenizer.ggml.tokens")
        if not tokens:
            raise TokenizerError("tokenizer.ggml.tokens is missing or empty")
        # llama.cpp renames empty entries, so that no special token matches the empty string.
        tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        vocab = {t: i for i, t in enumerate(tokens)}
        return cls(meta, tokens, vocab, backend_cls(meta, vocab))

    def __init__(self, meta: dict, tokens: list[str], vocab: dict[str, int], backend):
        n = self.vocab_size = len(tokens)
        types = meta.get("tokenizer.ggml.token_type")
        types = [_NORMAL] * n if types is None else [int(t) for t in types]
        if len(types) < n:
            raise TokenizerError(f"tokenizer.ggml.token_type has {len(types)} entries "
                                 f"for {n} tokens")

        def token_id(key: str) -> int | None:
            value = meta.get(key)
            return int(value) if value is not None and 0 <= int(value) < n else None

        self.bos_id = token_id("tokenizer.ggml.bos_token_id")
        self.eos_id = token_id("tokenizer.ggml.eos_token_id")
        # The per-model default applies only when the file says nothing and has a BOS id.
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token",
                                     backend.default_add_bos and self.bos_id is not None))
        self.add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
        for flag, tid, what in ((self.add_bos, self.bos_id, "bos"),
                                (self.add_eos, self.eos_id, "eos")):
            if flag and tid is None:
                raise TokenizerError(f"tokenizer.ggml.add_{what}_token is set but "
                                     f"tokenizer.ggml.{what}_token_id is missing or out of range")

        eog = {self.eos_id, token_id("tokenizer.ggml.eot_token_id"),
               token_id("tokenizer.ggml.eom_token_id")} - {None}
        for text in EOG_MARKERS:
            tid = vocab.get(text)
            if tid is not None:
                eog.add(tid)
                # Like llama.cpp: an end marker is a control token even if mis-typed as normal.
                types[tid] = _CONTROL
        self.eog_ids = frozenset(eog)

        self._tokens = tokens
        self._types = types
        self._backend = backend
        self._bytes: list[bytes | None] = [None] * n  # token_bytes cache, filled on demand
        # Special tokens cut out of the text before the backend sees it, longest (in UTF-8
        # bytes) first, as llama.cpp does. With parse_special=False only user-defined ones are
        # (as in llama.cpp and HF: they are part of the vocabulary's text, not markup).
        specials = sorted((i for i, t in enumerate(types[:n])
                           if t in (_CONTROL, _USER_DEFINED, _UNKNOWN)),
                          key=lambda i: -len(tokens[i].encode()))
        self._split_all = self._splitter(specials)
        self._split_user = self._splitter([i for i in specials if types[i] == _USER_DEFINED])

    def _splitter(self, ids: list[int]):
        """(texts and ids longest first, a regex that finds whether any of them occurs)."""
        if not ids:
            return (), None
        pairs = tuple((self._tokens[i], i) for i in ids)
        return pairs, re.compile("|".join(re.escape(t) for t, _ in pairs))

    def _partition(self, text: str, parse_special: bool) -> list:
        """Cut `text` into plain-text pieces (str) and special token ids (int).

        llama.cpp's algorithm: for each special token, longest first, split every remaining
        text piece at each of its occurrences. This differs from leftmost-longest matching
        when special texts overlap, so it is reproduced exactly.
        """
        pairs, any_special = self._split_all if parse_special else self._split_user
        if any_special is None or not any_special.search(text):  # the common, fast case
            return [text] if text else []
        pieces: list = [text]
        for special, tid in pairs:
            if special not in text:
                continue
            out: list = []
            for piece in pieces:
                if isinstance(piece, int) or special not in piece:
                    out.append(piece)
                    continue
                for k, part in enumerate(piece.split(special)):
                    if k:
                        out.append(tid)
                    if part:
                        out.append(part)
            pieces = out
        return pieces

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`.

        add_special: add BOS (and EOS) as the model asks (`add_bos`/`add_eos`).
        parse_special: control tokens written in the text ("<|im_start|>") become their id;
        when False they are tokenized as plain text. User-defined tokens always match.
        """
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
            if self._types[token_id] in (_CONTROL, _USER_DEFINED, _UNKNOWN):
                cached = text.encode()
            else:
                cached = self._backend.token_bytes(text)
            self._bytes[token_id] = cached
        return cached

    def _piece(self, token_id: int, skip_special: bool) -> bytes:
        data = self.token_bytes(token_id)
        # Like llama.cpp, skipping drops control/unknown tokens; user-defined ones are text.
        if skip_special and self._types[token_id] in (_CONTROL, _UNKNOWN):
            return b""
        return data

    def is_special(self, token_id: int) -> bool:
        """True for control and user-defined tokens."""
        self._check(token_id)
        return self._types[token_id] in (_CONTROL, _USER_DEFINED)

    def decode(self, ids, skip_special: bool = False) -> str:
        """Text of `ids`; bytes that are not valid UTF-8 become U+FFFD."""
        return b"".join([self._piece(i, skip_special) for i in ids]).decode("utf-8", "replace")

    def decoder(self, skip_special: bool = False) -> IncrementalDecoder:
        """A fresh streaming decoder (one per generated sequence)."""
        return IncrementalDecoder(self, skip_special)


class IncrementalDecoder:
    """Decodes ids one at a time, emitting only complete characters.

    A byte-level token may end in the middle of a UTF-8 character; those bytes are held back
    until the character is complete, so each character is emitted exactly once and the
    concatenated output equals `Tokenizer.decode` of all ids.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._piece = tokenizer._piece
        self._skip = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, token_id: int) -> str:
        """Text completed by this token (may be empty)."""
        return self._utf8.decode(self._piece(token_id, self._skip))

    def flush(self) -> str:
        """Whatever is still held back; an unfinished character becomes U+FFFD."""
        return self._utf8.decode(b"", final=True)
