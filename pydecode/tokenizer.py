"""Text <-> token ids from the tokenizer stored in a GGUF file, matching llama.cpp.

The GGUF keys `tokenizer.ggml.*` hold the whole tokenizer. This module turns them into:

- a *backend* that encodes plain text (no special tokens) for one `tokenizer.ggml.model`:
  "gpt2" = byte-level BPE, run by Hugging Face `tokenizers`; "llama" = SentencePiece (Llama 2,
  Mistral, Phi-3, Gemma), run by `sentencepiece` from a model built out of the GGUF vocabulary;
- the model-independent rules around it, taken from llama.cpp (`llama-vocab.cpp`): which
  special tokens are matched in text and how, BOS/EOS insertion, end-of-generation ids and
  byte-exact detokenization (also incremental, for streaming).

A new tokenizer model is a new backend class registered in `_BACKENDS`.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import re
import struct
import tempfile
from array import array
from dataclasses import dataclass
from pathlib import Path

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

    add_space_prefix = False  # decode keeps every space
    default_ids: dict[str, int] = {}

    def __init__(self, meta: dict, tokens: list[str], vocab: dict[str, int], cache_path=None):
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


# ---------------------------------------------------------------------------------------------
# SentencePiece ("llama")
#
# llama.cpp's SPM tokenizer (llm_tokenizer_spm) escapes spaces as U+2581, prepends one to every
# plain-text fragment when add_space_prefix is set, then merges adjacent symbols, best vocabulary
# score first (ties: leftmost first), and spells symbols left outside the vocabulary as <0xNN>
# byte tokens. That is exactly SentencePiece's BPE model with byte fallback, so the vocabulary is
# written as a SentencePiece ModelProto (by hand: the wire format is simple and avoids needing
# `protobuf`) and run by `sentencepiece`. The escaping and the prefix are done here, with
# SentencePiece's normalizer off, so nothing else (NFKC, whitespace folding) touches the text.
#
# llama.cpp can merge into *any* vocabulary entry (control, user-defined, unused ones too), while
# SentencePiece never produces control/user-defined/unused pieces by merging; so every entry is
# written as NORMAL except the unknown piece and the byte pieces, which SentencePiece needs
# typed. Special tokens written in text are cut out before (Tokenizer._partition).

_SPM_NORMAL, _SPM_UNKNOWN, _SPM_BYTE = 1, 2, 6
_SPM_CACHE_FORMAT = "pydecode-spm-1"
_SPM_CHECK_FIELD = 1000  # not a ModelProto field: parsers skip it
_SPACE = "\u2581"


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # protobuf writes negative int32 as 10-byte two's complement
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _pb_bytes(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _pb_int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


class _SentencePiece:
    """Backend for `tokenizer.ggml.model == "llama"`: SentencePiece (BPE-style merges by score)."""

    default_add_bos = True  # llama.cpp's defaults for SPM vocabularies
    default_ids = {"bos": 1, "eos": 2}

    def __init__(self, meta: dict, tokens: list[str], vocab: dict[str, int],
                 cache_path: str | os.PathLike | None = None):
        import sentencepiece

        n = len(tokens)
        self.add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        unk = meta.get("tokenizer.ggml.unknown_token_id")
        unk = int(unk) if unk is not None and 0 <= int(unk) < n else 0
        types = meta.get("tokenizer.ggml.token_type") or [_NORMAL] * n
        scores = meta.get("tokenizer.ggml.scores") or [0.0] * n  # llama.cpp: missing -> 0
        for key, values in (("token_type", types), ("scores", scores)):
            if len(values) < n:
                raise TokenizerError(f"tokenizer.ggml.{key} has {len(values)} entries "
                                     f"for {n} tokens")

        pieces = list(tokens)
        kinds = bytearray([_SPM_NORMAL]) * n
        bytes_ = {f"<0x{b:02X}>": b for b in range(256)}
        byte_ids = [i for i in range(n) if types[i] == _BYTE and pieces[i] in bytes_]
        # Byte fallback needs all 256 byte pieces (llama.cpp would otherwise fail on the rest).
        self.byte_fallback = len({pieces[i] for i in byte_ids}) == 256
        if self.byte_fallback:
            for i in byte_ids:
                kinds[i] = _SPM_BYTE
        kinds[unk] = _SPM_UNKNOWN
        # SentencePiece refuses duplicate pieces; llama.cpp's text -> id map keeps the last one,
        # so earlier copies get an unreachable name.
        if len(vocab) < n:
            for i, text in enumerate(pieces):
                if vocab[text] != i:
                    pieces[i] = f"\ue000pydecode-duplicate-{i}"
                    kinds[i] = _SPM_NORMAL

        scores32 = array("f", scores[:n])
        header = self._header(pieces, scores32, kinds, unk)
        proto = self._load_cache(cache_path, header)
        sp = None
        if proto is not None:
            try:
                sp = sentencepiece.SentencePieceProcessor(model_proto=proto)
            except RuntimeError:  # unreadable after all: rebuild it
                proto = None
        if proto is None:
            proto = header + self._pieces_proto(pieces, scores32, kinds) + _pb_bytes(
                3, _pb_bytes(1, b"identity") + _pb_int(3, 0) + _pb_int(4, 0) + _pb_int(5, 0))
            # Last, in a field SentencePiece ignores: a hash of all the bytes before it.
            proto += _pb_bytes(_SPM_CHECK_FIELD, hashlib.sha256(proto).digest())
            try:
                sp = sentencepiece.SentencePieceProcessor(model_proto=proto)
            except RuntimeError as e:
                raise TokenizerError(f"SentencePiece refused the vocabulary: {e}") from None
            self._save_cache(cache_path, proto)
        self.proto = proto  # a complete SentencePiece model file (what the cache holds)
        self._encode_ids = sp.encode
        self.sentencepiece = sp

    def _header(self, pieces, scores32, kinds, unk) -> bytes:
        """The serialized trainer_spec, written first in the proto. It carries a hash of
        everything the proto is made of, so a cached proto is reused only for the same input."""
        h = hashlib.sha256(_SPM_CACHE_FORMAT.encode())
        h.update(array("I", [len(p) for p in pieces]).tobytes())
        h.update("\0".join(pieces).encode("utf-8", "surrogatepass"))
        h.update(scores32.tobytes())
        h.update(bytes(kinds))
        h.update(struct.pack("<iB", unk, self.byte_fallback))
        spec = (_pb_bytes(2, f"{_SPM_CACHE_FORMAT}:{h.hexdigest()}".encode())  # model_prefix
                + _pb_int(3, 2)                                 # model_type = BPE
                + _pb_int(4, len(pieces))                       # vocab_size
                + _pb_int(35, int(self.byte_fallback))          # byte_fallback
                + _pb_int(40, unk)                              # unk_id
                + _pb_int(41, -1) + _pb_int(42, -1) + _pb_int(43, -1))  # bos/eos/pad: ours
        return _pb_bytes(2, spec)

    @staticmethod
    def _pieces_proto(pieces, scores32, kinds) -> bytes:
        """ModelProto.pieces: {1: piece, 2: score (float), 3: type} per vocabulary entry."""
        out = []
        append = out.append
        raw_scores = scores32.tobytes()
        for i, piece in enumerate(pieces):
            text = piece.encode("utf-8", "surrogatepass")
            body = (b"\x0a" + _varint(len(text)) + text + b"\x15" + raw_scores[4 * i:4 * i + 4]
                    + b"\x18" + kinds[i:i + 1])
            append(b"\x0a" + _varint(len(body)) + body)
        return b"".join(out)

    @staticmethod
    def _load_cache(cache_path, header: bytes) -> bytes | None:
        """The cached proto if it was made from this vocabulary (header) and is intact."""
        if cache_path is None:
            return None
        try:
            data = Path(cache_path).read_bytes()
        except OSError:
            return None
        check = _pb_bytes(_SPM_CHECK_FIELD, bytes(32))[:-32]
        body, tag, digest = data[:-len(check) - 32], data[-len(check) - 32:-32], data[-32:]
        if (data.startswith(header) and tag == check
                and hashlib.sha256(body).digest() == digest):
            return data
        return None

    @staticmethod
    def _save_cache(cache_path, proto: bytes) -> None:
        """Write atomically (temporary file + rename); an unwritable place just means no cache."""
        if cache_path is None:
            return
        path = Path(cache_path)
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(proto)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
            tmp = None
        except OSError:
            pass
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def encode(self, text: str) -> list[int]:
        """Ids of one plain-text fragment (llama.cpp prefixes every fragment with a space)."""
        if self.add_space_prefix:
            text = " " + text
        return self._encode_ids(text.replace(" ", _SPACE))

    @staticmethod
    def token_bytes(text: str) -> bytes:
        return text.replace(_SPACE, " ").encode()


_BACKENDS = {"gpt2": _ByteLevelBPE, "llama": _SentencePiece}
_NOT_YET: dict[str, str] = {}


# ---------------------------------------------------------------------------------------------

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
            if model in _NOT_YET:
                raise TokenizerError(f"tokenizer.ggml.model {model!r} ({_NOT_YET[model]}) "
                                     "is not yet supported")
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
        types = [_NORMAL] * n if types is None else [int(t) for t in types]
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
        # SentencePiece puts a space before every plain-text fragment (add_space_prefix); decode
        # drops it again where encode put it: at the start and after a special token.
        self._space_prefix = bool(getattr(backend, "add_space_prefix", False))
        self._bytes: list[bytes | None] = [None] * n  # token_bytes cache, filled on demand
        self._shown: list[bytes | None] = [None] * n  # _piece(id, skip_special=True) cache, likewise
        # Special tokens cut out of the text before the backend sees it, longest (in UTF-8
        # bytes) first, as llama.cpp does. With parse_special=False only user-defined ones are
        # (as in llama.cpp and HF: they are part of the vocabulary's text, not markup).
        specials = sorted((i for i, t in enumerate(types[:n])
                           if t in (_CONTROL, _USER_DEFINED, _UNKNOWN)),
                          key=lambda i: -len(tokens[i].encode()))
        self._rstrip = self._rstrip_ids(meta, vocab, specials)
        self._split_all = self._splitter(specials)
        self._split_user = self._splitter([i for i in specials if types[i] == _USER_DEFINED])

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
            kind = self._types[token_id]
            if kind in (_CONTROL, _USER_DEFINED, _UNKNOWN):
                cached = text.encode()
            elif kind == _BYTE and re.fullmatch("<0x[0-9A-Fa-f]{2}>", text):
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
        if skip_special and self._types[token_id] in (_CONTROL, _UNKNOWN):
            return b""
        return data

    def _follows_special(self, token_id: int) -> bool:
        """Whether encode starts a new text fragment after this token (see _space_prefix)."""
        return self._types[token_id] in (_CONTROL, _USER_DEFINED, _UNKNOWN)

    def is_special(self, token_id: int) -> bool:
        """True for control and user-defined tokens."""
        self._check(token_id)
        return self._types[token_id] in (_CONTROL, _USER_DEFINED)

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


class IncrementalDecoder:
    """Decodes ids one at a time, emitting only complete characters.

    A token may end in the middle of a UTF-8 character (byte-level BPE tokens, SentencePiece
    <0xNN> byte tokens); those bytes are held back until the character is complete, so each
    character is emitted exactly once. The concatenated output equals `Tokenizer.decode` of all
    ids when made with start=True; with start=False (the default, for a generation that
    continues a prompt) it equals what decoding the prompt and the ids together adds after the
    prompt's own text, when the prompt ends with plain text. The two differ only for
    SentencePiece vocabularies with add_space_prefix (Llama 2, Mistral, Phi-3): in a text's
    first token the leading space is the prefix encode added, in a continuation it is a space.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False, start: bool = False):
        self._piece = tokenizer._piece
        self._skip = skip_special
        self._n = tokenizer.vocab_size
        # The bytes of each id as this decoder shows them, cached per tokenizer: feed runs once
        # per generated token, right after a decode step has flushed the CPU caches, where every
        # Python call costs microseconds.
        self._cache = tokenizer._shown if skip_special else tokenizer._bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._space_prefix = tokenizer._space_prefix
        self._follows_special = tokenizer._follows_special
        self._strip_next = start and self._space_prefix

    def feed(self, token_id: int) -> str:
        """Text completed by this token (may be empty)."""
        data = self._cache[token_id] if 0 <= token_id < self._n else None
        if data is None:
            data = self._piece(token_id, self._skip)   # checks the id; fills token_bytes' cache
            if self._skip:
                self._cache[token_id] = data
        if self._space_prefix:
            if self._follows_special(token_id):
                self._strip_next = True
            else:
                if self._strip_next and data[:1] == b" ":
                    data = data[1:]
                self._strip_next = False
        return self._utf8.decode(data)

    def flush(self) -> str:
        """Whatever is still held back; an unfinished character becomes U+FFFD."""
        return self._utf8.decode(b"", final=True)
