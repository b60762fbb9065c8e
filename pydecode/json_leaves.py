"""The shortest characters that complete a JSON string or number under its schema.

`string_rest` and `number_rest` serve json_closer.py: an enum's or const's rest, minLength, a
format (as the regexes llguidance checks it by), a number's missing digit and its bounds (as
llguidance writes a bounded number: no exponent, no -0, no trailing zero in a fraction).

Patterns:
json_closer.py needs, for a string cut short inside a pattern ("^[0-9]{5}$" after "12"), the
fewest characters that make it match. A pattern is compiled here (with Python's regex parser)
into a small NFA; the prefix is run through it, and a breadth-first search from the states it
reaches finds the nearest accepting one, one representative character per edge. As JSON Schema
says (and llguidance does), a pattern matches anywhere in the string unless anchored by ^ / $.
Constructs an NFA cannot hold (backreferences, lookaround) give None: the caller then searches
with the grammar itself.
"""
from __future__ import annotations

import functools
import json
import math
import re
import decimal
from decimal import Decimal, InvalidOperation
from collections import deque

try:
    import re._parser as _sre   # Python >= 3.11
    import re._constants as _c
except ImportError:   # pragma: no cover
    import sre_parse as _sre
    import sre_constants as _c

MAX_STATES = 20000   # an NFA past this (a{1000}{1000}) is not expanded
_REPS = "a0A _-.,:/@x"   # representative characters, tried in this order


class _Unsupported(Exception):
    pass


class _Set:
    """A character class: sre items (LITERAL, RANGE, CATEGORY), possibly negated."""

    def __init__(self, items, negate=False):
        self.items, self.negate = items, negate

    def __contains__(self, ch: str) -> bool:
        o = ord(ch)
        hit = False
        for op, av in self.items:
            if op is _c.LITERAL:
                hit = o == av
            elif op is _c.RANGE:
                hit = av[0] <= o <= av[1]
            elif op is _c.CATEGORY:
                hit = _category(av, ch)
            elif op is _c.NEGATE:
                continue
            else:
                raise _Unsupported(op)
            if hit:
                break
        return hit != self.negate

    def rep(self) -> str | None:
        """A character in the set: a friendly one where possible."""
        for ch in _REPS:
            if ch in self:
                return ch
        if not self.negate:
            for op, av in self.items:
                if op is _c.LITERAL:
                    return chr(av)
                if op is _c.RANGE:
                    return chr(av[0])
        for o in range(33, 0x3000):
            if chr(o) in self:
                return chr(o)
        return None


def _category(cat, ch: str) -> bool:
    name = str(cat)
    if name.endswith("NOT_DIGIT"):
        return not ch.isdigit()
    if name.endswith("DIGIT"):
        return ch.isdigit()
    if name.endswith("NOT_SPACE"):
        return not ch.isspace()
    if name.endswith("SPACE"):
        return ch.isspace()
    if name.endswith("NOT_WORD"):
        return not (ch.isalnum() or ch == "_")
    if name.endswith("WORD"):
        return ch.isalnum() or ch == "_"
    raise _Unsupported(cat)


class _NFA:
    def __init__(self):
        self.eps: list[list[int]] = []
        self.edges: list[list] = []   # (set, target)

    def state(self) -> int:
        if len(self.eps) > MAX_STATES:
            raise _Unsupported("too many states")
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def build(self, items, start: int) -> int:
        """Adds the sequence `items` from state start; returns its end state."""
        cur = start
        for op, av in items:
            cur = self.node(op, av, cur)
        return cur

    def node(self, op, av, cur: int) -> int:
        if op is _c.LITERAL:
            return self._edge(cur, _Set([(op, av)]))
        if op is _c.NOT_LITERAL:
            return self._edge(cur, _Set([(_c.LITERAL, av)], True))
        if op is _c.ANY:
            return self._edge(cur, _Set([(_c.LITERAL, 10)], True))
        if op is _c.IN:
            neg = any(o is _c.NEGATE for o, _ in av)
            return self._edge(cur, _Set([x for x in av if x[0] is not _c.NEGATE], neg))
        if op is _c.CATEGORY:
            return self._edge(cur, _Set([(op, av)]))
        if op is _c.AT:
            return cur   # anchors inside: read as empty (the outer ones are taken off first)
        if op is _c.SUBPATTERN:
            return self.build(av[-1], cur)
        if op is _c.BRANCH:
            end = self.state()
            for alt in av[1]:
                s = self.state()
                self.eps[cur].append(s)
                self.eps[self.build(alt, s)].append(end)
            return end
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT, getattr(_c, "POSSESSIVE_REPEAT", None)):
            lo, hi, sub = av
            if lo > 1000 or (hi is not _c.MAXREPEAT and hi > 1000):
                raise _Unsupported("a repeat count over 1000")
            for _ in range(lo):
                cur = self.build(sub, cur)
            if hi is _c.MAXREPEAT:
                loop = self.state()
                self.eps[cur].append(loop)
                self.eps[self.build(sub, loop)].append(loop)
                return loop
            end = self.state()
            self.eps[cur].append(end)
            for _ in range(hi - lo):
                cur = self.build(sub, cur)
                self.eps[cur].append(end)
            return end
        raise _Unsupported(op)

    def _edge(self, cur: int, cs: _Set) -> int:
        nxt = self.state()
        self.edges[cur].append((cs, nxt))
        return nxt

    def closure(self, states) -> frozenset:
        seen, todo = set(states), list(states)
        while todo:
            for t in self.eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)


@functools.lru_cache(maxsize=256)
def _compile(pattern: str):
    """(nfa, start, accept) for pattern, free before ^ and after $ unless anchored; None when it
    uses something an NFA cannot hold."""
    try:
        items = list(_sre.parse(pattern))
    except (re.error, RecursionError, OverflowError):
        return None
    head = bool(items) and items[0] == (_c.AT, _c.AT_BEGINNING)
    tail = bool(items) and items[-1][0] is _c.AT and items[-1][1] in (_c.AT_END, getattr(_c, "AT_END_STRING", None))
    items = items[1 if head else 0:len(items) - (1 if tail else 0)]
    nfa = _NFA()
    try:
        start = nfa.state()
        any_char = _Set([], True)
        if not head:
            nfa.edges[start].append((any_char, start))
        accept = nfa.build(items, start)
        if not tail:
            nfa.edges[accept].append((any_char, accept))
    except (_Unsupported, RecursionError):
        return None
    return nfa, start, accept


def shortest_completion(pattern: str, done: str) -> str | None:
    """The fewest characters c such that done + c matches pattern (None: none exist, or the
    pattern is beyond this module)."""
    got = _compile(pattern)
    if got is None:
        return None
    nfa, start, accept = got
    cur = nfa.closure([start])
    for ch in done:
        cur = nfa.closure([t for s in cur for cs, t in nfa.edges[s] if ch in cs])
        if not cur:
            return None
    # breadth-first, level by level (each level one character more); epsilon moves are free, so
    # a state keeps the path of the state whose closure reached it
    back: dict = {s: None for s in cur}
    level = list(cur)
    while level:
        for s in level:
            if s == accept:
                out = []
                while back[s] is not None:
                    s, ch = back[s]
                    out.append(ch)
                return "".join(reversed(out))
        nxt = []
        for s in level:
            for cs, t in nfa.edges[s]:
                if t not in back:
                    ch = cs.rep()
                    if ch is not None:
                        back[t] = (s, ch)
                        nxt.append(t)
        todo = list(nxt)
        while todo:
            s = todo.pop()
            for t in nfa.eps[s]:
                if t not in back:
                    back[t] = back[s]
                    nxt.append(t)
                    todo.append(t)
        level = nxt
    return None


# ---------------------------------------------------------------- strings and numbers of a schema

_DATE = r"\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|02-(0[1-9]|1\d|2[0-9]))"
_TIME = r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"
_HOST = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*"
_OCTET = r"(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_FORMATS = {   # as llguidance checks them (closely enough: a closing it refuses is searched for)
    "date": _DATE,
    "time": _TIME,
    "date-time": _DATE + "[Tt]" + _TIME,
    "email": r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@" + _HOST,
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "uri": r"[A-Za-z][A-Za-z0-9+.-]*:[^ ]*",
    "hostname": _HOST,
    "ipv4": _OCTET + r"(\." + _OCTET + "){3}",
}

def kind_of(s: dict) -> str:
    t = s.get("type")
    if isinstance(t, str):
        return t
    if any(k in s for k in ("properties", "required", "additionalProperties")):
        return "object"
    if any(k in s for k in ("items", "prefixItems", "minItems", "maxItems")):
        return "array"
    if any(k in s for k in ("pattern", "minLength", "maxLength", "format")):
        return "string"
    if any(k in s for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")):
        return "number"
    return "any"


def string_rest(s: dict, done: str) -> str | None:
    """The shortest characters that complete a string of branch s whose content so far is
    `done` (None: it cannot be completed)."""
    if "const" in s or "enum" in s:
        vals = [s["const"]] if "const" in s else s["enum"]
        rests = [v[len(done):] for v in vals if isinstance(v, str) and v.startswith(done)]
        return min(rests, key=len, default=None)
    if kind_of(s) == "any":
        return ""
    rx = s.get("pattern")
    if rx is None and s.get("format") in _FORMATS:
        rx = "^" + _FORMATS[s["format"]] + "$"
    rest = ""
    if isinstance(rx, str):
        rest = shortest_completion(rx, done)
        if rest is None:
            return None
    short = int(s.get("minLength", 0)) - len(done) - len(rest)
    return rest + "a" * short if short > 0 else rest


def _bounds(s: dict):
    lo, lo_x = s.get("minimum"), False
    if isinstance(s.get("exclusiveMinimum"), (int, float)) and not isinstance(s.get("exclusiveMinimum"), bool):
        if lo is None or s["exclusiveMinimum"] >= lo:
            lo, lo_x = s["exclusiveMinimum"], True
    hi, hi_x = s.get("maximum"), False
    if isinstance(s.get("exclusiveMaximum"), (int, float)) and not isinstance(s.get("exclusiveMaximum"), bool):
        if hi is None or s["exclusiveMaximum"] <= hi:
            hi, hi_x = s["exclusiveMaximum"], True
    return lo, lo_x, hi, hi_x


def _in_bounds(s: dict, x) -> bool:
    lo, lo_x, hi, hi_x = _bounds(s)
    lo = None if lo is None else Decimal(str(lo))
    hi = None if hi is None else Decimal(str(hi))
    if lo is not None and (x < lo or (lo_x and x == lo)):
        return False
    return not (hi is not None and (x > hi or (hi_x and x == hi)))


_NUM = decimal.Context(prec=80, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)   # any JSON number


def _number_ok(s: dict, text: str, strict: bool = True) -> bool:
    """Whether text is a complete number of branch s, as llguidance writes it (strict: its
    range regexes' way of writing a fraction, which they relax at a bound: 1.00 <= 1)."""
    integer = kind_of(s) == "integer"
    if not (_INT if integer else _FLOAT).fullmatch(text):
        return False
    lo, _, hi, _ = _bounds(s)
    step = s.get("multipleOf")
    step = step if isinstance(step, (int, float)) and not isinstance(step, bool) and step > 0 else None
    if lo is None and hi is None and step is None:
        return True
    try:
        x = _NUM.create_decimal(text)
        if step is not None and _NUM.remainder(x, Decimal(str(step))) != 0:
            return False
    except decimal.DecimalException:   # (an exponent past any bound)
        return False
    if not integer and (lo is not None or hi is not None):   # a range is a regex of plain decimals
        frac = text.partition(".")[2]
        if "e" in text.lower() or (x == 0 and text.startswith("-")) or (strict and frac.endswith("0") and frac != "0"):
            return False
    return _in_bounds(s, x)


_INT = re.compile(r"-?(0|[1-9][0-9]*)")
_FLOAT = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def number_rest(s: dict, done: str) -> str | None:
    """The shortest characters completing a number of branch s written so far as `done`."""
    got = _number_rest(s, done, True)
    return got if got is not None or not done else _number_rest(s, done, False)


def _number_rest(s: dict, done: str, strict: bool) -> str | None:
    if _number_ok(s, done, strict):
        return ""
    for rest in ("0", "1", "5", "00", "0.5", "5.0"):
        if _number_ok(s, done + rest, strict):
            return rest
    if not done:   # no small value: a bound itself, or the middle of the range
        lo, lo_x, hi, hi_x = _bounds(s)
        integer = kind_of(s) == "integer"
        for x in ([lo + (1 if lo_x else 0)] if lo is not None else []) + ([hi - (1 if hi_x else 0)] if hi is not None else []) + \
                ([(lo + hi) / 2] if lo is not None and hi is not None else []):
            x = math.ceil(x) if integer and x == lo + (1 if lo_x else 0) else (math.floor(x) if integer else x)
            t = str(int(x)) if integer or float(x).is_integer() else repr(float(x))
            if _number_ok(s, t, strict):
                return t
        return None
    digits = "0123456789"
    level = [""]
    for _ in range(5):   # the shortest digits that bring a prefix into range (minimum 18, "1" -> "8")
        level = [r + d for r in level for d in digits]
        for r in level:
            if _number_ok(s, done + r, strict):
                return r
    return None


