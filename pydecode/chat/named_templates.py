"""Chat templates by name: the built-in formats of llama-server's `--chat-template NAME` and
llama-cpp-python's `chat_format=NAME`, written as jinja over the same variables as a model's own
template (messages, add_generation_prompt, bos_token, eos_token). Each reproduces the turn format
the name stands for; where the two projects spell a name differently, both spellings are here.

resolve_template(x): a known name gives its template; anything else is taken as jinja text
(llama-server does the same with an unknown --chat-template value)."""
from __future__ import annotations

from .templates import CHATML, GEMMA, LLAMA3


def _turns(before: str, system: str, user: str, assistant: str, generation: str, bos: bool = False) -> str:
    """A template of the common shape: an optional bos, then each message wrapped by its role's
    format ("{c}" is the content), then the generation prompt."""
    def wrap(fmt):
        a, _, b = fmt.partition("{c}")
        return "{{ " + repr(a) + " + message['content'] + " + repr(b) + " }}"

    return ((("{{ bos_token }}" if bos else "") + before) +
            "{% for message in messages %}"
            "{% if message['role'] == 'system' %}" + wrap(system) +
            "{% elif message['role'] == 'user' %}" + wrap(user) +
            "{% else %}" + wrap(assistant) + "{% endif %}"
            "{% endfor %}"
            "{% if add_generation_prompt %}{{ " + repr(generation) + " }}{% endif %}")


# Llama 2: the system prompt inside the first [INST] block, between <<SYS>> markers.
LLAMA2 = (
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set sys = '<<SYS>>\\n' + messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}{% set msgs = messages[1:] %}"
    "{% else %}{% set sys = '' %}{% set msgs = messages %}{% endif %}"
    "{% for message in msgs %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + (sys if loop.first else '') + message['content'] + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] + ' ' + eos_token }}{% endif %}"
    "{% endfor %}"
)

# Mistral v1 / v3 / v7 (mistral-instruct): [INST] turns; v7 has a [SYSTEM_PROMPT] block.
MISTRAL_V1 = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' or message['role'] == 'system' %}{{ ' [INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] + eos_token }}{% endif %}{% endfor %}"
)
MISTRAL_V3 = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' or message['role'] == 'system' %}{{ '[INST] ' + message['content'] + '[/INST]' }}"
    "{% else %}{{ ' ' + message['content'] + eos_token }}{% endif %}{% endfor %}"
)
MISTRAL_V7 = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}"
    "{% elif message['role'] == 'user' %}{{ '[INST] ' + message['content'] + '[/INST]' }}"
    "{% else %}{{ ' ' + message['content'] + eos_token }}{% endif %}{% endfor %}"
)

# llama-cpp-python's own "mistral-instruct" (llama_chat_format.format_mistral_instruct): user turns
# as "[INST] ... [/INST]", answers right after with the eos; system messages are not shown.
MISTRAL_INSTRUCT = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)

NAMED = {
    "chatml": CHATML,
    "mistral-instruct": MISTRAL_INSTRUCT,
    "llama2": LLAMA2,
    "llama3": LLAMA3,
    "gemma": GEMMA,
    "mistral-v1": MISTRAL_V1,
    "mistral-v3": MISTRAL_V3,
    "mistral-v7": MISTRAL_V7,
    "phi3": _turns("", "<|system|>\n{c}<|end|>\n", "<|user|>\n{c}<|end|>\n", "<|assistant|>\n{c}<|end|>\n",
                   "<|assistant|>\n"),
    "phi4": _turns("", "<|im_start|>system<|im_sep|>{c}<|im_end|>", "<|im_start|>user<|im_sep|>{c}<|im_end|>",
                   "<|im_start|>assistant<|im_sep|>{c}<|im_end|>", "<|im_start|>assistant<|im_sep|>"),
    "zephyr": _turns("", "<|system|>\n{c}</s>\n", "<|user|>\n{c}</s>\n", "<|assistant|>\n{c}</s>\n",
                     "<|assistant|>\n"),
    "vicuna": _turns("", "{c}\n\n", "USER: {c}\n", "ASSISTANT: {c}</s>\n", "ASSISTANT:"),
    "alpaca": _turns("", "{c}\n\n", "### Instruction:\n{c}\n\n", "### Response:\n{c}</s>\n\n", "### Response:\n"),
    "openchat": _turns("", "{c}<|end_of_turn|>", "GPT4 Correct User: {c}<|end_of_turn|>",
                       "GPT4 Correct Assistant: {c}<|end_of_turn|>", "GPT4 Correct Assistant:", bos=True),
    "deepseek": _turns("", "{c}\n\n", "### Instruction:\n{c}\n", "### Response:\n{c}\n<|EOT|>\n", "### Response:\n"),
    "deepseek2": _turns("", "{c}\n\n", "User: {c}\n\n", "Assistant: {c}<｜end▁of▁sentence｜>", "Assistant:",
                        bos=True),
    "deepseek3": _turns("", "{c}\n\n", "<｜User｜>{c}", "<｜Assistant｜>{c}<｜end▁of▁sentence｜>", "<｜Assistant｜>",
                        bos=True),
    "command-r": _turns("", "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>{c}<|END_OF_TURN_TOKEN|>",
                        "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>{c}<|END_OF_TURN_TOKEN|>",
                        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{c}<|END_OF_TURN_TOKEN|>",
                        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
    "granite": _turns("", "<|start_of_role|>system<|end_of_role|>{c}<|end_of_text|>\n",
                      "<|start_of_role|>user<|end_of_role|>{c}<|end_of_text|>\n",
                      "<|start_of_role|>assistant<|end_of_role|>{c}<|end_of_text|>\n",
                      "<|start_of_role|>assistant<|end_of_role|>"),
    "falcon3": _turns("", "<|system|>\n{c}\n", "<|user|>\n{c}\n", "<|assistant|>\n{c}\n", "<|assistant|>\n"),
    "exaone3": _turns("", "[|system|]{c}[|endofturn|]\n", "[|user|]{c}\n", "[|assistant|]{c}[|endofturn|]\n",
                      "[|assistant|]"),
    "chatglm4": _turns("[gMASK]<sop>", "<|system|>\n{c}", "<|user|>\n{c}", "<|assistant|>\n{c}", "<|assistant|>"),
}

# The other spellings: llama-cpp-python's chat_format names, and llama-server's variants.
ALIASES = {"qwen": "chatml", "chatml-function-calling": "chatml", "llama-2": "llama2", "llama-3": "llama3",
           "mistrallite": "mistral-v1", "mistral": "mistral-v3",
           "mistral-v3-tekken": "mistral-v3", "mistral-v7-tekken": "mistral-v7", "gemma2": "gemma",
           "gemma3": "gemma", "phi-3": "phi3", "deepseek-v2": "deepseek2", "deepseek-v3": "deepseek3",
           "command-r-plus": "command-r"}


def names() -> list[str]:
    return sorted(set(NAMED) | set(ALIASES))


def resolve_template(name_or_source: str) -> str:
    """The jinja source for a template name (see `names()`), or the argument itself when it is
    not a name (it is then a template's text)."""
    if not isinstance(name_or_source, str) or not name_or_source:
        raise ValueError(f"a chat template must be a name ({', '.join(names())}) or jinja text, "
                         f"got {name_or_source!r}")
    key = name_or_source.strip().lower()
    return NAMED.get(ALIASES.get(key, key), name_or_source)
