"""JSON that always closes within max_tokens.

A schema-constrained generation cut by max_tokens (or the context) used to end mid-string:
valid so far, unparseable. `ClosingBudget` keeps, beside one generation's Constraint, a
JsonCloser (json_closer.py) reading the output, and so knows at every step the shortest
completion's length in tokens. TokenPolicy (generation.py) keeps the invariant

    tokens of the shortest completion  <=  tokens the generation may still emit

by checking each chosen token (and the tokens the grammar then forces): one that would break
it is rolled back (llguidance's rollback, the closer's snapshot) and the shortest completion is
forced instead, in place of further sampling. The output then parses and validates, and its
finish_reason still says "length". A schema whose shortest output does not fit max_tokens at
all is refused before anything is generated.

The closing text is checked against the grammar before it is forced; if llguidance refuses it
(a schema feature the closer does not model), a search under the grammar's masks finishes the
value instead, preferring the characters that close things (logged: it should not happen).
"""
from __future__ import annotations

import codecs
import logging

from .json_closer import JsonCloser
from .tokenizer.common import CONTROL, UNKNOWN

log = logging.getLogger("pydecode")

# Characters the search tries first, in order: those that end a string / value / container,
# then the shortest values. It runs only where the closer's own text was refused.
_SEARCH_CHARS = '"}]0,:1a.-tfn[{'


class ClosingBudget:
    """The shortest-completion bookkeeping of one JSON-schema generation (see the module
    docstring). `read` every token the matcher consumed, in order."""

    def __init__(self, constraint, tokenizer, schema, frame=None):
        self.c, self.tokenizer = constraint, tokenizer
        if frame is not None:   # tool calls: the JSON inside the syntax's fixed text (chat/tools.py)
            from .chat.tools import FramedCloser
            self.closer = FramedCloser(schema, frame)
        else:
            self.closer = JsonCloser(schema)
        self._framed = frame is not None
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")
        self._read = 0            # tokens read (and consumed by the matcher)
        self.closed_tokens = 0    # tokens forced by a closing
        self._cache = (None, None)
        self._special = None
        self._bytes = None        # byte -> a token of that one byte

    def read(self, tokens) -> None:
        types = self.tokenizer._types
        for t in tokens:
            if types[t] not in (CONTROL, UNKNOWN):
                self.closer.feed(self._dec.decode(self.tokenizer.token_bytes(t)))
            elif self._framed:   # a control token may be a syntax's trigger ([TOOL_CALLS])
                self.closer.feed(self.tokenizer.token_bytes(t).decode("utf-8", "replace"))
        self._read += len(tokens)

    def mark(self):
        return self.closer.snapshot(), self._dec.getstate(), self._read

    def rollback(self, mark) -> None:
        """Undoes everything read (and consumed by the matcher) since mark."""
        snap, dec, n = mark
        if self._read > n:
            self.c.matcher.rollback(self._read - n)
        self.closer.restore(snap)
        self._dec.setstate(dec)
        self._read = n

    def _tokens(self, text: str) -> list[int]:
        if self._cache[0] != text:
            self._cache = (text, self.c.vocabulary(text.encode("utf-8")) if text else [])
        return self._cache[1]

    def closing(self) -> tuple[str, list[int]] | None:
        """The shortest completion now: (its text, its tokens); None when the closer cannot
        tell (then fits() says yes and close() searches)."""
        text = self.closer.closing()
        if text is None:
            return None
        return text, self._finish_char() + self._tokens(text)

    def _finish_char(self) -> list[int]:
        """Byte tokens that complete a character the output stopped inside (a token may end in
        the middle of a UTF-8 sequence; the grammar wants whole characters): [] when none."""
        pending = self._dec.getstate()[0]
        if not pending:
            return []
        lead = pending[0]
        need = (4 if lead >= 0xF0 else 3 if lead >= 0xE0 else 2) - len(pending)
        for first in (0x80, 0x90, 0xA0):
            tail = bytes([first]) + b"\x80" * (need - 1) if need > 0 else b""
            try:
                (pending + tail).decode("utf-8")
            except UnicodeDecodeError:
                continue
            ids = [self._byte_token(b) for b in tail]
            return ids if None not in ids else []
        return []

    def _byte_token(self, b: int):
        if self._bytes is None:
            toks = self.c.vocabulary.tokens
            self._bytes = {}
            for i in range(len(toks) - 1, -1, -1):   # (the lowest id of a byte wins)
                if len(toks[i]) == 1:
                    self._bytes[toks[i][0]] = i
        return self._bytes.get(b)

    def fits(self, limit: int) -> bool:
        """Whether the shortest completion takes at most `limit` tokens (a token holds at least
        one byte, so a text of at most `limit` bytes fits without tokenizing it)."""
        text = self.closer.closing()
        if text is None:
            return True
        if self._dec.getstate()[0]:
            got = self.closing()
            return got is None or len(got[1]) <= limit
        if len(text) <= limit and len(text.encode("utf-8")) <= limit:
            return True
        return len(self._tokens(text)) <= limit

    def close(self, limit: int) -> list[int]:
        """Forces the shortest completion (at most `limit` tokens): consumed by the matcher and
        read; returns its tokens."""
        m = self.c.matcher
        got = self.closing()
        if got is not None and len(got[1]) <= limit and m.validate_tokens(got[1]) == len(got[1]):
            m.consume_tokens(got[1])
            toks = list(got[1])
            if m.is_accepting():
                self.read(toks)
                self.closed_tokens += len(toks)
                return toks
            m.rollback(len(toks))
        log.warning("structured output: the shortest completion of %s (%r) was refused by the grammar; "
                    "searching for one instead", self.c.grammar.what, None if got is None else got[0])
        toks = self._search(limit)
        self.closed_tokens += len(toks)
        return toks

    def _search(self, limit: int) -> list[int]:
        """A completion found under the grammar's masks, one token at a time, preferring the
        characters that close values (_SEARCH_CHARS); at most `limit` tokens."""
        m, c, out = self.c.matcher, self.c, []
        if self._special is None:
            ids = [c.vocabulary(ch.encode()) for ch in _SEARCH_CHARS]
            self._special = [i[0] for i in ids if len(i) == 1]
        while len(out) < limit and not m.is_accepting() and not m.is_stopped():
            c._mask()
            pick = next((t for t in self._special if c._allows(t)), None)
            if pick is None:
                pick = next((t for t in range(c.n_vocab) if c._allows(t) and t not in self.tokenizer.eog_ids), None)
            if pick is None or not m.consume_token(pick):
                break
            self.read([pick])
            out.append(pick)
        return out
