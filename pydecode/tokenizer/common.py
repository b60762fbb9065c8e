"""What the tokenizer's parts share: llama.cpp's token types, the end-of-generation markers,
and the error every part raises."""
from __future__ import annotations

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Token texts that end a generation when present in the vocabulary (llama.cpp keeps the same
# kind of list, because GGUF files rarely name all of them in metadata).
EOG_MARKERS = (
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|endoftext|>", "<|end|>",
    "</s>", "<|end_of_text|>", "<EOT>", "<end_of_utterance>", "<\uff5cend\u2581of\u2581sentence\uff5c>",
    "<|return|>", "<|call|>",            # OpenAI harmony (gpt-oss): the answer / a tool call
    "<eos>", "<turn|>", "<|tool_response>",  # Gemma 4
)


class TokenizerError(ValueError):
    """The GGUF tokenizer metadata cannot be used, or a token id is out of range."""


def check_text(text: str, name: str = "text") -> None:
    """A str that is not valid Unicode (a lone surrogate, "\\ud800": JSON and Python both let
    one in) is a TokenizerError naming `name` and the index: the backends would raise a TypeError
    (`tokenizers`) or RuntimeError (sentencepiece), and no token stands for it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise TokenizerError(f"{name} is not valid text: {e.reason} at index {e.start} "
                             f"({text[e.start:e.end]!r}, a lone surrogate?)") from None
