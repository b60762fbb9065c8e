"""Byte-level BPE ("gpt2" vocabularies): llama.cpp's pre-tokenizer regexes per
`tokenizer.ggml.pre`, then Hugging Face `tokenizers` runs the merges."""
from __future__ import annotations

import re
from dataclasses import dataclass

from tokenizers import Regex
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import models, pre_tokenizers

from .common import TokenizerError


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


_GIL_FREE_CHARS = 4096   # from this length on, encode through encode_batch


def _ids_of(hf):
    """hf's encode as text -> ids. tokenizers' encode holds the GIL throughout (0.37 s on 900 KB:
    a server's event loop stops that long); its encode_batch releases it and gives the same ids,
    at a few microseconds more per call, so long texts go through it."""
    encode, batch = hf.encode, hf.encode_batch

    def ids(text: str) -> list[int]:
        if len(text) < _GIL_FREE_CHARS:
            return encode(text, add_special_tokens=False).ids
        return batch([text], add_special_tokens=False)[0].ids
    return ids


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
        self.encode = _ids_of(hf)   # text -> ids, of plain text (special tokens were cut out by the caller)

    @staticmethod
    def token_bytes(text: str) -> bytes:
        """The bytes a normal vocabulary entry stands for."""
        try:
            return text.translate(_BYTE_DECODER).encode("latin-1")
        except UnicodeEncodeError:  # a char outside the byte map: keep it as UTF-8
            return b"".join(bytes([_BYTE_DECODER[ord(c)]]) if ord(c) in _BYTE_DECODER
                            else c.encode() for c in text)


_NEWLINES = re.compile(r"\n+")
_SPACE = "\u2581"


class _SpaceEscapedBPE:
    """Backend for `tokenizer.ggml.model == "gemma4"`: BPE merges over characters (not GPT-2's
    byte map) of text whose spaces are written U+2581, with <0xNN> tokens for the bytes of
    characters outside the vocabulary: SentencePiece's spelling, a BPE's merge table.

    llama.cpp (LLAMA_VOCAB_PRE_TYPE_GEMMA4) escapes the spaces, cuts the text into runs of
    newlines and runs of everything else ("[^\\n]+|[\\n]+") and merges within each; a newline
    run that is itself a vocabulary entry is that entry (merges would build some runs from
    other pieces). No space prefix; a BOS is always added (llama.cpp overrides add_bos=false).
    """

    add_space_prefix = False
    default_ids: dict[str, int] = {}
    default_add_bos = always_add_bos = True

    def __init__(self, meta: dict, tokens: list[str], vocab: dict[str, int], cache_path=None):
        merges = meta.get("tokenizer.ggml.merges")
        if merges is None:
            raise TokenizerError("tokenizer.ggml.merges is missing (needed by a gemma4 tokenizer)")
        # Pieces hold no literal space (it is U+2581), so the first space from the second
        # character on separates the pair, as llama.cpp splits it.
        pairs = []
        for m in merges:
            cut = m.find(" ", 1)
            if cut < 0:
                raise TokenizerError(f"tokenizer.ggml.merges entry {m!r} is not a pair")
            pairs.append((m[:cut], m[cut + 1:]))
        hf = _HFTokenizer(models.BPE(vocab, pairs, byte_fallback=True))
        self._hf_ids = _ids_of(hf)
        self._vocab = vocab

    def encode(self, text: str) -> list[int]:
        """Ids of plain text (special tokens were already cut out by the caller)."""
        text = text.replace(" ", _SPACE)
        ids: list[int] = []
        at = 0
        for m in _NEWLINES.finditer(text):
            if m.start() > at:
                ids.extend(self._hf_ids(text[at:m.start()]))
            run = m.group()
            whole = self._vocab.get(run)
            ids.extend([whole] if whole is not None else
                       self._hf_ids(run))
            at = m.end()
        if at < len(text):
            ids.extend(self._hf_ids(text[at:]))
        return ids

    @staticmethod
    def token_bytes(text: str) -> bytes:
        """The bytes a normal vocabulary entry stands for."""
        return text.replace(_SPACE, " ").encode()
