"""Structured output: a generation held to a JSON Schema, a regex, a grammar or a list of choices.

A constraint is a mask over the vocabulary at each step: the tokens that keep the output a
prefix of something the grammar accepts. Computing it is llguidance's job (a well-kept library:
JSON Schema, regex, Lark and GBNF grammars, forced-token runs); ours is to feed it our own
vocabulary, keep its cost off the critical path, and apply its mask in C:

- `grammar_of(...)` turns the user's arguments (json_schema=, regex=, grammar=, choices=,
  response_format= as OpenAI and llama-cpp-python spell it) into one llguidance grammar, and
  `compile_grammar` checks it against the model's tokenizer: a bad one is a ValueError naming
  the problem, raised before any decoding.
- `llg_tokenizer(tokenizer)` builds llguidance's tokenizer from the GGUF vocabulary (byte-level
  BPE and SentencePiece alike: every token's raw bytes, special tokens marked), once per
  Tokenizer.
- `Constraint` is one generation's matcher. `choose` picks the next token under the mask, but
  draws first without it (checking one token costs microseconds, a mask ~0.15 ms on a 152k
  vocabulary): greedy's best token, or sampling's draw from the untruncated softmax, is taken
  when the grammar allows it and the chain over the allowed tokens surely keeps it (rejection
  sampling: exact, csrc/sampling/sampling.c); otherwise the mask is computed and applied in C.
  `forced` returns the tokens the grammar leaves no choice about (the fixed parts of a schema);
  the Engine runs them through the model in one batch pass, unsampled.
"""
from __future__ import annotations

import json
import logging
import threading
import time

import numpy as np

from . import _core
from .budget import ClosingBudget
from .tokenizer.common import CONTROL, UNKNOWN

ffi, lib = _core.ffi, _core.lib
log = logging.getLogger("pydecode")

# JSON from a schema is compact by default ({"a":1,"b":[2,3]}): the separators then are forced
# tokens, outputs are shorter, and a small model cannot wander off into whitespace. A schema's
# own "x-guidance" options (llguidance's) override this, e.g. {"whitespace_flexible": true}.
JSON_DEFAULTS = {"whitespace_flexible": False}

_llg = None


def _llguidance():
    """The llguidance module (imported on first use: unconstrained generation never pays for it)."""
    global _llg
    if _llg is None:
        try:
            import llguidance
        except ImportError as e:   # a dependency of the package: only a broken install lacks it
            raise ImportError("structured output needs the llguidance package (pip install llguidance)") from e
        _llg = llguidance
    return _llg


class Grammar:
    """An llguidance grammar: `text` (its JSON form) and `what` (for messages and logs).
    `checked`: the tokenizer compile_grammar checked it against (None: not yet). A checked
    Grammar may be passed as grammar= wherever a grammar is taken (the server compiles one off
    its event loop, then submits it)."""

    def __init__(self, text: str, what: str):
        self.text, self.what = text, what
        self.checked = None
        self.schema = None   # the JSON Schema it was made from, if any
        self.frame = None    # tool calls: the syntax around that JSON (chat/tools.py)

    def __repr__(self) -> str:
        return f"Grammar({self.what})"


MAX_SCHEMA_DEPTH = 128   # nested objects and arrays of a schema (real ones use under 20)
MAX_CHOICES = 1999       # llguidance's parser holds 2000 items per row: the choices and the start
MAX_GRAMMAR_BYTES = 1 << 20   # a grammar's or regex's text (real ones are under 50 KB)
# GBNF is converted to Lark by llguidance in Python, in time superlinear in chained rules (a chain
# of 1000: 0.9 s, 3000: 10 s on a Zen 4 core); real GBNF grammars have tens to a few hundred.
MAX_GBNF_RULES = 1024


def _too_deep(schema, limit: int) -> bool:
    """Whether `schema` nests more than `limit` dicts and lists (walked without recursion: the
    check must not hit the stack limit it exists to avoid)."""
    stack = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))
    return False


def _schema_text(schema, name: str) -> str:
    deep = ValueError(f"{name} nests objects and arrays more than {MAX_SCHEMA_DEPTH} levels deep "
                      f"(the limit of this server and library)")
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except RecursionError:
            raise deep from None
        except ValueError as e:
            raise ValueError(f"{name} is not valid JSON: {e}") from None
    if _too_deep(schema, MAX_SCHEMA_DEPTH):
        raise deep
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise ValueError(f"{name} must be a JSON Schema (a dict or a JSON string of an object), "
                         f"got {type(schema).__name__}")
    try:
        return json.dumps(schema)
    except RecursionError:   # a structure that refers to itself
        raise deep from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} cannot be written as JSON: {e}") from None


def _json_grammar(schema, name: str) -> Grammar:
    llg = _llguidance()
    text = _schema_text(schema, name)
    try:
        g = llg.LLMatcher.grammar_from_json_schema(text, defaults=JSON_DEFAULTS)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    out = Grammar(g, name)
    out.schema = json.loads(text)   # (for the closing of a cut output: budget.py)
    return out


def _response_format(rf) -> Grammar | None:
    """OpenAI's response_format ({"type": "text" | "json_object" | "json_schema"}), and
    llama-cpp-python's {"type": "json_object", "schema": {...}}."""
    if rf is None:
        return None
    if hasattr(rf, "model_dump"):   # a pydantic model of it (the openai package's types)
        rf = rf.model_dump(exclude_none=True)
    if not isinstance(rf, dict):
        raise ValueError(f"response_format must be an object such as {{\"type\": \"json_object\"}}, got {rf!r}")
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = rf.get("schema")
        return _json_grammar({"type": "object"} if schema is None else schema,
                             "response_format (json_object with a schema)" if schema is not None
                             else "response_format (json_object)")
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise ValueError("response_format of type json_schema needs a json_schema object "
                             "({\"name\": ..., \"schema\": {...}, \"strict\": true})")
        schema = js.get("schema")
        if schema is None:
            raise ValueError("response_format.json_schema has no schema")
        return _json_grammar(schema, f"response_format (json_schema {js.get('name', '')!s})".replace(" )", ")"))
    raise ValueError(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}")


def grammar_of(json_schema=None, regex=None, grammar=None, choices=None, response_format=None) -> Grammar | None:
    """The one grammar the arguments ask for (None: unconstrained). At most one of them may be
    given. grammar: Lark (llguidance's dialect), or GBNF (llama.cpp's; recognized by its `::=`)."""
    given = [n for n, v in (("json_schema", json_schema), ("regex", regex), ("grammar", grammar),
                            ("choices", choices), ("response_format", response_format)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one of json_schema, regex, grammar, choices and response_format "
                         f"(got {', '.join(given)})")
    if not given:
        return None
    llg = _llguidance()
    if json_schema is not None:
        return _json_grammar(json_schema, "json_schema")
    if regex is not None:
        if not isinstance(regex, str) or not regex:
            raise ValueError(f"regex must be a non-empty string, got {regex!r}")
        _check_size(regex, "regex")
        shown = repr(regex) if len(regex) <= 200 else f"({len(regex)} characters) {regex[:120]!r}..."
        return Grammar(llg.LLMatcher.grammar_from_regex(regex), f"regex {shown}")
    if isinstance(grammar, Grammar):
        return grammar
    if grammar is not None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise ValueError(f"grammar must be a non-empty string (Lark or GBNF), got {grammar!r}")
        _check_size(grammar, "grammar")
        if "::=" in grammar:
            rules = grammar.count("::=")
            if rules > MAX_GBNF_RULES:
                raise ValueError(f"grammar (GBNF) defines {rules} rules; at most {MAX_GBNF_RULES} are accepted")
            try:
                return Grammar(llg.grammar_from("gbnf", grammar), "grammar (GBNF)")
            except Exception as e:
                raise ValueError(f"grammar (GBNF): {e}") from None
        return Grammar(llg.LLMatcher.grammar_from_lark(grammar), "grammar (Lark)")
    if choices is not None:
        if isinstance(choices, str) or not isinstance(choices, (list, tuple)) or not choices:
            raise ValueError(f"choices must be a non-empty list of strings, got {choices!r}")
        if len(choices) > MAX_CHOICES:   # llguidance refuses more alternatives, after quadratic work
            raise ValueError(f"choices holds {len(choices)} strings; at most {MAX_CHOICES} are accepted")
        for c in choices:
            if not isinstance(c, str) or not c:
                raise ValueError(f"choices must be non-empty strings, got {c!r}")
        lark = "start: " + " | ".join(json.dumps(c) for c in choices)
        shown = repr(list(choices))
        what = f"choices {shown}" if len(shown) <= 200 else f"choices ({len(choices)} strings, {shown[:120]}...)"
        return Grammar(llg.LLMatcher.grammar_from_lark(lark), what)
    return _response_format(response_format)


def _check_size(text: str, name: str) -> None:
    if len(text) > MAX_GRAMMAR_BYTES // 4 and len(text.encode("utf-8", "surrogatepass")) > MAX_GRAMMAR_BYTES:
        raise ValueError(f"{name} is {len(text.encode('utf-8', 'surrogatepass'))} bytes long; "
                         f"at most {MAX_GRAMMAR_BYTES} are accepted")


def compile_grammar(tokenizer, g: Grammar) -> Grammar:
    """Checks g against the model's tokenizer: ValueError naming the problem (a schema keyword
    llguidance does not support, a regex or grammar that does not parse), before any decoding."""
    if g.checked is tokenizer:
        return g
    llg = _llguidance()
    is_error, msgs = llg.LLMatcher.validate_grammar_with_warnings(g.text, llg_tokenizer(tokenizer))
    if is_error:
        raise ValueError(f"{g.what} is invalid: {msgs[0] if msgs else 'rejected by llguidance'}")
    for m in msgs:
        log.warning("%s: %s", g.what, m)
    g.checked = tokenizer
    return g


def prepare(tokenizer, **structure) -> Grammar | None:
    """grammar_of(**structure), checked against `tokenizer` (compile_grammar): the slow part of a
    constrained request, which a server runs off its event loop."""
    g = grammar_of(**structure)
    return None if g is None else compile_grammar(tokenizer, g)


# ---------------------------------------------------------------- the vocabulary, for llguidance

_build_lock = threading.Lock()


class _Vocabulary:
    """What llguidance's TokenizerWrapper reads: every token's raw bytes (special tokens marked by
    a leading 0xFF, llguidance's convention, so grammar text never matches them), the end ids, and
    a tokenize function (it tokenizes forced text with it). Our encode is llama.cpp's."""

    CACHE_ENTRIES = 4096   # forced strings' tokenizations kept

    def __init__(self, tokenizer):
        tok = self.tokenizer = tokenizer
        types = tok._types
        special = [i for i in range(tok.vocab_size) if types[i] in (CONTROL, UNKNOWN)]
        tokens = [tok.token_bytes(i) for i in range(tok.vocab_size)]
        for i in special:
            tokens[i] = b"\xff" + tokens[i]
        self.tokens, self.special_token_ids = tokens, special
        self.eos_token_id = tok.eos_id if tok.eos_id is not None else (min(tok.eog_ids) if tok.eog_ids else 0)
        self.bos_token_id = tok.bos_id
        self.greedy = None   # llguidance's own greedy tokenizer, once built
        self._cache: dict = {}

    def __call__(self, data) -> list[int]:
        # llguidance tokenizes the text a grammar forces (a schema's keys and punctuation) with
        # this at every forced run; the same few strings come back for every array item and
        # every output of a schema, and one encode costs ~0.1 ms after a step has flushed the
        # caches: kept, up to a bound.
        key = bytes(data) if isinstance(data, (bytes, bytearray)) else data
        got = self._cache.get(key)
        if got is None:
            got = self._encode(data)
            if len(self._cache) >= self.CACHE_ENTRIES:
                self._cache.clear()
            self._cache[key] = got
        return list(got)

    def _encode(self, data) -> tuple[int, ...]:
        text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else data
        ids = self.tokenizer.encode(text, add_special=False, parse_special=False)
        raw = data if isinstance(data, (bytes, bytearray)) else text.encode()
        if b"".join(self.tokens[i] for i in ids) != raw and self.greedy is not None:
            # (a SentencePiece space prefix, or bytes that are not whole characters)
            return tuple(self.greedy.greedy_tokenize(raw.decode("utf-8", "surrogateescape")))
        return tuple(ids)


def warm(tokenizer) -> None:
    """Builds llguidance's tokenizer now where llguidance is installed (a server does it before
    it reports ready: the build holds the GIL, so every other thread of the process waits)."""
    try:
        _llguidance()
    except ImportError:
        return
    llg_tokenizer(tokenizer)


def llg_tokenizer(tokenizer):
    """llguidance's tokenizer for a model's vocabulary, built once per Tokenizer (0.1-1 s, from
    49k to 262k tokens) and kept on it."""
    got = getattr(tokenizer, "_llg_tokenizer", None)
    if got is not None:
        return got
    with _build_lock:
        got = getattr(tokenizer, "_llg_tokenizer", None)
        if got is None:
            llg = _llguidance()
            t0 = time.perf_counter()
            vocab = _Vocabulary(tokenizer)
            eos = sorted(tokenizer.eog_ids) or [vocab.eos_token_id]
            got = llg.LLTokenizer(llg.TokenizerWrapper(vocab), n_vocab=tokenizer.vocab_size, eos_token=eos)
            vocab.greedy = got
            tokenizer._llg_vocab = vocab
            tokenizer._llg_tokenizer = got
            log.info("structured output: llguidance's tokenizer for %d tokens built in %.2f s",
                     tokenizer.vocab_size, time.perf_counter() - t0)
    return got


# ---------------------------------------------------------------- one generation's matcher

class ConstraintError(RuntimeError):
    """The grammar's matcher failed during a generation (a resource limit of llguidance's)."""


class Constraint:
    """One generation's llguidance matcher over the model's vocabulary (see the module docstring).
    fast_forward: tokens the grammar forces are returned by `forced` (else the model picks them
    under the mask, one step each)."""

    def __init__(self, tokenizer, n_vocab: int, grammar: Grammar, fast_forward: bool = True):
        llg = _llguidance()
        self.grammar, self.fast_forward, self.n_vocab = grammar, fast_forward, n_vocab
        self.matcher = llg.LLMatcher(llg_tokenizer(tokenizer), grammar.text, log_level=0)
        self._raise_if_error()
        self.vocabulary = tokenizer._llg_vocab   # text -> token ids, as llguidance tokenizes
        # JSON from a schema closes within max_tokens: the shortest completion, kept up to date
        self.budget = ClosingBudget(self, tokenizer, grammar.schema, grammar.frame) if grammar.schema is not None else None
        self.words = np.zeros((n_vocab + 31) // 32, np.int32)
        self._wptr = ffi.cast("uint32_t *", self.words.ctypes.data)
        self._scratch = None
        self._flags = None                   # the grammar's answers for a draw's candidates (_decide)
        self.mask_s = 0.0                    # seconds spent computing masks
        self.masks = 0                       # masks computed
        self.forced_tokens = 0               # tokens the grammar forced (not sampled)
        self.cost_s = 0.0                    # seconds the generation spent on the constraint (checks,
                                             # masks, masked draws, forced runs; not the first draw,
                                             # which every generation makes)

    def _raise_if_error(self) -> None:
        if self.matcher.is_error():   # its first line: the rest is llguidance's parser state dump
            why = (self.matcher.get_error().strip().splitlines() or ["failed"])[0][:300]
            if why == "NoExtensionBias":   # llguidance's word for an empty language
                why = "it matches no text at all (no token can start or continue it)"
            raise ConstraintError(f"{self.grammar.what}: the grammar failed: {why}")

    def _mask(self):
        """The mask of the current state: bit i of words set = token i allowed. A matcher that
        fails computing it (a grammar past llguidance's item limit, one that can never match)
        leaves only the end tokens allowed: that would read as a normal stop, so it raises."""
        t0 = time.perf_counter()
        self.matcher.unsafe_compute_mask_ptr(self.words.ctypes.data, self.words.nbytes)
        self.mask_s += time.perf_counter() - t0
        self.masks += 1
        self._raise_if_error()
        return self._wptr

    def _allows(self, token: int) -> bool:
        """Whether the mask last computed allows token."""
        return 0 <= token < self.n_vocab and bool((int(self.words[token >> 5]) >> (token & 31)) & 1)

    # ---- a step ----

    def choose(self, logits: np.ndarray, sampler, recent=(), summary=None) -> int:
        """The next token under the constraint, consumed by the matcher. Penalties, temperature,
        top-k / tail-free / typical / top-p / min-p and Mirostat apply to the allowed tokens only:
        the draw is exactly the chain's over the allowed tokens, as if the others' logits were -inf."""
        t0 = time.perf_counter()
        try:
            t = self._choose(logits, sampler, recent, summary)
            if self.budget is not None:
                self.budget.read([t])
            return t
        finally:
            self.cost_s += time.perf_counter() - t0

    DRAWS = 4         # sampling's draws without the mask before one is computed
    ASK = 4           # candidates the grammar is asked about first, when a draw is not sure (then 2x)
    ASK_MAX = 64      # ... before a mask is computed instead

    def _choose(self, logits, sampler, recent, summary) -> int:
        # The draw first, without the mask (Sampler.propose): greedy's best token, or sampling's
        # draw from the untruncated softmax. Checking one token costs microseconds, a mask
        # 0.15-0.7 ms on a 152k vocabulary (its tables cold after a step), so the mask is
        # computed only when the grammar's answers about the draws and the best candidates do not
        # decide the choice.
        t0 = time.perf_counter()
        x = sampler.penalize(logits, recent)   # penalties and logit bias (a copy), if any
        if sampler.extra is not None:
            # Tail-free, typical and Mirostat read the whole allowed distribution (its entropy,
            # its shape, mu's cut): no unmasked draw can stand for theirs, so the mask comes first.
            self.cost_s -= time.perf_counter() - t0
            return self._under_mask(sampler, x, None, None)
        summary = summary if x is logits else None
        t, sure = sampler.propose(x, summary)
        self.cost_s -= time.perf_counter() - t0   # (the draw any generation makes)
        if sampler.params.temperature == 0:
            t, mask = self._best_allowed(sampler, x, t), None
        else:
            t, mask = self._draw_allowed(sampler, x, t, sure)
        return t if t >= 0 else self._under_mask(sampler, x, summary, mask)

    def _best_allowed(self, sampler, x, t: int) -> int:
        """Greedy: the best token if the grammar takes it, else the first of the step's best
        candidates it takes (up to ASK_MAX; that is the best allowed token), consumed; -1: none."""
        m = self.matcher
        if m.try_consume_tokens([t]) == 1:
            return t
        p = sampler.candidates(x)
        for j in range(1, min(p.n_cand, self.ASK_MAX)):
            if m.try_consume_tokens([p.ids[j]]) == 1:
                return p.ids[j]
        self._raise_if_error()
        return -1

    def _draw_allowed(self, sampler, x, t: int, sure: bool):
        """Sampling by rejection: draw t (and up to DRAWS - 1 more) is taken when the grammar
        allows it and the chain over the allowed tokens keeps it: `sure` from its place among the
        best, else decided from the grammar's answers for the best candidates (_decide), else by
        the mask. Exact in distribution (csrc/sampling/sampling.c). When the draws are refused,
        those answers may determine the constrained draw itself (Sampler.draw_known). Returns
        (the token, consumed, or -1; the mask if one was computed)."""
        m, known = self.matcher, 0
        for attempt in range(self.DRAWS):
            if attempt:
                t, sure = sampler.redraw(x)
            if sure:
                if m.try_consume_tokens([t]) == 1:
                    return t, None
                self._raise_if_error()
                continue
            kept, known = self._decide(sampler, known)
            if kept == 1 and m.consume_token(t):
                return t, None
            if kept == -1:   # undecided: the mask decides it
                mask = self._mask()
                if self._allows(t) and sampler.keeps(x, mask, t) and m.consume_token(t):
                    return t, None
                return -1, mask
        known = self._ask(sampler, known, min(sampler.proposal.n_cand, self.ASK_MAX))
        t = sampler.draw_known(self._flags, known)
        if t >= 0 and m.consume_token(t):
            return t, None
        self._raise_if_error()
        return -1, None

    def _under_mask(self, sampler, x, summary, mask) -> int:
        """The choice under the vocabulary's mask (computed now unless given), applied in C."""
        self._raise_if_error()
        if mask is None:
            mask = self._mask()
        if lib.pd_mask_count(mask, self.n_vocab) == 0:
            self._raise_if_error()
            raise ConstraintError(f"{self.grammar.what}: no token is allowed here (the grammar is at a dead end)")
        t = sampler.sample_masked(x, mask, self, (), summary)
        if not self.matcher.consume_token(t):
            self._raise_if_error()
            raise ConstraintError(f"{self.grammar.what}: token {t} was refused after the mask allowed it")
        return t

    def _ask(self, sampler, known: int, want: int) -> int:
        """The grammar's answers (allowed or not) for the proposal's candidates known..want-1,
        into _flags; returns how many it holds."""
        if self._flags is None:
            self._flags = ffi.new("int8_t[256]")
        flags, ids, m = self._flags, sampler.proposal.ids, self.matcher
        for j in range(known, want):
            flags[j] = m.validate_tokens([ids[j]])
        return max(known, want)

    def _decide(self, sampler, known: int) -> tuple[int, int]:
        """Whether the chain over the allowed tokens keeps a draw that was not sure, from the
        grammar's answers for the vocabulary's best candidates, best first (a token costs ~1 us
        to check, a mask in a free string ~0.7 ms on a 152k vocabulary): (1 kept, 0 not, -1
        undecided (pd_proposal_keeps); how many candidates have answers, for the next draw of the
        same step)."""
        p = sampler.proposal
        if p.index < 0:
            return -1, known
        want = min(p.n_cand, max(known, p.index + 1, self.ASK))
        while True:
            known = self._ask(sampler, known, want)
            kept = sampler.proposal_keeps(self._flags, known)
            if kept != -1 or known >= min(p.n_cand, max(self.ASK_MAX, p.index + 1)):
                return kept, known
            want = min(p.n_cand, 2 * known)

    def masked_logits(self, logits: np.ndarray, mask) -> np.ndarray:
        """A copy of logits with every token the mask refuses at -inf (in C)."""
        if self._scratch is None:
            self._scratch = np.empty(self.n_vocab, np.float32)
        x = np.ascontiguousarray(logits, dtype=np.float32)
        lib.pd_apply_mask(ffi.cast("float *", self._scratch.ctypes.data), ffi.cast("float *", x.ctypes.data),
                          self.n_vocab, mask)
        return self._scratch

    def forced(self) -> list[int]:
        """After `choose`: the tokens the grammar now forces (consumed; [] when none, or without
        fast_forward)."""
        t0 = time.perf_counter()
        ff = []
        if self.fast_forward and not self.matcher.is_stopped():
            ff = self.matcher.compute_ff_tokens()
            if ff and not self.matcher.consume_tokens(ff):
                self._raise_if_error()
                raise ConstraintError(f"{self.grammar.what}: the forced tokens {ff} were refused")
            self.forced_tokens += len(ff)
            if self.budget is not None:
                self.budget.read(ff)
        self.cost_s += time.perf_counter() - t0
        return ff

    def initial(self) -> list[int]:
        """The tokens forced before anything is sampled (the schema's opening `{"name":`): they are
        prefilled with the prompt."""
        if not self.fast_forward:
            return []
        ff = self.matcher.compute_ff_tokens()
        if ff:
            if not self.matcher.consume_tokens(ff):
                self._raise_if_error()
            self.forced_tokens += len(ff)
            if self.budget is not None:
                self.budget.read(ff)
        return ff

    @property
    def done(self) -> bool:
        """The grammar allows nothing more: the output is complete."""
        return self.matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        """What was consumed so far is a complete output."""
        return self.matcher.is_accepting()
