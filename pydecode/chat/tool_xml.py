"""The XML tool-call syntax of Qwen3-Coder and Qwen3.5 / Qwen3.6 (chat/tools.py's "qwen3_xml"):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

A parameter's value is its text: a string as it is (any text but the closing tag), anything else
as JSON (the templates write mappings and lists with tojson). Here: the grammar of one function's
parameters (`params_grammar`), the closer of a cut call (`XmlArgsCloser`, JsonCloser's interface,
run by tools.FramedCloser), the parser (`parse`) and the streaming reader (`XmlToolStream`), which
gives the arguments as OpenAI's JSON text, piece by piece.
"""
from __future__ import annotations

import json
import re

from ..json_closer import JsonCloser

END_VALUE = "\n</parameter>\n"
END_ARGS = "</function>"


def _props(schema: dict) -> list[tuple[str, dict, bool]]:
    """(name, schema, required) per property, in the schema's order (the templates' order)."""
    props = (schema or {}).get("properties") or {}
    req = set((schema or {}).get("required") or [])
    return [(n, p if isinstance(p, dict) else {}, n in req) for n, p in props.items()]


def _choices(schema: dict) -> list[str] | None:
    """A parameter's string choices (enum / const of strings only), written as they are; else None."""
    opts = schema.get("enum", [schema["const"]] if "const" in schema else None)
    return opts if opts and all(isinstance(o, str) for o in opts) else None


def _is_text(schema: dict) -> bool:
    """Whether a parameter's value is written as plain text (a string without choices)."""
    return schema.get("type") == "string" and "enum" not in schema and "const" not in schema


def _is_string(schema: dict) -> bool:
    """Whether the value is a string written as it is (free text, or one of its choices)."""
    return _is_text(schema) or _choices(schema) is not None


def _lit(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def params_grammar(i: int, schema: dict, guidance: dict) -> list[str]:
    """Lark rules `args{i}`: function i's parameters in schema order (the optional ones may be
    left out), then </function>."""
    rules, parts = [], []
    for j, (name, p, required) in enumerate(_props(schema)):
        head = _lit('<parameter=' + name + '>' + chr(10))
        if _is_text(p):   # the value ends at the first closing tag (a lazy lexeme)
            end = re.escape(END_VALUE).replace("\\\n", "\\n").replace("/", "\\/")   # in Lark's /.../
            rules.append(f"txt{i}_{j}[lazy]: /(?s:.*){end}/")
            rules.append(f"p{i}_{j}: {head} txt{i}_{j}")
        elif _choices(p) is not None:
            rules.append(f"p{i}_{j}: {head} ({' | '.join(_lit(c) for c in _choices(p))}) {_lit(END_VALUE)}")
        else:
            rules.append(f"v{i}_{j}: %json {json.dumps({**p, **guidance}, ensure_ascii=False)}")
            rules.append(f"p{i}_{j}: {_lit('<parameter=' + name + '>' + chr(10))} v{i}_{j} {_lit(END_VALUE)}")
        parts.append(f"p{i}_{j}" + ("" if required else "?"))
    rules.insert(0, f"args{i}: {' '.join(parts + [_lit(END_ARGS)])}")
    return rules


def convert(raw: str, schema: dict | None):
    """A parameter's text as the value it stands for: a string parameter's text as it is; else
    its JSON (Python's True / False / None as the templates' `| string` writes them), falling
    back to the text."""
    if schema is not None and (_is_text(schema) or raw in (_choices(schema) or ())):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return {"True": True, "False": False, "None": None}.get(raw.strip(), raw)


class XmlArgsCloser:
    """JsonCloser's interface (feed, closing, complete, snapshot, restore) over one function's
    parameters and its </function>: the shortest text that completes them from where a cut
    left them (the required parameters not yet written get the shortest values)."""

    def __init__(self, schema: dict):
        self.props = _props(schema)
        self._short = [("" if _is_text(p) else min(_choices(p), key=len) if _choices(p) else JsonCloser(p).closing())
                       for _, p, _ in self.props]
        self.phase, self.buf, self.at, self.json = "tag", "", 0, None
        self.complete = False
        self.broken = False

    def snapshot(self):
        return self.phase, self.buf, self.at, self.complete, self.broken, self.json and self.json.snapshot()

    def restore(self, snap) -> None:
        self.phase, self.buf, self.at, self.complete, self.broken, js = snap
        self.json = None
        if js is not None:
            self.json = JsonCloser(self.props[self.at][1])
            self.json.restore(js)

    def copy(self, snap=None) -> "XmlArgsCloser":
        c = XmlArgsCloser.__new__(XmlArgsCloser)
        c.props, c._short = self.props, self._short
        c.restore(snap if snap is not None else self.snapshot())
        return c

    def _rest(self, at: int) -> str | None:
        """The shortest text after the parameters before `at`: the required ones left, then </function>."""
        out = ""
        for k in range(at, len(self.props)):
            if self.props[k][2]:
                if self._short[k] is None:
                    return None
                out += f"<parameter={self.props[k][0]}>\n{self._short[k]}{END_VALUE}"
        return out + END_ARGS

    def _tags(self):
        """(text, index) of what may come in the tag phase: a parameter's opening tag, or the end."""
        for k in range(self.at, len(self.props)):
            yield f"<parameter={self.props[k][0]}>\n", k
            if self.props[k][2]:
                return
        yield END_ARGS, None

    def feed(self, text: str) -> None:
        for ch in text:
            if self.broken or self.complete:
                self.broken = True
                return
            self._char(ch)

    def _char(self, ch: str) -> None:
        if self.phase == "tag":
            self.buf += ch
            for tag, k in self._tags():
                if tag == self.buf:
                    self.buf = ""
                    if k is None:
                        self.complete = True
                    else:
                        self.at, p = k, self.props[k][1]
                        self.phase = "text" if _is_text(p) else "choice" if _choices(p) else "json"
                        self.json = JsonCloser(p) if self.phase == "json" else None
                    return
            if not any(tag.startswith(self.buf) for tag, _ in self._tags()):
                self.broken = True
        elif self.phase == "text":
            self.buf += ch
            if self.buf.endswith(END_VALUE):
                self.phase, self.buf, self.at = "tag", "", self.at + 1
        elif self.phase == "choice":
            self.buf += ch
            opts = [c + END_VALUE for c in _choices(self.props[self.at][1])]
            if self.buf in opts:
                self.phase, self.buf, self.at = "tag", "", self.at + 1
            elif not any(o.startswith(self.buf) for o in opts):
                self.broken = True
        elif self.phase == "json":
            if ch == END_VALUE[0] and self.json.closing() == "":   # a whole value (a number ends only here)
                self.phase, self.buf, self.json = "lit", END_VALUE[1:], None
                return
            self.json.feed(ch)
            if self.json.complete:
                self.phase, self.buf, self.json = "lit", END_VALUE, None
        elif self.phase == "lit":
            if ch != self.buf[0]:
                self.broken = True
                return
            self.buf = self.buf[1:]
            if not self.buf:
                self.phase, self.at = "tag", self.at + 1

    def closing(self) -> str | None:
        if self.broken:
            return None
        if self.complete:
            return ""
        if self.phase == "tag":
            best = None
            for tag, k in self._tags():
                if not tag.startswith(self.buf):
                    continue
                if k is None:
                    text = tag
                else:
                    rest = self._rest(k + 1)
                    text = None if rest is None or self._short[k] is None else tag + self._short[k] + END_VALUE + rest
                if text is not None and (best is None or len(text) < len(best)):
                    best = text
            return None if best is None else best[len(self.buf):]
        rest = self._rest(self.at + 1)
        if rest is None:
            return None
        if self.phase == "text":
            return END_VALUE + rest
        if self.phase == "choice":
            opts = [c for c in _choices(self.props[self.at][1]) if c.startswith(self.buf)]
            return None if not opts else min(opts, key=len)[len(self.buf):] + END_VALUE + rest
        if self.phase == "json":
            tail = self.json.closing()
            return None if tail is None else tail + END_VALUE + rest
        return self.buf + rest


_CALL = re.compile(r"<tool_call>\s*<function=([^>\n]+)>\n?(.*?)</function>\s*(?:</tool_call>|$)", re.S)
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def parse(text: str, schemas) -> tuple[str, list[dict]]:
    """(the text outside the calls, the calls) of a finished answer. schemas: the offered
    functions, {name: parameters schema} (or just their names: values are then read as JSON
    where they parse)."""
    from .tool_parse import new_id
    calls, kept, at = [], [], 0
    for m in _CALL.finditer(text):
        name = m.group(1).strip()
        if name not in schemas:
            continue
        props = (schemas.get(name) or {}).get("properties", {}) if isinstance(schemas, dict) else {}
        args = {p.group(1).strip(): convert(p.group(2), props.get(p.group(1).strip()))
                for p in _PARAM.finditer(m.group(2))}
        calls.append({"id": new_id(), "type": "function",
                      "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
        kept.append(text[at:m.start()])
        at = m.end()
    if not calls:
        return text, []
    return ("".join(kept) + text[at:]).strip(), calls


def _held(buf: str, end: str) -> int:
    """How many characters at the end of buf may begin `end` (they wait for the next ones)."""
    return next((k for k in range(min(len(end) - 1, len(buf)), 0, -1) if end.startswith(buf[-k:])), 0)


class XmlToolStream:
    """ToolStream's interface (feed -> deltas, finish, calls) for the XML syntax: ("content",
    text) before the calls, ("call", index, id, name) once <function=NAME> is read, ("args",
    index, fragment) its arguments as JSON text: {"city": "Paris", "days": 3}."""

    TRIGGER = "<tool_call>"

    def __init__(self, schemas=None):
        self.schemas = schemas if isinstance(schemas, dict) else {}
        self.mode, self.buf, self.index = "text", "", -1
        self.name, self.param, self.n_params = "", None, 0

    @property
    def calls(self) -> int:
        return self.index + 1

    def feed(self, text: str) -> list[tuple]:
        out: list[tuple] = []
        for ch in text:
            self._char(ch, out)
        merged: list[tuple] = []
        for d in out:
            if merged and d[0] in ("content", "args") and merged[-1][0] == d[0] and merged[-1][1:-1] == d[1:-1]:
                merged[-1] = merged[-1][:-1] + (merged[-1][-1] + d[-1],)
            else:
                merged.append(d)
        return merged

    def finish(self) -> list[tuple]:
        out, self.buf = ([("content", self.buf)] if self.mode == "text" and self.buf else []), ""
        return out

    def _is_string(self, param: str) -> bool:
        props = (self.schemas.get(self.name) or {}).get("properties", {})
        return param in props and _is_string(props[param])

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
                out.append(("call", self.index, _new_id(), self.name))
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
            elif s.startswith(END_ARGS):
                out.append(("args", self.index, "}" if self.n_params else "{}"))
                self.mode, self.buf = "between", ""
        elif self.mode in ("text_value", "json_value"):
            end = END_VALUE.rstrip("\n")
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


def _new_id() -> str:
    from .tool_parse import new_id
    return new_id()
