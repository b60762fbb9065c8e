"""Chat templates: the GGUF's `tokenizer.chat_template` rendered with jinja2 in a sandbox.

Hugging Face templates rely on a few helpers (raise_exception, bos_token, eos_token,
add_generation_prompt); models that carry no template get ChatML.
"""
from __future__ import annotations

from functools import lru_cache

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class TemplateError(ValueError):
    """A chat template that cannot render these messages."""


def _raise(msg):
    raise TemplateError(f"chat template error: {msg}")


@lru_cache(maxsize=8)
def _compile(source: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.globals["raise_exception"] = _raise
    env.filters.setdefault("tojson", lambda x, **kw: __import__("json").dumps(x, ensure_ascii=False, **kw))
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"chat template does not parse: {e}") from None


def render(messages: list[dict], template: str | None, *, bos_token: str = "", eos_token: str = "",
           add_generation_prompt: bool = True) -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}, ...])."""
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}] must be a dict with string 'role' and 'content'")
    try:
        return _compile(template or CHATML).render(messages=messages, bos_token=bos_token, eos_token=eos_token,
                                                  add_generation_prompt=add_generation_prompt)
    except jinja2.TemplateError as e:
        raise TemplateError(f"chat template failed: {e}") from None
