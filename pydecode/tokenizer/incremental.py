"""Streaming detokenization: ids one at a time, text only for complete characters."""
from __future__ import annotations

import codecs

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
