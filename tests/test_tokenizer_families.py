"""Tokenizers of the new model families (issue 33): Gemma 4's (BPE over U+2581-escaped text),
gpt-oss's o200k with the gpt-4o pre-tokenizer against o200k's own ids, and the end-of-generation
and display rules of OpenAI harmony, all as llama.cpp applies them. The vocabularies come from
the conformance caches (tests/conformance.py); the common helpers from test_tokenizer."""
import functools
import json
from pathlib import Path

from pydecode.tokenizer import Tokenizer
from conformance import tokenizer_dir
from test_tokenizer import _gpt2_byte_chars, _tiny_meta, gguf_metadata, vocab_tokenizer


def test_gemma4_flags_specials_and_eog():
    tok = vocab_tokenizer("gemma-4")
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (2, 1, True, False)
    # <eos>, <turn|> and <|tool_response> end a generation; </s> is a normal token there.
    assert tok.eog_ids == {1, 106, 50}
    assert tok.encode("</s>", add_special=False) != [212] and not tok.is_special(212)
    text = "<|turn>user\nHi there<turn|>\n<|turn>model\n"
    ids = tok.encode(text)
    assert ids == [2, 105, 2364, 107, 10979, 993, 106, 107, 105, 4368, 107]
    assert tok.decode(ids) == "<bos>" + text and tok.decode(ids, skip_special=True) == "user\nHi there\nmodel\n"
    # No space prefix; spaces are U+2581 inside tokens; a newline run is one token when it is one.
    assert tok.encode("Hello", add_special=False) == [9259]
    assert tok.token_bytes(tok.encode(" Hello", add_special=False)[0]) == b" Hello"
    assert tok.encode("\n\n\n", add_special=False) == [109]
    # A character outside the vocabulary: its UTF-8 bytes as <0xNN> tokens, streamed whole.
    ids = tok.encode("a \U0001f999 b", add_special=False)
    assert [tok.token_bytes(i) for i in ids[2:6]] == [bytes([b]) for b in "\U0001f999".encode()]
    dec = tok.decoder()
    assert [dec.feed(i) for i in ids] == ["a", " ", "", "", "", "\U0001f999", " b"]
    # The reasoning's channel tags are user-defined: a generation streams them as text.
    ids = tok.encode("<|channel>thought\nhm<channel|>Four.", add_special=False)
    assert ids[0] == 100 and 101 in ids
    dec = tok.decoder(skip_special=True)
    assert "".join(dec.feed(i) for i in ids) == "<|channel>thought\nhm<channel|>Four."
    # Like llama.cpp, a BOS always: a file saying add_bos_token=false is overridden.
    meta = dict(gguf_metadata(tokenizer_dir() / "ggml-vocab-gemma-4.gguf"), **{"tokenizer.ggml.add_bos_token": False})
    assert Tokenizer.from_metadata(meta).encode("Hi") == [2, 10979]


def _harmony_meta() -> dict:
    """The byte vocabulary plus OpenAI harmony's markers, typed control as in gpt-oss files."""
    marks = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>",
             "<|constrain|>", "<|endoftext|>"]
    return _tiny_meta(**{"tokenizer.ggml.tokens": _gpt2_byte_chars() + marks,
                         "tokenizer.ggml.token_type": [1] * 256 + [3] * len(marks),
                         "tokenizer.ggml.eos_token_id": 256 + 4})


def test_harmony_end_markers_like_llama_cpp():
    tok = Tokenizer.from_metadata(_harmony_meta())
    start, channel, message, end, ret, call, constrain, eot = range(256, 264)
    # <|return|> and <|call|> end a generation; <|end|> only closes the analysis message.
    assert tok.eog_ids == {ret, call, eot}
    # The structure markers are shown as text (skip_special keeps them) so that the reasoning
    # parser can read the channels, and they match in text like user-defined tokens.
    text = "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>4"
    ids = tok.encode(text, add_special=False)
    assert [i for i in ids if i >= 256] == [channel, message, end, start, channel, message]
    assert tok.decode(ids + [ret], skip_special=True) == text
    assert all(tok.is_special(i) for i in (start, channel, message, end, constrain))
    # Without both harmony ends (Phi-3 has <|end|>), <|end|> stays an end-of-generation control.
    meta = _harmony_meta()
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"][:260] + ["x1", "x2", "x3", "x4"]
    phi = Tokenizer.from_metadata(meta)
    assert end in phi.eog_ids and phi.decode([end], skip_special=True) == ""


@functools.lru_cache(maxsize=None)
def o200k_tokenizer() -> Tokenizer:
    from conformance import o200k_metadata
    return Tokenizer.from_metadata(o200k_metadata())


def test_o200k_gpt4o_pre_tokenizer_matches_tiktoken():
    # gpt-oss / Phi-4-mini (tokenizer.ggml.pre gpt-4o): ids of o200k's own tokenizer for
    # llama.cpp's suite strings and mixed-case, combining-mark and non-Latin texts. (llama.cpp
    # approximates the upper/lower letter classes with ASCII lookaheads and differs on such
    # texts, e.g. "naïve Ïve" or Hindi; this follows the tokenizer the model was trained with.)
    cases = json.loads((Path(__file__).parent / "data" / "o200k" / "ids.json").read_text())["cases"]
    tok = o200k_tokenizer()
    bad = [(text, tok.encode(text, add_special=False, parse_special=False), ids) for text, ids in cases
           if tok.encode(text, add_special=False, parse_special=False) != ids]
    assert not bad, f"{len(bad)}/{len(cases)} differ: {bad[:3]}"
    for text, ids in cases:
        assert tok.decode(ids) == text


def test_o200k_harmony_tokens():
    tok = o200k_tokenizer()
    assert tok.eog_ids == {199999, 200002, 200012}      # <|endoftext|>, <|return|>, <|call|>; not <|end|>
    assert not tok.add_bos
    text = ("<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant<|channel|>analysis<|message|>"
            "Add.<|end|><|start|>assistant<|channel|>final<|message|>4")
    ids = tok.encode(text, add_special=False)
    assert [i for i in ids if i >= 199998] == [200006, 200008, 200007, 200006, 200005, 200008, 200007, 200006,
                                                200005, 200008]
    # What a generation streams (skip_special, as the engine decodes) keeps the channel markers.
    dec = tok.decoder(skip_special=True)
    shown = "".join(dec.feed(i) for i in ids[ids.index(200005) - 1:] + [200002]) + dec.flush()
    assert shown == text[text.index("assistant<|channel|>analysis"):]
    from pydecode.chat.reasoning import HARMONY, split_reasoning
    assert split_reasoning(shown[len("assistant"):], HARMONY) == ("Add.", "4")
