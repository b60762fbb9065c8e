"""The request bodies of `pydecode serve`, checked: OpenAI's fields (and a few of llama.cpp's) ->
what LLM.stream takes. Every refusal is an APIError naming the field (OpenAI's `param`), raised
before anything is queued.

Fields that change nothing here (user, metadata, store, service_tier, ...) are accepted and
ignored, as OpenAI-compatible servers do; fields that would change the output but are not
supported (tools, logit_bias, suffix, best_of > n) are refused,
never silently dropped.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

MAX_N = 16              # choices per request (n)
MAX_STOPS = 16          # stop strings per request (OpenAI allows 4)
MAX_TOP_LOGPROBS = 20
ROLES = ("system", "developer", "user", "assistant", "tool")


class APIError(Exception):
    """An HTTP error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
             500: "server_error", 501: "not_supported_error", 503: "unavailable_error", 403: "permission_error",
             409: "invalid_request_error"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or self.TYPES.get(status, "server_error")

    @classmethod
    def shutting_down(cls) -> "APIError":
        return cls(503, "the server is shutting down", code="shutting_down")

    @classmethod
    def unknown_model(cls, name: str, served: str) -> "APIError":
        return cls(404, f"the model {name!r} is not served here; this server serves {served!r} (GET /v1/models)",
                   param="model", code="model_not_found")

    @classmethod
    def context_exceeded(cls, n_prompt: int, n_ctx: int, param: str = "prompt") -> "APIError":
        """llama-server's error for a prompt with no room left for a token, with its fields."""
        e = cls(400, f"{param}: the request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens); "
                     f"shorten it or start the server with a larger -c", param=param,
                code="context_length_exceeded", type="exceed_context_size_error")
        e.extra = {"n_prompt_tokens": n_prompt, "n_ctx": n_ctx}
        return e

    extra: dict = {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code,
                          **self.extra}}


def bad(param: str, message: str, code: str | None = None) -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code=code or "invalid_value")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _number(body, name, default, lo=None, hi=None, lo_open=False):
    v = body.get(name)
    if v is None:
        return default
    if not _is_number(v):
        raise bad(name, f"must be a number, got {v!r}")
    if (lo is not None and (v < lo or (lo_open and v == lo))) or (hi is not None and v > hi):
        raise bad(name, f"must be in {'(' if lo_open else '['}{lo}, {hi}], got {v!r}")
    return float(v)


def _int(body, name, default, lo=None, hi=None):
    v = body.get(name)
    if v is None:
        return default
    if not _is_int(v):
        raise bad(name, f"must be an integer, got {v!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
        raise bad(name, f"must be an integer {rng}, got {v!r}")
    return v


def _bool(body, name, default=False):
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(name, f"must be true or false, got {v!r}")
    return v


@dataclass
class Generation:
    """What one request asks of each of its sequences."""

    max_tokens: int | None         # None: until the context is full
    sampling: dict                 # LLM.stream's sampling keywords (seed: of the first choice)
    stop: list[str] | None
    logprobs: int | None           # top alternatives per token, or None for no logprobs
    n: int
    stream: bool
    include_usage: bool
    ignore_eos: bool
    structure: dict                # LLM.stream's structured-output keywords (response_format, ...)
    shift: dict = field(default_factory=dict)   # the request's n_keep / n_discard, if given (app.shift_of)

    def seed(self, i: int) -> int | None:
        """Choice i's seed: the request's + i, so that n choices differ and each is reproducible."""
        s = self.sampling["seed"]
        return None if s is None else (s + i) % 2**64


# Sampling when neither the request nor the server's flags say: llama-server's defaults.
SERVER_SAMPLING = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, repeat_last_n=64)


def generation(body: dict, chat: bool, default_max_tokens: int | None, defaults: dict | None = None) -> Generation:
    """The fields /v1/completions and /v1/chat/completions share (chat: the chat endpoint's
    spelling of max_tokens and logprobs). defaults: the server's sampling settings (its flags)
    over SERVER_SAMPLING, for the fields a request leaves out. logit_bias is read by
    resolve_logit_bias (it needs the tokenizer); tools by chat_tools."""
    d = {**SERVER_SAMPLING, **(defaults or {})}
    # Structured output: OpenAI's response_format, or llama.cpp server's json_schema / grammar
    # fields; checked against the vocabulary when queued (constraint.py), a bad one a 400.
    structure = {k: body[k] for k in ("response_format", "json_schema", "grammar") if body.get(k) is not None}
    if len(structure) > 1:
        raise bad(sorted(structure)[1], f"give one of response_format, json_schema and grammar, not "
                  f"{' and '.join(sorted(structure))}")
    if "grammar" in structure and not isinstance(structure["grammar"], str):
        raise bad("grammar", f"must be a string (Lark or GBNF), got {structure['grammar']!r}")

    max_tokens = _int(body, "max_tokens", default_max_tokens, lo=1)
    if chat:
        max_tokens = _int(body, "max_completion_tokens", max_tokens, lo=1)
    n = _int(body, "n", 1, lo=1, hi=MAX_N)
    if not chat:
        best_of = _int(body, "best_of", n, lo=1)
        if best_of != n:
            raise bad("best_of", f"must equal n ({n}) here: candidates are not ranked server-side", "unsupported")

    temperature = _number(body, "temperature", d["temperature"], lo=0.0, hi=1e6)
    top_p = _number(body, "top_p", d["top_p"], lo=0.0, hi=1.0)
    top_k = _int(body, "top_k", d["top_k"])
    if top_p == 0.0:            # OpenAI allows 0: only the most likely token
        top_p, top_k = 1.0, 1
    top_k = max(0, top_k)       # llama.cpp's spelling of "off" is <= 0
    seed = _int(body, "seed", d.get("seed"))
    if seed is not None and seed < 0:   # llama.cpp's -1: a random seed
        seed = None
    sampling = dict(
        temperature=temperature, top_p=top_p, top_k=top_k,
        min_p=_number(body, "min_p", d["min_p"], lo=0.0, hi=1.0),
        repeat_penalty=_number(body, "repeat_penalty", d["repeat_penalty"], lo=0.0, hi=1e6, lo_open=True),
        repeat_last_n=_window(_int(body, "repeat_last_n", d["repeat_last_n"], lo=-1)),
        presence_penalty=_number(body, "presence_penalty", d.get("presence_penalty", 0.0), lo=-2.0, hi=2.0),
        frequency_penalty=_number(body, "frequency_penalty", d.get("frequency_penalty", 0.0), lo=-2.0, hi=2.0),
        seed=None if seed is None else seed % 2**64, **_rare_stages(body, d))

    stop = body.get("stop")
    if stop is not None:
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise bad("stop", f"must be a string or a list of strings, got {body['stop']!r}")
        if len(stop) > MAX_STOPS:
            raise bad("stop", f"at most {MAX_STOPS} stop strings, got {len(stop)}")
        if any(not s for s in stop):
            raise bad("stop", "stop strings must not be empty")
        stop = stop or None

    if chat:
        want = _bool(body, "logprobs")
        top = _int(body, "top_logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
        if top is not None and not want:
            raise bad("top_logprobs", "needs logprobs: true")
        logprobs = (top or 0) if want else None
    else:
        if isinstance(body.get("logprobs"), bool):
            raise bad("logprobs", "must be an integer (the alternatives per token, 0.."
                      f"{MAX_TOP_LOGPROBS}) for /v1/completions, got {body['logprobs']!r}")
        logprobs = _int(body, "logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)

    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise bad("stream_options", f"must be an object, got {opts!r}")
    include_usage = _bool(opts or {}, "include_usage")
    shift = {k: _int(body, k, None, lo=lo) for k, lo in (("n_keep", -1), ("n_discard", 0)) if body.get(k) is not None}
    return Generation(max_tokens, sampling, stop, logprobs, n, stream, include_usage,
                      _bool(body, "ignore_eos"), structure, shift)


def _rare_stages(body: dict, d: dict) -> dict:
    """llama-server's typical_p, mirostat (0 off, 1, 2), mirostat_tau and mirostat_eta, and
    llama-cpp-python's server's tfs_z, as SamplingParams' names. As llama.cpp, typical_p or tfs_z
    >= 1 is off."""
    def off_at_1(name):
        return min(1.0, _number(body, name, d.get(name, 1.0), lo=0.0, hi=1e6, lo_open=True))

    mode = _int(body, "mirostat", d.get("mirostat_mode", 0), lo=0, hi=2)
    return dict(typical_p=off_at_1("typical_p"), tfs_z=off_at_1("tfs_z"), mirostat_mode=mode,
                mirostat_tau=_number(body, "mirostat_tau", d.get("mirostat_tau", 5.0), lo=0.0, hi=1e6),
                mirostat_eta=_number(body, "mirostat_eta", d.get("mirostat_eta", 0.1), lo=0.0, hi=1e6))


def _window(n: int) -> int:
    return 1 << 30 if n == -1 else n   # llama.cpp's -1: the whole context


def resolve_logit_bias(llm, raw) -> dict | None:
    """logit_bias as OpenAI ({"id": bias}) and llama-server ([[id or text, bias], ...]: a text
    stands for each of its tokens; a bias of false bans the token) give it -> {id: bias}."""
    if raw is None or raw == [] or raw == {}:
        return None
    pairs = list(raw.items()) if isinstance(raw, dict) else raw
    if not isinstance(pairs, list):
        raise bad("logit_bias", f"must be an object of token id -> bias or a list of [token, bias], got {raw!r}")
    out: dict[int, float] = {}
    n_vocab = llm.model.n_vocab
    for item in pairs:
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            raise bad("logit_bias", f"each entry must be [token id or text, bias], got {item!r}")
        key, v = item
        if v is False or v is None:
            v = -math.inf
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v == math.inf:
            raise bad("logit_bias", f"a bias must be a finite number or false, got {v!r}")
        if _is_int(key) or (isinstance(key, str) and key.strip().isdigit() and isinstance(raw, dict)):
            ids = [int(key)]
        elif isinstance(key, str) and key:
            ids = llm.tokenize(key, False, False)
        else:
            raise bad("logit_bias", f"a key must be a token id or a text, got {key!r}")
        for t in ids:
            if not 0 <= t < n_vocab:
                raise bad("logit_bias", f"token id {t} is outside the vocabulary (0..{n_vocab - 1})")
            out[t] = max(float(v), -math.inf)
    return out or None


def prompts(body: dict, n_vocab: int) -> list[str | list[int]]:
    """/v1/completions' prompt: a string, a list of strings, a list of token ids, or a list of
    lists of token ids; each is one prompt (its choices follow each other in `choices`)."""
    p = body.get("prompt")
    if p is None:
        raise bad("prompt", "is required", "missing")
    if isinstance(p, str):
        return [p]
    if isinstance(p, list) and p:
        if all(isinstance(x, str) for x in p):
            return list(p)
        if all(_is_int(x) for x in p):
            p = [p]
        if all(isinstance(x, list) and x and all(_is_int(t) for t in x) for x in p):
            for x in p:
                bad_ids = [t for t in x if not 0 <= t < n_vocab]
                if bad_ids:
                    raise bad("prompt", f"token id {bad_ids[0]} is outside the vocabulary (0..{n_vocab - 1})")
            return [list(x) for x in p]
    raise bad("prompt", "must be a non-empty string, list of strings, list of token ids or list of such lists")


def messages(body: dict) -> list[dict]:
    """/v1/chat/completions' messages, for the chat template: each {"role", "content": str}
    (and an assistant's "reasoning_content", kept); content given as parts keeps its text parts
    (joined by blank lines, as llama-server does); "developer" is a system message (OpenAI's newer name for it)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages", "must be a non-empty list of {\"role\", \"content\"} objects",
                  "missing" if msgs is None else None)
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(where, f"must be an object with a role and a content, got {m!r}")
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
        content = m.get("content")
        if content is None:
            if role != "assistant":
                raise bad(f"{where}.content", "is required")
            content = ""
        elif isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    texts.append(part["text"])
                elif kind in ("image_url", "input_image", "input_audio", "file"):
                    raise bad(f"{where}.content[{j}]", f"this model reads text only, not {kind}", "unsupported")
                else:
                    raise bad(f"{where}.content[{j}]", f"must be a {{\"type\": \"text\", \"text\": ...}} part, got {part!r}")
            content = "\n\n".join(texts)   # (as llama-server joins a message's text parts)
        elif not isinstance(content, str):
            raise bad(f"{where}.content", f"must be a string or a list of text parts, got {content!r}")
        msg = {"role": "system" if role == "developer" else role, "content": content}
        calls = m.get("tool_calls")
        if calls is not None and role == "assistant":
            if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
                raise bad(f"{where}.tool_calls", "must be a list of tool call objects")
            msg["tool_calls"] = [_template_call(c) for c in calls]
        for key in ("tool_call_id", "name"):
            if role == "tool" and isinstance(m.get(key), str):
                msg[key] = m[key]
        reasoning = m.get("reasoning_content")
        if reasoning is not None and role == "assistant":
            # An earlier answer's reasoning, as this server returned it: the template decides
            # whether the turn keeps it (Qwen3's drops it before the last user message).
            if not isinstance(reasoning, str):
                raise bad(f"{where}.reasoning_content", f"must be a string, got {reasoning!r}")
            msg["reasoning_content"] = reasoning
        out.append(msg)
    return out


def _template_call(c: dict) -> dict:
    """A tool call of the history as templates read it: function.arguments as an object
    (Qwen's and Llama's templates tojson it; OpenAI sends it as a JSON string)."""
    fn = dict(c.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            fn["arguments"] = __import__("json").loads(args)
        except ValueError:
            pass
    return {**c, "function": fn}


# Variables the server sets itself: a request cannot override them.
_TEMPLATE_OWN = ("messages", "add_generation_prompt", "bos_token", "eos_token", "tools", "documents")


def template_kwargs(body: dict) -> dict:
    """llama-server's chat_template_kwargs: more variables for the chat template, e.g.
    {"enable_thinking": false} (Qwen3) or {"reasoning_effort": "high"} (gpt-oss)."""
    v = body.get("chat_template_kwargs")
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise bad("chat_template_kwargs", f"must be an object of template variables, got {v!r}")
    for k in v:
        if not k.isidentifier() or k in _TEMPLATE_OWN:
            raise bad("chat_template_kwargs", f"cannot set {k!r}"
                      + (" (the server sets it)" if k in _TEMPLATE_OWN else " (not a variable name)"))
    return dict(v)


def tokens_field(body: dict, name: str, n_vocab: int) -> list[int]:
    v = body.get(name)
    if not isinstance(v, list) or not all(_is_int(t) for t in v):
        raise bad(name, f"must be a list of token ids, got {v!r}")
    for t in v:
        if not 0 <= t < n_vocab:
            raise bad(name, f"token id {t} is outside the vocabulary (0..{n_vocab - 1})")
    return v


def text_field(body: dict, name: str) -> str:
    v = body.get(name)
    if not isinstance(v, str):
        raise bad(name, f"must be a string, got {v!r}", "missing" if v is None else None)
    return v


def flag(body: dict, name: str, default: bool) -> bool:
    return _bool(body, name, default)
