"""Tool calls that always parse: the syntax a chat template teaches, as one grammar.

A model offered tools answers either in text or with calls in its template's syntax. Left
alone, a small model misspells a function name or leaves an argument string open at max_tokens;
so the answer is generated under a grammar (constraint.py, llguidance) made from the offered
tools: free text until the call syntax begins (tool_choice "auto"), or a call at once
("required", a named function), and every call's JSON under its function's own schema:

    hermes   (Qwen, Hermes, and every template with no syntax of its own: it is then taught by a
              system message, `instructions`)
             <tool_call>\\n{"name":"f","arguments":{...}}\\n</tool_call>   (repeated: parallel calls)
    mistral  [TOOL_CALLS][{"name":"f","arguments":{...}}, ...]
    granite  <|tool_call|>[{"name":"f","arguments":{...}}, ...]          (Granite 3.x)
    llama3   {"name":"f","parameters":{...}}                            (the whole answer)
    functionary  <function=f>{...}</function>                           (Functionary v3.1)
    qwen3_xml    <tool_call>\n<function=f>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>
             (Qwen3-Coder, Qwen3.5 / 3.6: a value is its text, or JSON: chat/tool_xml.py)
    harmony  <|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}
             (gpt-oss; <|call|>, an end-of-generation token, ends it; reasoning.py hands the
             call message on as this text)

The last three write the name outside the JSON (`Syntax.named`): the JSON is the arguments (or,
qwen3_xml, the parameter blocks).
`Syntax` holds each one's fixed text once; the grammar (`tool_grammar`), the closer that keeps
a cut call parseable within max_tokens (`FramedCloser`, read by budget.py), the parser of a
finished answer and the streaming one (chat/tool_parse.py) all read it.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..json_closer import JsonCloser
from .reasoning import close_tag
from .tool_xml import XmlArgsCloser, params_grammar


@dataclass(frozen=True)
class Syntax:
    name: str
    trigger: str      # the text that starts the calls ("": a call is the whole answer)
    open: str         # after the trigger, before a call's JSON
    close: str        # after a call's JSON
    sep: str | None   # between two calls (None: one JSON value holds every call)
    args_key: str     # "arguments" or "parameters"
    array: bool       # the calls are one JSON array (mistral)
    bare: bool = False  # with tool_choice auto, an answer that is one call's bare JSON is a call
                        # too (how small Qwens often answer, leaving out the tags)
    named: str | None = None   # the name is written before the JSON, then this text (the JSON is
                               # then the arguments alone); None: the name is inside the JSON
    xml: bool = False          # (named) the arguments are <parameter=...> blocks: chat/tool_xml.py


SYNTAXES = {
    "hermes": Syntax("hermes", "<tool_call>", "\n", "\n</tool_call>", "\n<tool_call>\n", "arguments", False,
                     bare=True),
    "mistral": Syntax("mistral", "[TOOL_CALLS]", "", "", None, "arguments", True),
    "granite": Syntax("granite", "<|tool_call|>", "", "", None, "arguments", True),
    "llama3": Syntax("llama3", "", "", "", None, "parameters", False),
    "functionary": Syntax("functionary", "<function=", "", "</function>", "<function=", "", False, named=">"),
    "harmony": Syntax("harmony", "<|channel|>commentary to=functions.", "", "", None, "", False,
                      named=" <|constrain|>json<|message|>"),
    "qwen3_xml": Syntax("qwen3_xml", "<tool_call>", "\n<function=", "\n</tool_call>", "\n<tool_call>\n<function=",
                        "", False, named=">\n", xml=True),
}


def call_format(template: str | None) -> str | None:
    """Which tool-call syntax a chat template teaches (None: none; hermes is then used, taught
    by `instructions`)."""
    template = template or ""
    if "<|channel|>" in template and "to=" in template and "functions." in template:
        return "harmony"
    if "<tool_call>" in template and "<function=" in template and "<parameter=" in template:
        return "qwen3_xml"   # Qwen3-Coder, Qwen3.5 / Qwen3.6
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|tool_call|>" in template:
        return "granite"
    if "<function=" in template and "<parameter=" not in template:
        # Functionary v3.1 (before llama3: its template has <|python_tag|> too); Seed-OSS's and
        # Qwen3-Coder's <function=...><parameter=...> XML calls are not this syntax
        return "functionary"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3"
    return None


def instructions(tools: list[dict]) -> str:
    """A system message teaching the hermes syntax, for templates that do not render tools."""
    listed = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    return ("You may call functions to answer. The functions, as JSON Schema:\n" + listed +
            "\nTo call one, reply with\n<tool_call>\n{\"name\": <function name>, \"arguments\": "
            "<arguments as a JSON object>}\n</tool_call>\nand nothing else.")


def check_choice(tool_choice, names: list[str]) -> str | None:
    """tool_choice as OpenAI (and Anthropic: {"type": "any" | "auto" | "tool", "name"}) spell
    it: "auto" | "none" | "required" | the one function's name; ValueError naming the problem."""
    if tool_choice is None or tool_choice == "auto":
        return "auto"
    if tool_choice in ("none", "required"):
        return tool_choice
    if isinstance(tool_choice, dict):
        kind = tool_choice.get("type")
        if kind in ("auto", "none"):
            return kind
        if kind == "any":
            return "required"
        # OpenAI's chat {"type": "function", "function": {"name"}}; its Responses API's and
        # Anthropic's name the function at the top level
        fn = tool_choice.get("function", tool_choice) if kind == "function" else tool_choice if kind == "tool" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str):
            if name not in names:
                raise ValueError(f"tool_choice names the function {name!r}, which is not among the tools "
                                 f"({', '.join(names)})")
            return "fn:" + name
    raise ValueError(f"tool_choice must be 'auto', 'none', 'required' or {{\"type\": \"function\", "
                     f"\"function\": {{\"name\": ...}}}}, got {tool_choice!r}")


def _call_schema(tools: list[dict], syntax: Syntax, only: str | None) -> dict:
    branches = []
    for t in tools:
        fn = t["function"]
        if only is not None and fn["name"] != only:
            continue
        params = fn.get("parameters") or {"type": "object"}
        branches.append({"type": "object", "properties": {"name": {"const": fn["name"]}, syntax.args_key: params},
                         "required": ["name", syntax.args_key], "additionalProperties": False})
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def _lit(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _special_id(tokenizer, text: str):
    """The id of a control token spelled `text` (the grammar must name it as a token, not as
    text), or None."""
    from ..tokenizer.common import CONTROL
    ids = tokenizer.encode(text, add_special=False, parse_special=True)
    return ids[0] if len(ids) == 1 and tokenizer._types[ids[0]] == CONTROL else None


def tool_grammar(tokenizer, tools: list[dict], fmt: str | None, choice: str = "auto", parallel: bool = True,
                 reason: str | None = None):
    """The Grammar of an answer to a request offering `tools` (choice from check_choice, not
    "none"). Its `schema` and `frame` let budget.py close a call cut by max_tokens. reason: the
    tag that closes a reasoning block the prompt left open (Qwen3.5's `</think>`): the answer is
    free text up to it, newlines, then what it would be without."""
    from ..constraint import Grammar, _llguidance
    syntax = SYNTAXES[fmt or "hermes"]
    only = choice[3:] if choice.startswith("fn:") else None
    guidance = {"x-guidance": {"whitespace_flexible": False, "lenient": True}}
    params = None
    if syntax.named is not None:   # one branch per function: its name, then its arguments' JSON
        params = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"} for t in tools
                  if only is None or t["function"]["name"] == only}
        schema = {"anyOf": list(params.values())}
        lines = [f"body: {' | '.join(f'fn{i}' for i in range(len(params)))}"]
        for i, (name, p) in enumerate(params.items()):
            lines.append(f"fn{i}: {_lit(name + syntax.named)} args{i}")
            lines += params_grammar(i, p, guidance) if syntax.xml else \
                [f"args{i}: %json {json.dumps({**p, **guidance}, ensure_ascii=False)}"]
        body = "\n".join(lines)
    else:
        one = _call_schema(tools, syntax, only)
        if syntax.array:
            schema = {"type": "array", "items": one, "minItems": 1, **({} if parallel and not only else {"maxItems": 1})}
        else:
            schema = one
        schema = {**schema, **guidance}
        body = f"body: %json {json.dumps(schema, ensure_ascii=False)}"
    call = f'body {_lit(syntax.close)}' if syntax.close else "body"
    calls = f"{_lit(syntax.open)} {call}" if syntax.open else call
    if syntax.sep is not None and parallel and not only:
        calls += f" ({_lit(syntax.sep)} {call})*"
    free = choice == "auto"
    if not syntax.trigger:                       # llama3: the JSON is the answer, or text is
        rules = ["start: TEXT | calls" if free else "start: calls", 'TEXT: /(?s:[^{].*)?/']
    else:
        special = _special_id(tokenizer, syntax.trigger)
        trig = f"<[{special}]>" if special is not None else _lit(syntax.trigger)
        bare = " | body" if syntax.bare else ""  # (then text does not start with "{")
        head = "[^{]" if syntax.bare else "."
        if not free:
            rules = [f"start: {trig} calls"]
        elif special is not None:                # text cannot hold a control token: no lookahead
            rules = [f"start: TEXT | TEXT? {trig} calls{bare}", f"TEXT: /(?s:{head}.*)/"]
        else:                                    # the text ends lazily where the trigger begins
            t = re.escape(syntax.trigger)
            rules = [f"start: TEXT | pre calls{bare}", f"TEXT: /(?s:({head}.*)?)/ & ~/(?s:.*{t}.*)/",
                     f"pre[lazy]: /(?s:({head}.*)?){t}/"]
    if reason is not None:
        rid = _special_id(tokenizer, reason)
        rules[0] = rules[0].replace("start:", "answer:", 1)
        rules = ["start: reason nl answer", 'nl: "\\n"*'] + rules + (
            [f"reason: THOUGHT <[{rid}]>", "THOUGHT: /(?s:.*)/"] if rid is not None else
            [f"reason[lazy]: /(?s:.*){re.escape(reason).replace('/', chr(92) + '/')}/"])
    lark = "\n".join(rules + [f"calls: {calls}", body]) + "\n"
    g = Grammar(_llguidance().LLMatcher.grammar_from_lark(lark),
                f"tool calls ({syntax.name}, tool_choice {choice.replace('fn:', 'function ')})")
    g.schema = schema
    g.frame = (syntax, free, parallel and not only, params, reason)
    return g


class FramedCloser:
    """JsonCloser's interface (feed, closing, snapshot, restore) for a tool-call answer: the text
    around the calls (what the syntax fixes) is followed here, each call's JSON by a JsonCloser.
    Phases: "text" (free text; the trigger starts the calls), "lit" (fixed text `rest` before
    the call's JSON, or after it), "name" (a named syntax's function name and the text after
    it, so far in `tail`), "json", "after" (a call complete: the answer may end, or, in
    parallel, the separator begins another)."""

    def __init__(self, schema, frame):
        self.syntax, free, self.parallel, params, self.reason = frame
        # (a fresh call's closer is a copy: schemas resolved once); named syntaxes: per function
        args = XmlArgsCloser if self.syntax.xml else JsonCloser
        self._protos = {n: args(p) for n, p in params.items()} if params is not None else \
            {None: JsonCloser(schema)}
        self._shorts = {n: jc.closing() for n, jc in self._protos.items()}
        s = self.syntax
        self.json, self.fn = None, None
        self.tail = ""
        self.broken = self.bare = False
        if not free:
            self.phase, self.rest = "lit", s.trigger + s.open
        elif not s.trigger or s.bare:
            self.phase, self.rest = "first", ""
        else:
            self.phase, self.rest = "text", ""
        if self.phase == "lit" and not self.rest:
            self._begin()
        self._start = self.snapshot()   # where the answer starts (after any open reasoning)
        if self.reason is not None:     # "reason": text up to its closing tag; "gap": newlines after it
            self.phase, self.tail = "reason", ""

    def _fresh(self, fn, snap=None) -> JsonCloser:
        proto = self._protos[fn]
        if self.syntax.xml:
            return proto.copy(snap)
        jc = JsonCloser.__new__(JsonCloser)
        jc.schemas = proto.schemas
        jc.restore(snap if snap is not None else proto.snapshot())
        return jc

    def _begin(self, fn=None) -> None:
        self.phase, self.rest, self.fn = "json", "", fn
        self.json = self._fresh(fn)

    def _opened(self) -> None:
        """The text before a call is complete: its JSON begins, or (named) its name."""
        if self.syntax.named is not None:
            self.phase, self.tail = "name", ""
        else:
            self._begin()

    def snapshot(self):
        return self.phase, self.rest, self.tail, self.broken, self.bare, self.fn, self.json and self.json.snapshot()

    def restore(self, snap) -> None:
        self.phase, self.rest, self.tail, self.broken, self.bare, self.fn, js = snap
        self.json = None if js is None else self._fresh(self.fn, js)

    def feed(self, text: str) -> None:
        for ch in text:
            if not self.broken:
                self._char(ch)

    def _char(self, ch: str) -> None:
        s = self.syntax
        if self.phase == "reason":
            self.tail = (self.tail + ch)[-len(self.reason):]
            if self.tail == self.reason:
                self.phase, self.tail = "gap", ""
            return
        if self.phase == "gap":
            if ch == "\n":
                return
            self.restore(self._start)
        if self.phase == "first":           # "{": the answer is one call's bare JSON
            if ch == "{":
                self._begin()
                self.bare = bool(s.trigger)
                self.json.feed(ch)
            elif s.trigger:
                self.phase = "text"
                self._char(ch)
            else:
                self.phase = "free"
        elif self.phase == "text":
            self.tail = (self.tail + ch)[-len(s.trigger):]
            if self.tail == s.trigger:
                self.phase, self.rest = "lit", s.open
                if not self.rest:
                    self._opened()
        elif self.phase == "lit":
            if ch != self.rest[0]:
                self.broken = True
                return
            self.rest = self.rest[1:]
            if not self.rest:
                if self.json is not None and self.json.complete:
                    self.phase = "after"
                else:
                    self._opened()
        elif self.phase == "name":
            self.tail += ch
            done = next((n for n in self._protos if n + s.named == self.tail), None)
            if done is not None:
                self._begin(done)
            elif not any((n + s.named).startswith(self.tail) for n in self._protos):
                self.broken = True
        elif self.phase == "json":
            self.json.feed(ch)
            if self.json.complete:
                self.phase, self.rest = ("lit", s.close) if s.close and not self.bare else ("after", "")
        elif self.phase == "after":
            if self.parallel and s.sep and not self.bare:
                self.phase, self.rest, self.json = "lit", s.sep, None
                self._char(ch)
            else:
                self.broken = True

    def _shortest_call(self, typed: str = "") -> str | None:
        """The shortest rest of a call whose name-and-JSON text so far is `typed` (named
        syntaxes: the name and the text after it; else nothing), its closing text included."""
        named = self.syntax.named
        best = None
        for n, short in self._shorts.items():
            head = (n + named) if named is not None else ""
            if short is None or not head.startswith(typed):
                continue
            text = head[len(typed):] + short + self.syntax.close
            if best is None or len(text) < len(best):
                best = text
        return best

    def closing(self) -> str | None:
        if self.broken:
            return None
        if self.phase in ("reason", "gap"):   # the tag (all of it: a part of one is reasoning text), then the answer's
            now = self.snapshot()
            self.restore(self._start)
            rest = self.closing()
            self.restore(now)
            return None if rest is None else ("" if self.phase == "gap" else self.reason) + rest
        if self.phase in ("text", "first", "free", "after"):
            return ""
        if self.phase == "json":
            tail = self.json.closing()
            return None if tail is None else tail + ("" if self.bare else self.syntax.close)
        if self.phase == "name":
            return self._shortest_call(self.tail)
        if self.json is not None and self.json.complete:   # the close after a call
            return self.rest
        short = self._shortest_call()
        return None if short is None else self.rest + short


class ToolPlan:
    """How one request's tools are offered and its calls read: the template's syntax (`fmt`,
    None: hermes taught by a system message), the checked tool_choice, and the Grammar the
    answer is generated under. `plan` makes one; None when no tools are offered."""

    def __init__(self, tokenizer, template, tools: list[dict], choice: str, parallel: bool):
        self.tools, self.choice = tools, choice
        self.schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
        self.fmt, self.parallel = call_format(template), parallel
        self.grammar = tool_grammar(tokenizer, tools, self.fmt, choice, parallel)

    def reasoning_first(self, tokenizer, reasoning_fmt: str | None) -> bool:
        """The prompt left a reasoning block of this format open: the answer reasons up to the
        block's closing tag first. False (the grammar unchanged) for a format without one."""
        tag = close_tag(reasoning_fmt)
        if tag is not None:
            self.grammar = tool_grammar(tokenizer, self.tools, self.fmt, self.choice, self.parallel, tag)
        return tag is not None

    def messages(self, msgs: list[dict]) -> list[dict]:
        """The conversation as the template gets it: with `instructions` in the system message
        where the template has no tool syntax of its own."""
        if self.fmt is not None:
            return msgs
        teach = instructions(self.tools)
        if msgs and msgs[0].get("role") == "system" and isinstance(msgs[0].get("content"), str):
            return [{**msgs[0], "content": msgs[0]["content"] + "\n\n" + teach}] + msgs[1:]
        return [{"role": "system", "content": teach}] + msgs

    def parse(self, text: str) -> tuple[str, list[dict]]:
        return parse_tool_calls(text, self.fmt, self.schemas)

    def stream(self):
        return tool_stream(self.fmt, self.schemas)


def plan(tokenizer, template, tools, tool_choice, parallel=True) -> ToolPlan | None:
    """The ToolPlan of a request (tools as the template takes them: OpenAI's function tools),
    or None: no tools, or tool_choice "none" (the tools are then not shown). ValueError for a
    tool_choice that cannot be met."""
    names = [t["function"]["name"] for t in tools or []]
    if not names:
        if tool_choice not in (None, "auto", "none") and not (isinstance(tool_choice, dict) and
                                                              tool_choice.get("type") in ("auto", "none")):
            raise ValueError(f"tool_choice {tool_choice!r} needs tools, and none were given")
        return None
    choice = check_choice(tool_choice, names)
    if parallel is not None and not isinstance(parallel, bool):
        raise ValueError(f"parallel_tool_calls must be true or false, got {parallel!r}")
    return None if choice == "none" else ToolPlan(tokenizer, template, tools, choice, parallel is not False)


def finish_reason(finish: str, completion, calls: int) -> str:
    """OpenAI's finish_reason of an answer with `calls` calls: "tool_calls", except where
    max_tokens cut it and the budget closed the last call (budget.py): then `finish` ("length"),
    as for any cut JSON."""
    if not calls or (completion is not None and "closed with its shortest" in (completion.stop_detail or "")):
        return finish
    return "tool_calls"


from .tool_parse import ToolStream, new_id, parse_tool_calls, tool_stream  # noqa: E402  (they read SYNTAXES)
