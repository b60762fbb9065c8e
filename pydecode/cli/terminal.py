"""The interactive terminal: colour (only on a terminal, never with NO_COLOR) and streamed text
wrapped at word boundaries to the terminal's width."""
from __future__ import annotations

import os
import shutil
import sys


def use_colour(stream=None) -> bool:
    """Colour on a terminal unless NO_COLOR is set (no-color.org) or TERM is dumb."""
    stream = stream or sys.stdout
    return (stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM", "") != "dumb")


class Style:
    """ANSI styles, or nothing when colour is off."""

    def __init__(self, on: bool):
        self.on = on

    def _wrap(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.on else text

    def prompt(self, text: str) -> str:
        return self._wrap("1;32", text)      # bold green

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def warn(self, text: str) -> str:
        return self._wrap("33", text)        # yellow


class ReasoningView:
    """A reasoning model's answer on the terminal: its reasoning first, dimmed (without colour:
    between "[thinking]" and "[/thinking]" lines), then the answer as usual. `reasoning` and
    `content` take the streamed parts (ChatSession.ask's write_reasoning and write); `close`
    ends a reasoning the answer never followed."""

    def __init__(self, wrap: "WordWrapper", write, style: Style):
        self.wrap, self.write, self.style = wrap, write, style
        self.open = False

    def reasoning(self, text: str) -> None:
        if not self.open:
            self.wrap.flush()
            self.write("\033[2m" if self.style.on else "[thinking]\n")
            self.open = True
        self.wrap.feed(text)

    def content(self, text: str) -> None:
        self.close()
        self.wrap.feed(text)

    def close(self) -> None:
        if self.open:
            self.wrap.flush()
            self.write("\033[0m\n\n" if self.style.on else "\n[/thinking]\n\n")
            self.wrap.col = 0
            self.open = False


class WordWrapper:
    """Writes streamed text, breaking lines at spaces so that no word is cut at the terminal's
    edge. A word is held until it is complete (a space or newline follows it, or flush()), then
    goes on the current line if it fits, else on the next; a word longer than the whole width
    is cut, as it must be. width=None or 0: no wrapping (text passes through)."""

    def __init__(self, write, width: int | None):
        self.write, self.width = write, width
        self.col = 0          # characters on the current line
        self.word = ""        # the word in progress
        self.spaces = ""      # spaces seen after the last word, not yet written

    @classmethod
    def for_terminal(cls, write, stream=None) -> "WordWrapper":
        stream = stream or sys.stdout
        width = shutil.get_terminal_size((0, 0)).columns if stream.isatty() else 0
        return cls(write, width if width >= 20 else None)

    def feed(self, text: str) -> None:
        if not self.width:
            self.write(text)
            return
        for ch in text:
            if ch == "\n":
                self._put_word()
                self.write("\n")
                self.col, self.spaces = 0, ""
            elif ch in " \t":
                self._put_word()
                self.spaces += ch
            else:
                self.word += ch

    def flush(self) -> None:
        if self.width:
            self._put_word()

    def _put_word(self) -> None:
        if not self.word:
            return
        word, self.word = self.word, ""
        if self.col and self.col + len(self.spaces) + len(word) > self.width:
            self.write("\n")
            self.col = 0
        elif self.spaces:
            self.write(self.spaces)
            self.col += len(self.spaces)
        self.spaces = ""
        while self.col + len(word) > self.width:       # longer than a whole line
            cut = self.width - self.col
            self.write(word[:cut] + "\n")
            word, self.col = word[cut:], 0
        self.write(word)
        self.col += len(word)
