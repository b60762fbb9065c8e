"""llama-cpp-python's llama_chat_format, the parts programs call: ChatFormatterResponse,
Jinja2ChatFormatter, hf_tokenizer_config_to_chat_formatter, the named formats (format_chatml,
format_llama2, ..., get_chat_format / register_chat_format) and guess_chat_format_from_gguf_metadata.

Prompts are rendered by pydecode's own template renderer (pydecode/chat/templates.py: jinja's
sandbox with trim_blocks / lstrip_blocks, as Transformers and llama-cpp-python render them); the
named formats are pydecode's (pydecode/chat/named_templates.py), the same ones Llama(chat_format=...)
uses, so a prompt formatted here is the one a chat completion sends. Chat completion handlers
(functionary, llava, ...) are not here: Llama.create_chat_completion renders with the model's own
template or chat_format, and does tool calls itself (pydecode/chat/tools.py)."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ..chat.named_templates import ALIASES, NAMED, names, resolve_template
from ..chat.templates import render


@dataclasses.dataclass
class ChatFormatterResponse:
    """A formatted prompt; stop: what ends the answer; added_special: the prompt holds the BOS
    text already (do not add another)."""
    prompt: str
    stop: str | list[str] | None = None
    stopping_criteria: Any = None
    added_special: bool = False


class Jinja2ChatFormatter:
    """A chat template (jinja) as a formatter: formatter(messages=[...]) -> ChatFormatterResponse."""

    def __init__(self, template: str, eos_token: str, bos_token: str, add_generation_prompt: bool = True,
                 stop_token_ids: list[int] | None = None):
        self.template, self.eos_token, self.bos_token = template, eos_token, bos_token
        self.add_generation_prompt = add_generation_prompt
        self.stop_token_ids = set(stop_token_ids) if stop_token_ids is not None else None
        render([], template, bos_token=bos_token, eos_token=eos_token, add_generation_prompt=False)   # compiles it

    def __call__(self, *, messages: list[dict], functions=None, function_call=None, tools=None, tool_choice=None,
                 **kwargs) -> ChatFormatterResponse:
        if functions and not tools:
            tools = [{"type": "function", "function": f} for f in functions]
        prompt = render(list(messages), self.template, bos_token=self.bos_token, eos_token=self.eos_token,
                        add_generation_prompt=self.add_generation_prompt, tools=tools, **kwargs)
        return ChatFormatterResponse(prompt=prompt, stop=[self.eos_token],
                                     added_special=bool(self.bos_token) and prompt.startswith(self.bos_token))

    def to_chat_handler(self):
        raise NotImplementedError("chat handlers are not used by pydecode: give Llama(chat_format=...) or a "
                                  "template; create_chat_completion renders with it")


def hf_tokenizer_config_to_chat_formatter(tokenizer_config: dict, add_generation_prompt: bool = True) -> Callable:
    """A formatter from a Hugging Face tokenizer_config.json (its chat_template, bos_token and
    eos_token). As llama-cpp-python does, an empty assistant message is appended when
    add_generation_prompt, so templates that have no generation prompt still end in an open turn."""
    for key in ("chat_template", "bos_token", "eos_token"):
        if not isinstance(tokenizer_config, dict) or not isinstance(tokenizer_config.get(key), str):
            raise ValueError(f"tokenizer_config needs a string {key!r}")
    template, bos, eos = (tokenizer_config[k] for k in ("chat_template", "bos_token", "eos_token"))

    def format_tokenizer_config(messages: list[dict], **kwargs) -> ChatFormatterResponse:
        if add_generation_prompt:
            messages = [*messages, {"role": "assistant", "content": ""}]
        prompt = render(messages, template, bos_token=bos, eos_token=eos, add_generation_prompt=False, **kwargs)
        return ChatFormatterResponse(prompt=prompt, stop=eos)

    return format_tokenizer_config


# The BOS / EOS text each named format is rendered with, and what ends its answer.
_SPECIALS = {"llama3": ("<|begin_of_text|>", "<|eot_id|>"), "gemma": ("<bos>", "<end_of_turn>"),
             "chatml": ("", "<|im_end|>"), "phi3": ("", "<|end|>"), "openchat": ("<s>", "<|end_of_turn|>")}


def get_chat_format(name: str) -> Callable:
    """The formatter of a named format (names(): llama-cpp-python's chat_format names and
    llama-server's), or ValueError listing them."""
    key = name.strip().lower() if isinstance(name, str) else name
    canonical = ALIASES.get(key, key)
    if canonical not in NAMED and canonical not in _REGISTERED:
        raise ValueError(f"chat format {name!r} is not one pydecode has; it has: {', '.join(names())}")
    if canonical in _REGISTERED:
        return _REGISTERED[canonical]
    bos, eos = _SPECIALS.get(canonical, ("<s>", "</s>"))
    template = resolve_template(canonical)

    def fmt(messages: list[dict], **kwargs) -> ChatFormatterResponse:
        b, e = kwargs.pop("bos_token", bos), kwargs.pop("eos_token", eos)
        prompt = render(list(messages), template, bos_token=b, eos_token=e, add_generation_prompt=True, **kwargs)
        return ChatFormatterResponse(prompt=prompt, stop=e or None, added_special=bool(b) and prompt.startswith(b))

    fmt.__name__ = "format_" + canonical.replace("-", "_")
    return fmt


_REGISTERED: dict[str, Callable] = {}


def register_chat_format(name: str):
    """A decorator registering a formatter function under a name (get_chat_format finds it)."""
    def register(f):
        _REGISTERED[name.strip().lower()] = f
        return f
    return register


format_chatml = get_chat_format("chatml")
format_qwen = format_chatml
format_llama2 = get_chat_format("llama-2")
format_llama3 = get_chat_format("llama-3")
format_mistral_instruct = get_chat_format("mistral-instruct")
format_gemma = get_chat_format("gemma")
format_vicuna = get_chat_format("vicuna")
format_alpaca = get_chat_format("alpaca")
format_zephyr = get_chat_format("zephyr")
format_openchat = get_chat_format("openchat")
format_phi3 = get_chat_format("phi3")


def guess_chat_format_from_gguf_metadata(metadata: dict) -> str | None:
    """The named format a GGUF's tokenizer.chat_template is, when it is exactly one of ours."""
    source = metadata.get("tokenizer.chat_template")
    for name, template in NAMED.items():
        if source == template:
            return name
    return None
