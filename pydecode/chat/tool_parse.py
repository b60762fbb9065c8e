"""Reading tool calls back from an answer (the syntaxes of chat/tools.py): `parse_tool_calls`
for a finished answer, `ToolStream` for one that streams. Both give OpenAI's tool_calls shape;
only calls of the offered functions count, anything else stays text."""
from __future__ import annotations

import json
import re
import uuid

from . import tool_xml
from .tools import SYNTAXES, Syntax


def tool_stream(fmt: str | None, schemas=None):
    """The streaming reader of an answer in syntax fmt (schemas: {name: parameters}, which the
    XML syntax needs to tell a string value from JSON)."""
    return XmlToolStream(schemas) if SYNTAXES[fmt or "hermes"].xml else ToolStream(fmt)


def _call(obj, names) -> dict | None:
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(name, str) or name not in names:
        return None
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return {"id": new_id(), "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def new_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_NAME = r"([A-Za-z0-9_.\-]+)"   # a function's name, where the syntax writes it outside the JSON


def _parse_named(text: str, syntax: Syntax, names) -> tuple[str, list[dict]]:
    """Calls written `trigger NAME named {arguments} close` (functionary, harmony)."""
    head = re.compile(re.escape(syntax.trigger + syntax.open) + _NAME + re.escape(syntax.named))
    dec = json.JSONDecoder()
    calls, kept, at = [], [], 0
    for m in head.finditer(text):
        if m.start() < at:
            continue
        try:
            args, end = dec.raw_decode(text, m.end())
        except ValueError:
            continue
        c = _call({"name": m.group(1), "arguments": args}, names) if isinstance(args, dict) else None
        if c is None:
            continue
        calls.append(c)
        kept.append(text[at:m.start()])
        at = end + len(syntax.close) if syntax.close and text.startswith(syntax.close, end) else end
    if not calls:
        return text, []
    return ("".join(kept) + text[at:]).strip(), calls


def parse_tool_calls(text: str, fmt: str | None, names) -> tuple[str, list[dict]]:
    """(the text outside the calls, the calls) of a finished answer, in OpenAI's tool_calls
    shape. Only calls of the offered tools (names: their names, or {name: parameters schema},
    which the XML syntax reads its values by) count; anything else stays text."""
    syntax = SYNTAXES[fmt or "hermes"]
    if syntax.xml:
        return tool_xml.parse(text, names)
    if syntax.named is not None:
        return _parse_named(text, syntax, names)
    calls: list[dict] = []
    if fmt in (None, "hermes") or "<tool_call>" in text:
        rest = text
        for m in _HERMES.finditer(text):
            try:
                c = _call(json.loads(m.group(1)), names)
            except ValueError:
                c = None
            if c is not None:
                calls.append(c)
                rest = rest.replace(m.group(0), "", 1)
        if calls:
            return rest.strip(), calls
    body = text.strip()
    head, _, after = body.partition(syntax.trigger) if syntax.array else (body, "", "")
    if syntax.array and after:
        body = after.strip()
    else:
        head = ""
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>"):].strip()
    if body[:1] in ("[", "{"):
        try:
            obj = json.loads(body)
        except ValueError:
            return text, []
        for o in obj if isinstance(obj, list) else [obj]:
            c = _call(o, names)
            if c is not None:
                calls.append(c)
        if calls:
            return head.strip(), calls
    return text, []


_HEAD = re.compile(r'\{"name":"((?:[^"\\]|\\.)*)","(?:arguments|parameters)":')


class _Deltas:
    """What the streaming readers share: feed(text) -> deltas (each reader's _char), merged to
    one per kind and call; finish() gives back text held for a trigger that never completed."""
    mode, buf, index = "text", "", -1

    @property
    def calls(self) -> int:
        return self.index + 1

    def feed(self, text: str) -> list[tuple]:
        out: list[tuple] = []
        for ch in text:
            self._char(ch, out)
        merged: list[tuple] = []
        for d in out:                      # one delta per kind and call, not one per character
            if merged and d[0] in ("content", "args") and merged[-1][0] == d[0] and merged[-1][1:-1] == d[1:-1]:
                merged[-1] = merged[-1][:-1] + (merged[-1][-1] + d[-1],)
            else:
                merged.append(d)
        return merged

    def finish(self) -> list[tuple]:
        """The text still held back when the answer ends (a trigger's start that stayed text)."""
        out, self.buf = ([("content", self.buf)] if self.mode == "text" and self.buf else []), ""
        return out

    def _char(self, ch: str, out: list) -> None:
        raise NotImplementedError


class ToolStream(_Deltas):
    """The streaming side of parse_tool_calls, for answers made under tool_grammar (compact JSON,
    name first): `feed(text)` returns deltas, in order:

        ("content", text)                 text before the calls (a possible start of the
                                          trigger is held back until it is decided)
        ("call", index, id, name)         a call begins: its name is known
        ("args", index, fragment)         its arguments' JSON, piece by piece
    """

    def __init__(self, fmt: str | None):
        self.syntax = SYNTAXES[fmt or "hermes"]
        self.mode = "first" if not self.syntax.trigger or self.syntax.bare else "text"
        self.buf = ""          # text held back (a possible trigger) / a call's head so far
        self.index = -1
        self.depth, self.instr, self.esc = 0, False, False

    def _char(self, ch: str, out: list) -> None:
        syn = self.syntax
        trig = syn.trigger
        if self.mode == "first":            # "{" first: a bare call (see Syntax.bare)
            self.mode = "seek" if ch == "{" else "text" if trig else "free"
            if self.mode == "free":
                out.append(("content", ch))
                return
        if self.mode == "free":
            out.append(("content", ch))
        elif self.mode == "text":
            self.buf += ch
            if self.buf.endswith(trig):
                if self.buf[:-len(trig)]:
                    out.append(("content", self.buf[:-len(trig)]))
                self.buf, self.mode = "", "name" if syn.named is not None else "seek"
                return
            keep = _held(self.buf, trig)
            if len(self.buf) > keep:
                out.append(("content", self.buf[:len(self.buf) - keep]))
                self.buf = self.buf[len(self.buf) - keep:]
        elif self.mode == "between":         # after a named call: the next trigger, or nothing
            self.buf += ch
            if self.buf.endswith(trig):
                self.buf, self.mode = "", "name"
        elif self.mode == "name":            # named syntaxes: NAME, then the text before its JSON
            self.buf += ch
            if self.buf.endswith(syn.named) and len(self.buf) > len(syn.open) + len(syn.named):
                self.index += 1
                out.append(("call", self.index, new_id(), self.buf[len(syn.open):-len(syn.named)]))
                self.buf, self.mode, self.depth, self.instr, self.esc = "", "args", 0, False, False
            return
        if self.mode == "seek":
            if ch == "{":
                self.mode, self.buf = "head", "{"
        elif self.mode == "head":
            self.buf += ch
            m = _HEAD.fullmatch(self.buf)
            if m:
                self.index += 1
                out.append(("call", self.index, new_id(), json.loads(f'"{m.group(1)}"')))
                self.mode, self.depth, self.instr, self.esc = "args", 0, False, False
        elif self.mode == "args":
            named = syn.named is not None   # (the JSON is the arguments: it ends the call)
            if not named and not self.instr and self.depth == 0 and ch in "}]":   # the call's own end
                self.mode = "seek"
                return
            out.append(("args", self.index, ch))
            if self.instr:
                if self.esc:
                    self.esc = False
                elif ch == "\\":
                    self.esc = True
                elif ch == '"':
                    self.instr = False
            elif ch == '"':
                self.instr = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if named and self.depth == 0:
                    self.mode, self.buf = "between", ""


def _held(buf: str, end: str) -> int:
    """How many characters at the end of buf may begin `end` (they wait for the next ones)."""
    return next((k for k in range(min(len(end) - 1, len(buf)), 0, -1) if end.startswith(buf[-k:])), 0)


class XmlToolStream(_Deltas):
    """ToolStream's interface (feed -> deltas, finish, calls) for the XML syntax: ("content",
    text) before the calls, ("call", index, id, name) once <function=NAME> is read, ("args",
    index, fragment) its arguments as JSON text: {"city": "Paris", "days": 3}."""

    TRIGGER = SYNTAXES["qwen3_xml"].trigger

    def __init__(self, schemas=None):
        self.schemas = schemas if isinstance(schemas, dict) else {}
        self.mode, self.buf, self.index = "text", "", -1
        self.name, self.param, self.n_params = "", None, 0

    def _is_string(self, param: str) -> bool:
        props = (self.schemas.get(self.name) or {}).get("properties", {})
        return param in props and tool_xml.is_string(props[param])

    def _char(self, ch: str, out: list) -> None:
        self.buf += ch
        b = self.buf
        if self.mode == "text":
            if b.endswith(self.TRIGGER):
                if b[:-len(self.TRIGGER)]:
                    out.append(("content", b[:-len(self.TRIGGER)]))
                self.buf, self.mode = "", "head"
                return
            keep = _held(b, self.TRIGGER)
            if len(b) > keep:
                out.append(("content", b[:len(b) - keep]))
                self.buf = b[len(b) - keep:]
        elif self.mode == "head":        # whitespace, then <function=NAME>
            s = b.lstrip()
            m = re.fullmatch(r"<function=([^>\n]+)>", s)
            if m:
                self.index += 1
                self.name, self.n_params, self.mode, self.buf = m.group(1), 0, "tag", ""
                out.append(("call", self.index, new_id(), self.name))
            elif not ("<function=".startswith(s) or (s.startswith("<function=") and not re.search(r"[>\n]", s))):
                out.append(("content", self.TRIGGER + b))   # not a call after all: text, as parse() leaves it
                self.mode, self.buf = "text", ""
        elif self.mode == "tag":         # <parameter=P>\n, or </function>
            s = b.lstrip("\n")
            m = re.fullmatch(r"<parameter=([^>\n]+)>\n", s)
            if m:
                self.param = m.group(1)
                sep = "{" if not self.n_params else ", "
                self.n_params += 1
                quote = '"' if self._is_string(self.param) else ""
                out.append(("args", self.index, sep + json.dumps(self.param, ensure_ascii=False) + ": " + quote))
                self.mode, self.buf = "text_value" if quote else "json_value", ""
            elif s.startswith(tool_xml.END_ARGS):
                out.append(("args", self.index, "}" if self.n_params else "{}"))
                self.mode, self.buf = "between", ""
        elif self.mode in ("text_value", "json_value"):
            end = tool_xml.END_VALUE.rstrip("\n")
            if b.endswith(end):
                val = b[:-len(end)]
                out += [("args", self.index, self._piece(val))] if val else []
                if self.mode == "text_value":
                    out.append(("args", self.index, '"'))
                self.mode, self.buf = "tag", ""
                return
            keep = _held(b, end)
            if len(b) > keep:
                out.append(("args", self.index, self._piece(b[:len(b) - keep])))
                self.buf = b[len(b) - keep:]
        elif self.mode == "between":     # after a call: the next trigger, or nothing
            if b.endswith(self.TRIGGER):
                self.buf, self.mode = "", "head"
            elif len(b) > len(self.TRIGGER):
                self.buf = b[-len(self.TRIGGER):]

    def _piece(self, s: str) -> str:
        return json.dumps(s, ensure_ascii=False)[1:-1] if self.mode == "text_value" else s
