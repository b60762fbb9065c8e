"""Reasoning shown apart from the answer: the model's generated text split into its reasoning
and its answer, for the formats the templates of today's reasoning models use.

- "think" (Qwen3, QwQ, DeepSeek-R1 distills, SmolLM3): `<think>\\n...\\n</think>\\n\\nanswer`.
  Some templates open the `<think>` in the generation prompt (Qwen3.5, DeepSeek-R1), so the
  text starts inside the reasoning: the splitter is told (`opened`, from `opens_reasoning`).
  Qwen3's `enable_thinking=False` closes an empty one in the prompt: the text is all answer.
- "channel" (Gemma 4): `<|channel>thought\\n...<channel|>answer`: the same with other tags,
  and the channel's name first.
- "harmony" (OpenAI gpt-oss): messages `<|channel|>NAME<|message|>BODY` closed by `<|end|>`,
  each after the next `<|start|>assistant`; the `analysis` channel is the reasoning, `final`
  (and `commentary`: preambles) the answer. A message to a function (`to=functions.NAME` in
  its header or after `<|start|>assistant`) is a tool call: it is handed on as content in one
  spelling, `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS`, which
  chat/tools.py's harmony syntax reads. `<|return|>` / `<|call|>` end the generation (tokenizer
  EOG ids), so they never reach the text.

The markers are in the text because the tokenizer shows them (user-defined tokens: Qwen3's
<think>, Gemma 4's <|channel>, and harmony's markers as llama.cpp retypes them, see
tokenizer._end_of_generation).

`ReasoningSplitter` is the one state machine: `feed` streamed text, get (kind, text) pairs,
kind "reasoning" or "content"; `split_reasoning` runs it over a whole text. The history keeps
the answer as `content` and the reasoning as `reasoning_content` (`assistant_message`), handed to
the template under the key it reads (`for_template`): the templates decide what earlier turns
keep (Qwen3's drops the reasoning of turns before the last user message; gpt-oss's drops it
from every finished turn).
"""
from __future__ import annotations

THINK, CHANNEL, HARMONY = "think", "channel", "harmony"
REASONING, CONTENT = "reasoning", "content"

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
# The formats that wrap the reasoning in a pair of tags: (open, close, a header word the open tag
# is followed by, dropped).
_TAGS = {THINK: (_THINK_OPEN, _THINK_CLOSE, ""), CHANNEL: ("<|channel>", "<channel|>", "thought")}
_H_START, _H_CHANNEL, _H_MESSAGE, _H_END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
_H_CONSTRAIN, _H_RETURN, _H_CALL = "<|constrain|>", "<|return|>", "<|call|>"
_MARKERS = {
    THINK: (_THINK_OPEN, _THINK_CLOSE),
    CHANNEL: _TAGS[CHANNEL][:2],
    HARMONY: (_H_START, _H_CHANNEL, _H_MESSAGE, _H_END, _H_CONSTRAIN, _H_RETURN, _H_CALL),
}
# The message key each format's templates read an earlier turn's reasoning from (Qwen3's:
# reasoning_content, as OpenAI-compatible servers name it; gpt-oss's: thinking).
_HISTORY_KEY = {THINK: "reasoning_content", CHANNEL: "reasoning_content", HARMONY: "thinking"}


def reasoning_format(template: str | None, tokenizer=None) -> str | None:
    """THINK, CHANNEL, HARMONY or None (no reasoning markup): from the chat template's text,
    else (no template) from the vocabulary (a single token for each marker)."""
    source = template or ""
    if _H_CHANNEL in source and _H_MESSAGE in source:
        return HARMONY
    if _TAGS[CHANNEL][0] in source and _TAGS[CHANNEL][1] in source:
        return CHANNEL
    if _THINK_CLOSE in source:
        return THINK
    if tokenizer is not None and not source:
        def single(text):
            try:
                return len(tokenizer.encode(text, add_special=False, parse_special=True)) == 1
            except Exception:
                return False
        if all(single(m) for m in (_H_CHANNEL, _H_MESSAGE, _H_RETURN)):
            return HARMONY
        if single(_THINK_OPEN) and single(_THINK_CLOSE):
            return THINK
    return None


def opens_reasoning(prompt: str, fmt: str | None) -> bool:
    """Whether the rendered prompt leaves the reasoning's tag (`<think>`, `<|channel>`) open, so
    that generation starts inside the reasoning (templates that write `<think>\\n` in the
    generation prompt)."""
    if fmt not in _TAGS:
        return False
    open_tag, close_tag, _ = _TAGS[fmt]
    return prompt.rfind(open_tag) > prompt.rfind(close_tag)


def close_tag(fmt: str | None) -> str | None:
    """The tag that ends a reasoning block of this format (None: it has no such tag)."""
    return _TAGS[fmt][1] if fmt in _TAGS else None


class ReasoningSplitter:
    """Streamed generated text -> ("reasoning" | "content", text) pieces (see the module doc).

    Text that may be the start of a marker is held back until the next feed tells (the markers
    are single tokens, so this is rare); newlines around the reasoning and at the head of the
    answer are dropped, as the templates strip them when they render the turn again."""

    def __init__(self, fmt: str | None, opened: bool = False):
        self.fmt = fmt
        self._markers = _MARKERS.get(fmt, ())
        self._buf = ""            # text not yet parsed (a possible marker's beginning)
        self._held_newlines = ""  # newlines at the end of the reasoning so far (dropped at its end)
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self._tags = _TAGS.get(fmt)
        self._header = ""            # CHANNEL: the header word still to drop at the reasoning's start
        if self._tags:
            self._state = "reasoning" if opened else "start"
            self._header = self._tags[2] if opened else ""
        elif fmt == HARMONY:
            self._state = "start"    # before the first <|channel|>: text there is answer
        else:
            self._state = "content"
        self._channel = ""           # harmony: the header's text (channel name, recipient)
        self._role = ""              # harmony: the text after <|start|> (the role, a recipient)
        self._lead = True            # at the start of a reasoning / answer: drop newlines

    # ---- public

    def feed(self, text: str) -> list[tuple[str, str]]:
        """The pieces `text` completes (may hold back a possible marker's beginning)."""
        if not self._markers:
            return self._emit(CONTENT, text)
        self._buf += text
        out: list[tuple[str, str]] = []
        while self._buf:
            at, marker = self._next_marker(self._buf)
            if marker is None:
                keep = self._partial_tail(self._buf)
                out += self._text(self._buf[:len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep:]
                break
            out += self._text(self._buf[:at])
            self._buf = self._buf[at + len(marker):]
            out += self._marker(marker)
        return out

    def flush(self) -> list[tuple[str, str]]:
        """Whatever is held back, at the end of the generation."""
        rest, self._buf = self._buf, ""
        return self._text(rest) if rest else []

    # ---- parsing

    def _next_marker(self, s: str) -> tuple[int, str | None]:
        best, which = -1, None
        for m in self._markers:
            i = s.find(m)
            if i >= 0 and (best < 0 or i < best):
                best, which = i, m
        return best, which

    def _partial_tail(self, s: str) -> int:
        """How many characters at the end of s could begin a marker."""
        longest = 0
        for m in self._markers:
            for k in range(min(len(m) - 1, len(s)), longest, -1):
                if m.startswith(s[-k:]):
                    longest = k
                    break
        return longest

    def _marker(self, marker: str) -> list[tuple[str, str]]:
        if self._tags:
            open_tag, close_tag, header = self._tags
            if marker == open_tag and self._state == "start":
                self._state, self._lead, self._header = "reasoning", True, header
                return []
            if marker == close_tag and self._state in ("reasoning", "start"):
                self._header = ""
                self._held_newlines = ""
                self._state, self._lead = "content", True
                return []
            return self._text(marker)          # a marker out of place is text
        # harmony
        if marker == _H_CHANNEL:
            self._state, self._channel = "header", ""
        elif marker == _H_MESSAGE:
            if self._state in ("header", "start"):
                to = next((w[3:] for w in (self._role + " " + self._channel).split() if w.startswith("to=functions.")),
                          None)
                if to is not None:       # a tool call (see the module docstring)
                    self._state = "call"
                    return self._emit(CONTENT, f"{_H_CHANNEL}commentary to={to} {_H_CONSTRAIN}json{_H_MESSAGE}")
                self._state = "reasoning" if self._channel.split()[:1] == ["analysis"] else "content"
                self._lead = True
                self._held_newlines = ""
        elif marker == _H_START:
            self._state, self._channel, self._role = "role", "", ""
        elif marker in (_H_END, _H_RETURN, _H_CALL):
            self._held_newlines = ""
            self._state = "between"
        elif marker == _H_CONSTRAIN:
            if self._state == "header":
                self._channel += " "
            else:
                return self._text(marker)
        return []

    def _text(self, s: str) -> list[tuple[str, str]]:
        if not s:
            return []
        state = self._state
        if state in ("header", "role"):
            if state == "header":
                self._channel += s
            else:
                self._role += s
            return []
        if state == "call":
            return self._emit(CONTENT, s)
        if state == "between":           # between harmony messages: nothing is shown
            return []
        if state == "start":
            if self._tags and not s.strip():
                return []                 # newlines before a <think>
            self._state = state = "content"
        if self._header and state == "reasoning":
            # Gemma 4's "<|channel>thought\n": the word names the channel; it may arrive in parts.
            common = len(self._header) if s.startswith(self._header) else 0
            if not common and self._header.startswith(s):
                self._header = self._header[len(s):]
                return []
            s, self._header = s[common:], ""
        if self._lead:
            s = s.lstrip("\n")
            if not s:
                return []
            self._lead = False
        if state == "reasoning":
            s = self._held_newlines + s
            body = s.rstrip("\n")
            self._held_newlines = s[len(body):]
            return self._emit(REASONING, body)
        return self._emit(CONTENT, s)

    def _emit(self, kind: str, s: str) -> list[tuple[str, str]]:
        if not s:
            return []
        (self.reasoning if kind == REASONING else self.content).append(s)
        return [(kind, s)]


def split_reasoning(text: str, fmt: str | None, opened: bool = False) -> tuple[str, str]:
    """(reasoning, answer) of a whole generated text; reasoning is "" when there is none."""
    s = ReasoningSplitter(fmt, opened)
    s.feed(text)
    s.flush()
    return "".join(s.reasoning), "".join(s.content)


def assistant_message(reasoning: str, answer: str) -> dict:
    """The assistant's turn, for the history and for /v1/chat/completions' message: the answer
    as content, the reasoning (if any) as reasoning_content (llama-server's field; for the
    template, `for_template` puts it under the key the template reads)."""
    msg = {"role": "assistant", "content": answer}
    if reasoning:
        msg["reasoning_content"] = reasoning
    return msg


def for_template(messages: list, fmt: str | None) -> list:
    """`messages` as the template reads them: an assistant turn's `reasoning_content` (the
    history's and OpenAI-compatible clients' name for it) under the key the format's templates
    read (gpt-oss's: `thinking`); other messages unchanged."""
    key = _HISTORY_KEY.get(fmt, "reasoning_content")
    if key == "reasoning_content":
        return messages
    return [{(key if k == "reasoning_content" else k): v for k, v in m.items()}
            if isinstance(m, dict) and "reasoning_content" in m and key not in m else m
            for m in messages]
