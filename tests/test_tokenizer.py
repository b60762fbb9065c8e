"""Tokenizer tests: llama.cpp's own tokenizer suite (../shared/conformance/tokenizer), round
trips, special tokens, end-of-generation ids and streaming detokenization."""
import functools
import time
from pathlib import Path

import pytest

from pydecode.gguf_file import GGUFFile
from pydecode.tokenizer import _PRE_TOKENIZERS, Tokenizer, TokenizerError

CONFORMANCE = Path(__file__).resolve().parents[1].parent / "shared" / "conformance" / "tokenizer"
SEPARATOR = "\n__ggml_vocab_test__\n"
# Every byte-level BPE (tokenizer.ggml.model = gpt2) vocabulary of the suite.
BPE_VOCABS = ["gpt-2", "llama-bpe", "qwen2", "deepseek-coder", "deepseek-llm", "starcoder",
              "falcon", "refact", "mpt"]

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
    return Tokenizer.from_metadata(gguf_metadata(CONFORMANCE / f"ggml-vocab-{name}.gguf"))


def conformance_cases(name: str) -> list[tuple[str, list[int]]]:
    """(text, expected ids) pairs; see ../shared/conformance/README.md for the format."""
    texts = (CONFORMANCE / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split(SEPARATOR)
    assert texts[-1] == "", "the .inp file must end with a separator"
    texts = texts[:-1]
    lines = (CONFORMANCE / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and len(lines) - 1 == len(texts), f"{name}: .inp/.out counts differ"
    return [(text, [int(x) for x in line.split()]) for text, line in zip(texts, lines)]


# ------------------------------------------------------------------ llama.cpp conformance

@pytest.mark.parametrize("name", BPE_VOCABS)
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


@pytest.mark.parametrize("name", BPE_VOCABS)
def test_conformance_strings_round_trip(name):
    tok = vocab_tokenizer(name)
    for text, expected in conformance_cases(name):
        assert tok.decode(expected) == text


def test_every_bpe_vocab_of_the_suite_is_tested():
    bpe = {p.name[len("ggml-vocab-"):-len(".gguf")] for p in CONFORMANCE.glob("ggml-vocab-*.gguf")
           if gguf_metadata(p).get("tokenizer.ggml.model") == "gpt2"}
    assert bpe == set(BPE_VOCABS)


@pytest.mark.parametrize("name", ["llama-spm", "phi-3"])
def test_sentencepiece_is_refused_cleanly(name):
    # TODO: becomes a conformance vocab once the SentencePiece ("llama") backend exists.
    meta = gguf_metadata(CONFORMANCE / f"ggml-vocab-{name}.gguf")
    with pytest.raises(TokenizerError, match="'llama'.*not yet supported"):
        Tokenizer.from_metadata(meta)


# ------------------------------------------------------------------ round trips, specials

@pytest.mark.parametrize("name", ["gpt-2", "llama-bpe", "qwen2"])
@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_round_trip(name, text):
    tok = vocab_tokenizer(name)
    ids = tok.encode(text, add_special=False)
    assert tok.decode(ids) == text
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode()


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
    meta = gguf_metadata(CONFORMANCE / "ggml-vocab-starcoder.gguf")  # 49k tokens, like SmolLM2
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
