"""Chat templates: the GGUF's `tokenizer.chat_template` rendered with jinja2 in a sandbox.

The environment is the one Hugging Face `apply_chat_template` gives a template: an immutable
sandbox with trim_blocks/lstrip_blocks, the loop-controls extension (`break`/`continue`), the
`{% generation %}` block, a `tojson` filter that takes indent/ensure_ascii/separators/sort_keys,
and the globals `raise_exception`, `strftime_now`, plus the variables `messages`, `tools`,
`documents`, `bos_token`, `eos_token` and `add_generation_prompt`.

Models that carry no template get a built-in one chosen from their vocabulary
(`fallback_template`): Gemma turns, Llama 3 headers, or ChatML.
"""
from __future__ import annotations

import json
import re
import traceback
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Gemma (2 and 3): no system role; the system prompt opens the first user turn. The assistant
# is "model". Contents are trimmed, as Google's template does.
GEMMA = (
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set first_user_prefix = messages[0]['content'] | trim + '\n\n' %}{% set loop_messages = messages[1:] %}"
    "{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

# Llama 3 (Meta's template without the tool and date preamble).
LLAMA3 = (
    "{% for message in messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim"
    " + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# (name, source, marker tokens that must all be in the vocabulary), tried in order.
FALLBACKS = (
    ("gemma", GEMMA, ("<start_of_turn>", "<end_of_turn>")),
    ("llama3", LLAMA3, ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    ("chatml", CHATML, ()),
)


class TemplateError(ValueError):
    """A chat template that cannot render these messages."""


class _TemplateRaised(Exception):
    """raise_exception(...) called by the template itself."""


def _raise_exception(message):
    raise _TemplateRaised(str(message))


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Like transformers: plain json.dumps (Jinja's own tojson HTML-escapes and takes no options).
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks the assistant's tokens with it
    (for training masks); for rendering it is the identity."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _has_token(tokenizer, text: str) -> bool:
    try:
        ids = tokenizer.encode(text, add_special=False, parse_special=True)
    except Exception:
        return False
    return len(ids) == 1


def fallback_template(tokenizer) -> str:
    """The built-in template for a model whose GGUF carries none, chosen by which turn markers
    its vocabulary has as single tokens: Gemma, Llama 3, else ChatML."""
    return fallback_name_and_template(tokenizer)[1]


def fallback_name_and_template(tokenizer) -> tuple[str, str]:
    for name, source, markers in FALLBACKS:
        if all(_has_token(tokenizer, m) for m in markers):
            return name, source
    return "chatml", CHATML


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, _GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        where = f" at line {e.lineno}" if e.lineno else ""
        raise TemplateError(f"chat template cannot be compiled{where}: {e.message}") from None


def _where(exc: BaseException, source: str, nones: tuple = ()) -> str:
    """' at line N (`that line`)' for the innermost template frame of exc's traceback, and which
    of the variables given as None (`nones`) that line uses."""
    lineno = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == "<template>":
            lineno = frame.lineno
    if lineno is None:
        lineno = getattr(exc, "lineno", None)
    if not lineno:
        return ""
    lines = source.splitlines()
    text = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
    if len(text) > 100:
        text = text[:97] + "..."
    used = [n for n in nones if re.search(rf"\b{n}\b", text)]
    hint = "".join(f"; `{n}` was not given (None)" for n in used)
    return f" at line {lineno}" + (f" (`{text}`)" if text else "") + hint


def render(messages: list[dict], template: str | None, *, bos_token: str = "", eos_token: str = "",
           add_generation_prompt: bool = True, tools: list | None = None, **extra) -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}, ...]).

    `content` is a string, or (for templates that take them) a list of parts such as
    {"type": "text", "text": ...}. template=None renders ChatML (see fallback_template).
    `extra` are more template variables (e.g. documents, date_string, enable_thinking).
    Raises TemplateError naming what the template lacks or rejects.
    """
    if not isinstance(messages, (list, tuple)):
        raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] must be a dict with a string 'role'")
        content = m.get("content")
        if not (content is None or isinstance(content, (str, list))):
            raise ValueError(f"messages[{i}]['content'] must be a string or a list of parts, "
                             f"not {type(content).__name__}")
    source = template or CHATML
    compiled = _compile(source)
    variables = {"documents": None, **extra}
    try:
        return compiled.render(messages=list(messages), tools=tools, bos_token=bos_token, eos_token=eos_token,
                               add_generation_prompt=add_generation_prompt, **variables)
    except _TemplateRaised as e:
        raise TemplateError(f"chat template refused these messages: {e}") from None
    except jinja2.UndefinedError as e:
        raise TemplateError(f"chat template needs something not provided{_where(e, source)}: {e.message}") from None
    except jinja2.TemplateError as e:
        raise TemplateError(f"chat template failed{_where(e, source)}: {e.message or type(e).__name__}") from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ZeroDivisionError) as e:
        nones = tuple(k for k, v in (("tools", tools), *variables.items()) if v is None)
        raise TemplateError(f"chat template failed{_where(e, source, nones)}: {type(e).__name__}: {e}") from None
