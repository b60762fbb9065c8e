"""A conversation with an LLM: the message history and the policy that keeps it in the context.

Each turn re-renders the whole history with the chat template; the LLM reuses the K/V of the
prefix it already computed, so only the new tokens are prefilled. When the history outgrows the
context, the oldest exchanges are dropped (the system prompt is kept); a message that cannot fit
even alone is refused and the history is left as it was. A reasoning model's reasoning is shown
apart from its answer and kept out of the history's content (chat/reasoning.py).
"""
from __future__ import annotations

from ..errors import ContextFullError
from .reasoning import CONTENT, ReasoningSplitter, assistant_message, opens_reasoning


def is_base_model(metadata: dict) -> bool:
    """True for a GGUF that carries no chat template and whose name does not say it was tuned
    for chat or instructions (a base model continues text rather than answering)."""
    if metadata.get("tokenizer.chat_template"):
        return False
    words = " ".join(str(metadata.get(k, "")) for k in ("general.name", "general.finetune", "general.basename"))
    words = words.lower().replace("_", "-")
    return not any(w in words for w in ("instruct", "chat", "-it", " it ", "assistant", "sft", "dpo", "rlhf"))


class ChatSession:
    """The history of one conversation (see the module docstring). `ask` adds a user message,
    streams the answer through `write`, and returns its Completion."""

    def __init__(self, llm, *, system: str | None = None, max_tokens: int = 512, sampling: dict | None = None,
                 notice=None, consume=None):
        self.llm, self.max_tokens, self.sampling = llm, max_tokens, dict(sampling or {})
        self.system = system or None
        self.notice = notice or (lambda msg: None)
        self.consume = consume or _consume
        self.history: list[dict] = []
        self.last = None          # the last answer's Completion (None after a reset)
        self.last_reasoning = self.last_answer = ""   # its two parts (chat/reasoning.py)
        self.dropped = 0          # messages dropped to fit the context, since the last reset
        self.reset()

    def reset(self) -> None:
        self.history = [{"role": "system", "content": self.system}] if self.system else []
        self.dropped = 0
        self.last = None

    def set_system(self, text: str | None) -> None:
        self.system = text or None
        self.reset()

    def prompt_tokens(self, messages=None) -> int:
        return len(self.llm.tokenize(self.llm.chat_prompt(self.history if messages is None else messages)))

    def fit(self) -> None:
        """Drops the oldest exchanges (never the system prompt) until the history plus room for
        an answer fits the context. Raises ContextFullError, dropping nothing, if the new
        message cannot fit even alone."""
        n_ctx = self.llm.n_ctx
        room = max(1, min(self.max_tokens, n_ctx // 2))
        first = 1 if self.system else 0
        n = self.prompt_tokens(self.history[:first] + self.history[-1:])
        if n >= n_ctx:
            raise ContextFullError(f"the message takes {n} tokens with the template, but the context "
                                   f"holds {n_ctx} (see -c/--ctx-size); the conversation is kept as it was")
        n_before = len(self.history)
        while self.prompt_tokens() + room > n_ctx and len(self.history) - first > 1:
            # Drop one exchange: the oldest message and whatever follows it up to the next user turn.
            del self.history[first]
            while len(self.history) - first > 1 and self.history[first]["role"] != "user":
                del self.history[first]
        dropped = n_before - len(self.history)
        if dropped:
            self.dropped += dropped
            self.notice(f"[context full ({n_ctx} tokens): dropped the {dropped} oldest message"
                        f"{'s' if dropped > 1 else ''}{', kept the system prompt' if self.system else ''}]")

    def ask(self, text: str, write=None, on_prefill=None, write_reasoning=None):
        """Adds the user's message, streams the answer through `write` and the model's reasoning
        (if its format has any, see chat/reasoning.py) through `write_reasoning` (None: not
        shown), returns the Completion (its text is the whole generation; `last_reasoning` and
        `last_answer` are its two parts). The history keeps the answer, and the reasoning
        apart for the template to drop or keep as it says."""
        self.history.append({"role": "user", "content": text})
        try:
            self.fit()
            fmt = self.llm.reasoning_format
            opened = fmt is not None and opens_reasoning(self.llm.chat_prompt(self.history), fmt)
            splitter = ReasoningSplitter(fmt, opened)
            stream = self.llm.stream_chat(self.history, self.max_tokens, on_prefill=on_prefill, **self.sampling)
        except BaseException:
            self.history.pop()
            raise

        def show(pieces):
            for kind, piece in pieces:
                out = write if kind == CONTENT else write_reasoning
                if out is not None:
                    out(piece)

        c = self.consume(stream, lambda t: show(splitter.feed(t)))
        show(splitter.flush())
        self.last = c
        self.last_reasoning, self.last_answer = "".join(splitter.reasoning), "".join(splitter.content)
        if c.finish_reason == "cancelled" and not self.last_answer.strip():
            self.history.pop()                           # stopped before it answered
        else:
            self.history.append(assistant_message(self.last_reasoning, self.last_answer))
        return c


def _consume(stream, write=None):
    for piece in stream:
        if write is not None and piece.text:
            write(piece.text)
    return stream.completion
