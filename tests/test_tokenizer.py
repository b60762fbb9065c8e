"""Tokenizer tests: llama.cpp's own tokenizer suite (fetched once into the cache from PyPI's
llama-cpp-python sdist, see tests/conformance.py), round trips, special tokens, end-of-generation
ids and streaming detokenization."""
import functools
import os
import time
from pathlib import Path

import pytest

from pydecode.gguf_file import GGUFFile
from pydecode import tokenizer as tokenizer_module
from pydecode.tokenizer import _PRE_TOKENIZERS, Tokenizer, TokenizerError
from conformance import tokenizer_dir

SEPARATOR = "\n__ggml_vocab_test__\n"
# Every byte-level BPE (tokenizer.ggml.model = gpt2) vocabulary of the suite.
BPE_VOCABS = ["gpt-2", "llama-bpe", "qwen2", "qwen35", "deepseek-coder", "deepseek-llm",
              "starcoder", "falcon", "refact", "mpt"]
# Every SentencePiece (tokenizer.ggml.model = llama) vocabulary of the suite.
SPM_VOCABS = ["llama-spm", "phi-3"]
# BPE merges over SentencePiece-spelt text (tokenizer.ggml.model = gemma4).
SPACE_ESCAPED_BPE_VOCABS = ["gemma-4"]
ALL_VOCABS = BPE_VOCABS + SPM_VOCABS + SPACE_ESCAPED_BPE_VOCABS

ROUND_TRIP_TEXTS = [
    "Hello, world! It's 2024; isn't it?",
    "naïve café, Ångström, Ελληνικά, русский, Việt",
    "日本語のテキスト、中文，한국어",
    "emoji 🤖🎉👍🏽 and a family 👨‍👩‍👧",
    "def f(x):\n\tif x:\n\t\treturn x  # tab\r\n\n   trailing   ",
    "",
    " leading space, double  space,\u00a0nbsp, zero\u200bwidth",
    "control bytes \x00\x01\x7f and <|not a token|>",
]


def gguf_metadata(path: Path) -> dict:
    """GGUF key/values as plain Python (strings, ints, lists), as Tokenizer.from_metadata wants."""
    g = GGUFFile(path)
    try:
        return g.metadata
    finally:
        g.close()


@functools.lru_cache(maxsize=None)
def vocab_tokenizer(name: str) -> Tokenizer:
    return Tokenizer.from_metadata(gguf_metadata(tokenizer_dir() / f"ggml-vocab-{name}.gguf"))


def conformance_cases(name: str) -> list[tuple[str, list[int]]]:
    """(text, expected ids) pairs: the .inp file holds the strings, separated by the line
    __ggml_vocab_test__ (after the last one too, except in gemma-4's file: llama.cpp's reader,
    test-tokenizer-0.cpp, takes both); the .out file one line of space-separated ids per string."""
    with open(tokenizer_dir() / f"ggml-vocab-{name}.gguf.inp", encoding="utf-8", newline="") as f:
        texts = f.read().split(SEPARATOR)
    if texts[-1] == "":
        texts = texts[:-1]
    lines = (tokenizer_dir() / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and len(lines) - 1 == len(texts), f"{name}: .inp/.out counts differ"
    return [(text, [int(x) for x in line.split()]) for text, line in zip(texts, lines)]


# ------------------------------------------------------------------ llama.cpp conformance

@pytest.mark.parametrize("name", ALL_VOCABS)
def test_llama_cpp_conformance(name):
    """Every string of llama.cpp's test-tokenizer-0 gives exactly llama.cpp's ids."""
    tok = vocab_tokenizer(name)
    cases = conformance_cases(name)
    failures = []
    for k, (text, expected) in enumerate(cases):
        got = tok.encode(text, add_special=False, parse_special=False)
        if got != expected:
            failures.append(f"  #{k} {text!r}\n     got      {got}\n     expected {expected}")
    assert not failures, f"{name}: {len(failures)}/{len(cases)} strings differ:\n" + "\n".join(failures)


@pytest.mark.parametrize("name", ALL_VOCABS)
def test_conformance_strings_round_trip(name):
    tok = vocab_tokenizer(name)
    for text, expected in conformance_cases(name):
        assert tok.decode(expected) == text


def test_every_vocab_of_the_suite_is_tested():
    models = {p.name[len("ggml-vocab-"):-len(".gguf")]: gguf_metadata(p).get("tokenizer.ggml.model")
              for p in tokenizer_dir().glob("ggml-vocab-*.gguf")}
    assert {name for name, model in models.items() if model == "gpt2"} == set(BPE_VOCABS)
    assert {name for name, model in models.items() if model == "llama"} == set(SPM_VOCABS)
    assert {name for name, model in models.items() if model == "gemma4"} == set(SPACE_ESCAPED_BPE_VOCABS)
    assert set(models.values()) == {"gpt2", "llama", "gemma4"}


# ------------------------------------------------------------------ round trips, specials

@pytest.mark.parametrize("name", ["gpt-2", "llama-bpe", "qwen2", "qwen35", "llama-spm", "phi-3",
                                  "gemma-4"])
@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_round_trip(name, text):
    tok = vocab_tokenizer(name)
    ids = tok.encode(text, add_special=False)
    assert tok.decode(ids) == text
    # SentencePiece (add_space_prefix) tokens spell the text with the space encode put first.
    prefix = " " if name in SPM_VOCABS and text else ""
    assert b"".join(tok.token_bytes(i) for i in ids) == (prefix + text).encode()
    with_bos = tok.encode(text)
    assert tok.decode(with_bos, skip_special=True) == text
    if tok.add_bos:
        assert with_bos[0] == tok.bos_id and tok.decode(with_bos) == tok.decode([tok.bos_id]) + text


def test_bos_and_control_tokens_llama3():
    tok = vocab_tokenizer("llama-bpe")
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (128000, 128001, True, False)
    ids = tok.encode("hi")
    assert ids[0] == 128000 and tok.decode(ids) == "<|begin_of_text|>hi"
    assert tok.decode(ids, skip_special=True) == "hi"
    assert tok.encode("hi", add_special=False) == ids[1:]

    text = "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
    ids = tok.encode(text, add_special=False)
    assert ids[0] == 128006 and 128007 in ids and ids[-1] == 128009
    assert tok.decode(ids) == text
    plain = tok.encode(text, add_special=False, parse_special=False)
    assert not any(tok.is_special(i) for i in plain) and tok.decode(plain) == text
    assert tok.is_special(128009) and not tok.is_special(plain[0])
    assert {128001, 128009} <= tok.eog_ids  # <|end_of_text|> (eos) and <|eot_id|>


def test_user_defined_tokens_match_even_without_parse_special():
    # MPT (NeoX) has user-defined whitespace runs; llama.cpp and HF always cut them out.
    tok = vocab_tokenizer("mpt")
    spaces = tok.encode("     ", add_special=False, parse_special=False)
    assert len(spaces) == 1 and tok.is_special(spaces[0])
    ids = tok.encode("a     b", add_special=False, parse_special=False)
    assert spaces[0] in ids and tok.decode(ids) == "a     b"
    assert tok.decode(ids, skip_special=True) == "a     b"  # user-defined tokens are text


def _gpt2_byte_chars() -> list[str]:
    """GPT-2's byte -> character map: printable Latin-1 stays, the rest moves to U+0100+."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    moved = [b for b in range(256) if b not in keep]
    chars = {b: chr(b) for b in keep} | {b: chr(0x100 + i) for i, b in enumerate(moved)}
    return [chars[b] for b in range(256)]


def _tiny_meta(**extra) -> dict:
    """A byte-level vocabulary of the 256 bytes (id = byte) plus three special tokens."""
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": _gpt2_byte_chars() + ["xy", "yzzz", "<|ctl|>"],
        "tokenizer.ggml.token_type": [1] * 256 + [4, 4, 3],
        "tokenizer.ggml.merges": [],
    }
    meta.update(extra)
    return meta


def test_special_tokens_are_cut_longest_first_like_llama_cpp():
    tok = Tokenizer.from_metadata(_tiny_meta())
    # llama.cpp takes the longest special first ("yzzz"), not the leftmost ("xy").
    assert tok.encode("xyzzz", add_special=False) == [ord("x"), 257]
    assert tok.encode("a<|ctl|>b", add_special=False) == [ord("a"), 258, ord("b")]
    assert tok.encode("a<|ctl|>b", add_special=False, parse_special=False) == list(b"a<|ctl|>b")
    assert tok.decode([0xC3, 0xA9, 258, 32]) == "é<|ctl|> "
    assert tok.decode([258], skip_special=True) == ""
    assert tok.token_bytes(0x20) == b" " and tok.token_bytes(258) == b"<|ctl|>"
    with pytest.raises(TokenizerError):
        tok.token_bytes(259)
    with pytest.raises(TokenizerError):
        tok.token_bytes(-1)


def test_add_bos_defaults_per_pre_tokenizer():
    bos = {"tokenizer.ggml.bos_token_id": 258}
    assert Tokenizer.from_metadata(_tiny_meta(**{"tokenizer.ggml.pre": "llama-bpe"}, **bos)).add_bos
    assert not Tokenizer.from_metadata(_tiny_meta(**bos)).add_bos  # gpt-2
    assert not Tokenizer.from_metadata(_tiny_meta(**{"tokenizer.ggml.pre": "llama-bpe",
                                                     "tokenizer.ggml.add_bos_token": False}, **bos)).add_bos
    tok = Tokenizer.from_metadata(_tiny_meta(**{"tokenizer.ggml.add_bos_token": True}, **bos))
    assert tok.encode("a") == [258, ord("a")]


@pytest.mark.parametrize("pre", sorted(_PRE_TOKENIZERS))
def test_every_known_pre_tokenizer_builds_and_round_trips(pre):
    # Compiles each regex list (Oniguruma) and splits real text with it.
    tok = Tokenizer.from_metadata(_tiny_meta(**{"tokenizer.ggml.pre": pre}))
    for text in ROUND_TRIP_TEXTS:
        assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("meta, message", [
    (_tiny_meta(**{"tokenizer.ggml.model": "bert"}), "'bert'"),
    (_tiny_meta(**{"tokenizer.ggml.pre": "no-such-pre"}), "'no-such-pre'"),
    (_tiny_meta(**{"tokenizer.ggml.tokens": []}), "tokenizer.ggml.tokens"),
    (_tiny_meta(**{"tokenizer.ggml.add_bos_token": True}), "bos_token_id"),
    (_tiny_meta(**{"tokenizer.ggml.merges": None}), "merges"),
])
def test_bad_metadata_is_named(meta, message):
    with pytest.raises(TokenizerError, match=message):
        Tokenizer.from_metadata(meta)


# ------------------------------------------------------------------ SentencePiece

# Ids from llama.cpp itself (libllama of the vendored tree, llama_tokenize), for special-token
# handling that the suite (add_special=False, parse_special=False) does not cover.
LLAMA_CPP_SPM_IDS = [
    # Phi-3: special tokens swallow the whitespace after them (llama.cpp: RSTRIP by model name),
    # except <s>/<unk>/<|endoftext|>; "</s>" is an end-of-generation marker, so control.
    ("phi-3", "<|user|>\nHello<|end|>\n<|assistant|>  Hi</s>  x", True, True,
     [1, 32010, 15043, 32007, 32001, 6324, 2, 921]),
    ("phi-3", "<|user|>\nHello<|end|>\n<|assistant|>  Hi</s>  x", False, False,
     [529, 29989, 1792, 29989, 29958, 13, 10994, 29966, 29989, 355, 29989, 29958, 13, 29966, 29989,
      465, 22137, 29989, 29958, 29871, 6324, 829, 29879, 29958, 29871, 921]),
    # A space prefix is put before every text fragment, also after a special token.
    ("llama-spm", "<s>[INST] Hi [/INST] Hello</s>", True, True,
     [1, 1, 518, 25580, 29962, 6324, 518, 29914, 25580, 29962, 15043, 2]),
    ("llama-spm", "<s>[INST] Hi [/INST] Hello</s>", False, False,
     [529, 29879, 24566, 25580, 29962, 6324, 518, 29914, 25580, 29962, 15043, 829, 29879, 29958]),
    ("llama-spm", "\u20ac \U0001f999", True, True, [1, 25540, 29871, 243, 162, 169, 156]),
]


@pytest.mark.parametrize("name, text, add_special, parse_special, expected", LLAMA_CPP_SPM_IDS)
def test_sentencepiece_special_tokens_like_llama_cpp(name, text, add_special, parse_special,
                                                     expected):
    tok = vocab_tokenizer(name)
    assert tok.encode(text, add_special=add_special, parse_special=parse_special) == expected
    if name == "llama-spm":  # nothing stripped: lossless
        assert tok.decode(expected) == ("<s>" if add_special else "") + text


def test_sentencepiece_flags_and_eog():
    llama, phi3 = vocab_tokenizer("llama-spm"), vocab_tokenizer("phi-3")
    assert (llama.bos_id, llama.eos_id, llama.add_bos, llama.add_eos) == (1, 2, True, False)
    assert llama.eog_ids == {2}
    assert (phi3.bos_id, phi3.eos_id) == (1, 32000)
    assert phi3.eog_ids == {2, 32000, 32007}  # </s>, <|endoftext|>, <|end|> (as llama.cpp)
    assert phi3.is_special(32010) and not phi3.is_special(15043)
    ids = phi3.encode("<|user|>\nHi<|end|>")
    assert phi3.decode(ids, skip_special=True) == "Hi"
    assert phi3.decode(ids) == "<s><|user|>Hi<|end|>"  # the newline was swallowed by <|user|>


def test_sentencepiece_byte_fallback_decodes_bytes():
    tok = vocab_tokenizer("llama-spm")
    llama = "\U0001f999"  # not in the vocabulary: four <0xNN> tokens
    ids = tok.encode(llama, add_special=False)
    assert ids == [29871, 243, 162, 169, 156]  # "▁", <0xF0> <0x9F> <0xA6> <0x99>
    assert [tok.token_bytes(i) for i in ids[1:]] == [bytes([b]) for b in llama.encode()]
    assert tok.decode(ids) == llama

    # "€" spelt as bytes (the vocabulary has a token for it, but a model may emit these).
    euro = [3 + 0xE2, 3 + 0x82, 3 + 0xAC]
    assert tok.decode(euro) == "€" and tok.decode(euro[:2]) == "\ufffd"
    dec = tok.decoder(start=True)
    assert [dec.feed(i) for i in [15043, *euro, 29871, *ids[1:]]] == ["Hello", "", "", "€", " ",
                                                                        "", "", "", llama]
    assert dec.flush() == ""
    dec = tok.decoder()
    assert dec.feed(euro[0]) == "" and dec.flush() == "\ufffd"


def test_sentencepiece_leading_space_rules():
    tok = vocab_tokenizer("llama-spm")
    hello = tok.encode("Hello", add_special=False)
    assert hello == [15043] and tok.token_bytes(15043) == b" Hello"
    assert tok.decode(hello) == "Hello"  # the prefix encode added
    assert tok.decode(tok.encode(" Hello", add_special=False)) == " Hello"
    assert tok.decode([1, 15043]) == "<s>Hello" and tok.decode([1, 15043], skip_special=True) == "Hello"
    assert tok.decode([15043, 15043]) == "Hello Hello"
    # Streaming a continuation keeps the space ("The capital of France is" + " Paris").
    dec = tok.decoder()
    assert dec.feed(15043) + dec.feed(15043) + dec.flush() == " Hello Hello"
    # After a special token a new text fragment starts, as in encode.
    dec = tok.decoder(skip_special=True)
    assert [dec.feed(i) for i in (15043, 2, 15043)] == [" Hello", "", "Hello"]


def _spm_meta(**extra) -> dict:
    """A small SentencePiece vocabulary: <unk> <s> </s>, the 256 bytes, a few merges."""
    words = ["\u2581", "a", "b", "c", "ab", "\u2581a", "\u2581ab", "bc", "<ctl>"]
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + words,
        "tokenizer.ggml.scores": [0.0] * 259 + [-1.0, -2.0, -2.0, -2.0, -3.0, -4.0, -5.0, -3.5, 0.0],
        "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * 8 + [3],
    }
    meta.update(extra)
    return meta


def test_sentencepiece_synthetic_vocabulary():
    tok = Tokenizer.from_metadata(_spm_meta())
    # llama.cpp's defaults when the file says nothing: BOS 1 added, EOS 2, space prefix on.
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (1, 2, True, False)
    a, b, c, ab, sp_a, sp_ab, bc, ctl = range(260, 268)
    assert tok.encode("abc") == [1, sp_ab, c]  # merges by score: "▁a"+"b" beat "b"+"c"
    assert tok.encode("abc", add_special=False) == [sp_ab, c]
    assert tok.encode("bc", add_special=False) == [259, bc]  # "▁" alone: no "▁b"
    assert tok.encode("a<ctl>a", add_special=False) == [sp_a, ctl, sp_a]
    assert tok.encode("é", add_special=False) == [259, 3 + 0xC3, 3 + 0xA9]  # byte fallback
    for text in ["abc", " a  b ", "é<ctl>c", "", "<ctl>"]:
        assert tok.decode(tok.encode(text)) == "<s>" + text
        assert tok.decode(tok.encode(text, add_special=False)) == text

    off = Tokenizer.from_metadata(_spm_meta(**{"tokenizer.ggml.add_space_prefix": False,
                                               "tokenizer.ggml.add_bos_token": False}))
    assert off.encode("abc") == [ab, c] and off.decode([ab, c]) == "abc"
    assert off.encode("a<ctl> a", add_special=False) == [a, ctl, sp_a]
    assert off.decode([sp_a]) == " a"


def test_sentencepiece_odd_vocabularies():
    meta = _spm_meta()
    tokens, types = list(meta["tokenizer.ggml.tokens"]), list(meta["tokenizer.ggml.token_type"])
    # A duplicate entry: like llama.cpp, the text means the last id.
    dup = Tokenizer.from_metadata(_spm_meta(**{"tokenizer.ggml.tokens": tokens + ["ab"],
                                               "tokenizer.ggml.scores": meta["tokenizer.ggml.scores"] + [9.0],
                                               "tokenizer.ggml.token_type": types + [1],
                                               "tokenizer.ggml.add_space_prefix": False}))
    assert dup.encode("ab", add_special=False) == [268] and dup.decode([263]) == "ab"
    # No byte tokens: characters outside the vocabulary become <unk>.
    nobytes = Tokenizer.from_metadata({
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "\u2581", "a"],
        "tokenizer.ggml.token_type": [2, 3, 3, 1, 1]})
    assert nobytes.encode("aé", add_special=False) == [3, 4, 0]
    with pytest.raises(TokenizerError, match="scores has 3 entries"):
        Tokenizer.from_metadata(_spm_meta(**{"tokenizer.ggml.scores": [0.0] * 3}))


def _cache_roundtrip_meta():
    return gguf_metadata(tokenizer_dir() / "ggml-vocab-llama-spm.gguf")


def test_sentencepiece_cache(tmp_path, monkeypatch):
    import sentencepiece

    meta = _cache_roundtrip_meta()
    cache = tmp_path / "model.gguf.spm.model"
    first = Tokenizer.from_metadata(meta, cache_path=cache)
    assert cache.is_file() and not list(tmp_path.glob("*.tmp"))
    data = cache.read_bytes()
    # The cache is a plain SentencePiece model: it loads and tokenizes on its own.
    sp = sentencepiece.SentencePieceProcessor(model_file=str(cache))
    assert sp.encode("\u2581Hello\u2581world") == first.encode("Hello world", add_special=False)

    # Second load: from the cache, without building anything.
    def no_build(*args):
        raise AssertionError("the proto was rebuilt although the cache is valid")

    with monkeypatch.context() as m:
        m.setattr(tokenizer_module._SentencePiece, "_pieces_proto", staticmethod(no_build))
        again = Tokenizer.from_metadata(meta, cache_path=cache)
    assert again.encode("Hello world") == first.encode("Hello world")

    # A different vocabulary never reuses it: the cache is rebuilt for the new one.
    changed = dict(meta)
    tokens = list(meta["tokenizer.ggml.tokens"])
    tokens[15043] = "\u2581Hellp"  # was "▁Hello"
    changed["tokenizer.ggml.tokens"] = tokens
    other = Tokenizer.from_metadata(changed, cache_path=cache)
    assert other.encode("Hello", add_special=False) != [15043]
    assert cache.read_bytes() != data
    assert Tokenizer.from_metadata(meta, cache_path=cache).encode("Hello", add_special=False) == [15043]

    # So does a change of scores alone.
    rescored = dict(meta)
    rescored["tokenizer.ggml.scores"] = [x - 1.0 for x in meta["tokenizer.ggml.scores"]]
    Tokenizer.from_metadata(rescored, cache_path=cache)
    assert cache.read_bytes() != data
    Tokenizer.from_metadata(meta, cache_path=cache)
    assert cache.read_bytes() == data

    # A damaged or truncated cache is rebuilt, not trusted.
    for bad in (data[:len(data) // 2], data[:-1] + bytes([data[-1] ^ 1]), b"", b"junk" * 10):
        cache.write_bytes(bad)
        assert Tokenizer.from_metadata(meta, cache_path=cache).encode("Hello") == [1, 15043]
        assert cache.read_bytes() == data


def test_sentencepiece_cache_in_unwritable_place(tmp_path):
    meta = _cache_roundtrip_meta()
    missing_dir = tmp_path / "no" / "such" / "dir" / "m.spm.model"
    assert Tokenizer.from_metadata(meta, cache_path=missing_dir).encode("Hi") == [1, 6324]
    assert not missing_dir.parent.exists()
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        try:
            assert Tokenizer.from_metadata(meta, cache_path=ro / "m.spm.model").encode("Hi") == [1, 6324]
            assert list(ro.iterdir()) == []
        finally:
            ro.chmod(0o755)


# ------------------------------------------------------------------ streaming

def test_incremental_decoder_emits_whole_characters_once():
    tok = vocab_tokenizer("gpt-2")
    text = "Streaming: 你好世界 🤖🎉 naïve ok 👍🏽!"
    ids = tok.encode(text, add_special=False)
    # The test needs tokens that end inside a character.
    assert any(_invalid_utf8(tok.token_bytes(i)) for i in ids)
    dec = tok.decoder()
    outs = [dec.feed(i) for i in ids] + [dec.flush()]
    assert "".join(outs) == tok.decode(ids) == text
    assert not any("\ufffd" in out for out in outs)


def test_incremental_decoder_flush_and_skip():
    tok = vocab_tokenizer("gpt-2")
    first = tok.encode("🤖", add_special=False)[0]
    dec = tok.decoder()
    assert dec.feed(first) == "" and dec.flush() == "\ufffd"

    llama = vocab_tokenizer("llama-bpe")
    ids = llama.encode("hi<|eot_id|>")
    dec = llama.decoder(skip_special=True)
    assert "".join(dec.feed(i) for i in ids) + dec.flush() == "hi"


def _invalid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


# ------------------------------------------------------------------ speed

def test_build_and_encode_speed():
    meta = gguf_metadata(tokenizer_dir() / "ggml-vocab-starcoder.gguf")  # 49k tokens, like SmolLM2
    t0 = time.perf_counter()
    tok = Tokenizer.from_metadata(meta)
    t1 = time.perf_counter()
    text = "\n".join(ROUND_TRIP_TEXTS) * 12  # ~4 KB
    tok.encode(text)
    t2 = time.perf_counter()
    assert t1 - t0 < 1.0, f"construction took {t1 - t0:.2f} s"
    assert t2 - t1 < 0.1, f"encoding {len(text)} chars took {t2 - t1:.3f} s"


# ------------------------------------------------------------------ SmolLM2 (a real model)

def test_smollm2_chat_tokens(smollm_path):
    tok = Tokenizer.from_metadata(gguf_metadata(smollm_path))
    im_start, im_end, endoftext = 1, 2, 0  # SmolLM2's vocabulary
    assert tok.token_bytes(im_start) == b"<|im_start|>" and tok.token_bytes(im_end) == b"<|im_end|>"
    assert tok.token_bytes(endoftext) == b"<|endoftext|>"
    assert tok.vocab_size == 49152 and not tok.add_bos and not tok.add_eos

    text = "<|im_start|>user\nHi<|im_end|>"
    ids = tok.encode(text)
    assert ids[0] == im_start and ids[-1] == im_end
    assert ids.count(im_start) == ids.count(im_end) == 1
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special=True) == "user\nHi"
    plain = tok.encode(text, parse_special=False)
    assert im_start not in plain and im_end not in plain and tok.decode(plain) == text

    assert {im_end, endoftext} <= tok.eog_ids and im_start not in tok.eog_ids
    for text in ROUND_TRIP_TEXTS:
        assert tok.decode(tok.encode(text)) == text


# ------------------------------------------------------------------ Gemma 3 (SentencePiece, 262k)

GEMMA_TEXT = ("Hello world! naïve café, Grüße aus Köln. Привет, мир! 你好，世界！ こんにちは世界。 "
              "مرحبا بالعالم 🤖👍🏽\n\tdef f(x):\n\t\treturn x  # done\n")
# llama.cpp's ids (llama_tokenize of the vendored libllama on this GGUF, add_special and
# parse_special on): "\n", "\t", runs of spaces and some HTML tags are user-defined tokens there.
GEMMA_IDS = {
    GEMMA_TEXT: [2, 9259, 1902, 236888, 120362, 33443, 236764, 212270, 5581, 115362, 236761, 15745,
                 8362, 236764, 58562, 236888, 43758, 237389, 236900, 12811, 237354, 79433, 12811,
                 236924, 150423, 107602, 17193, 236743, 246143, 240493, 242713, 107, 255968, 2063,
                 517, 236769, 236781, 1473, 107, 255969, 2060, 1123, 138, 236865, 3028, 107],
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n":
        [2, 105, 2364, 107, 10979, 106, 107, 105, 4368, 107],
    "\u20ac \U0001f999 <table>  x": [2, 237762, 236743, 478, 397, 404, 391, 236743, 168, 138, 236781],
}
GEMMA_MORE_TEXTS = [
    "Ελληνικά, Việt Nam, हिन्दी, ไทย, 한국어, עברית",
    "mixed\r\nline endings\rand\u00a0nbsp\u200bzwsp",
    "<bos>literal<eos> <pad> <mask> [multimodal] <unused7> </s> <s>",
    "```python\nclass A:\n    def __init__(self):\n        self.x = {'k': [1, 2, 3]}\n```\n",
]


@pytest.fixture(scope="module")
def gemma(gemma_path, tmp_path_factory):
    return Tokenizer.from_metadata(gguf_metadata(gemma_path),
                                   cache_path=tmp_path_factory.mktemp("spm") / "gemma.spm.model")


@pytest.mark.parametrize("text", list(GEMMA_IDS))
def test_gemma3_ids_match_llama_cpp(gemma, text):
    expected = GEMMA_IDS[text]
    assert gemma.encode(text) == expected
    assert gemma.decode(expected) == "<bos>" + text
    assert gemma.decode(expected, skip_special=True) == text.replace("<start_of_turn>", "").replace(
        "<end_of_turn>", "")


def test_gemma3_chat_tokens_and_flags(gemma):
    assert gemma.vocab_size == 262144
    assert (gemma.bos_id, gemma.eos_id, gemma.add_bos, gemma.add_eos) == (2, 1, True, False)
    assert gemma.encode("<start_of_turn>", add_special=False) == [105]
    assert gemma.encode("<end_of_turn>", add_special=False) == [106]
    assert gemma.is_special(105) and gemma.is_special(106) and gemma.is_special(2)
    assert {1, 106} <= gemma.eog_ids and 105 not in gemma.eog_ids  # <eos>, <end_of_turn>
    # As text (parse_special=False) the markers are spelt out; no space prefix for Gemma.
    plain = gemma.encode("<start_of_turn>user", add_special=False, parse_special=False)
    assert 105 not in plain and gemma.decode(plain) == "<start_of_turn>user"
    assert gemma.encode("Hello", add_special=False) == [9259]  # "Hello", not "▁Hello"


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS + GEMMA_MORE_TEXTS + list(GEMMA_IDS))
def test_gemma3_round_trip(gemma, text):
    for parse_special in (True, False):
        ids = gemma.encode(text, parse_special=parse_special)
        assert ids[0] == 2 and gemma.decode(ids) == "<bos>" + text
        assert gemma.decode(ids[1:]) == text
        dec = gemma.decoder()
        assert "".join(dec.feed(i) for i in ids) + dec.flush() == "<bos>" + text


def test_gemma3_streams_byte_fallback(gemma):
    ids = gemma.encode("a 🦙 b", add_special=False)  # no token for the llama: 4 byte tokens
    assert [gemma.token_bytes(i) for i in ids[2:6]] == [bytes([b]) for b in "🦙".encode()]
    dec = gemma.decoder()
    assert [dec.feed(i) for i in ids] == ["a", " ", "", "", "", "🦙", " b"]


def test_gemma3_build_cache_and_encode_speed(gemma_path, tmp_path):
    meta = gguf_metadata(gemma_path)
    cache = tmp_path / "gemma.spm.model"
    t0 = time.perf_counter()
    built = Tokenizer.from_metadata(meta, cache_path=cache)
    t1 = time.perf_counter()
    cached = Tokenizer.from_metadata(meta, cache_path=cache)
    t2 = time.perf_counter()
    text = ("\n".join(ROUND_TRIP_TEXTS + GEMMA_MORE_TEXTS) + GEMMA_TEXT) * 5  # ~4 KB
    ids = cached.encode(text)
    t3 = time.perf_counter()
    assert ids == built.encode(text) and cached.decode(ids[1:]) == text
    assert t1 - t0 < 3.0, f"building the SentencePiece model took {t1 - t0:.2f} s"
    assert t2 - t1 < 1.0, f"loading it from the cache took {t2 - t1:.2f} s"
    assert t3 - t2 < 0.1, f"encoding {len(text)} chars took {t3 - t2:.3f} s"
