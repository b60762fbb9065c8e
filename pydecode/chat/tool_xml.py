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
run by tools.FramedCloser) and the parser (`parse`); its streaming reader, which gives the
arguments as OpenAI's JSON text piece by piece, is chat/tool_parse.py's XmlToolStream.
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


def is_string(schema: dict) -> bool:
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

    def _ends(self) -> list[str]:
        """The "end" phase's texts: a string choice's values (then the closing tag), or, after a
        JSON value, the closing tag alone."""
        choices = _choices(self.props[self.at][1])
        return [c + END_VALUE for c in choices] if choices else [END_VALUE]

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
                        self.phase = "text" if _is_text(p) else "end" if _choices(p) else "json"
                        self.json = JsonCloser(p) if self.phase == "json" else None
                    return
            if not any(tag.startswith(self.buf) for tag, _ in self._tags()):
                self.broken = True
        elif self.phase == "text":
            self.buf += ch
            if self.buf.endswith(END_VALUE):
                self.phase, self.buf, self.at = "tag", "", self.at + 1
        elif self.phase == "json":
            if ch == END_VALUE[0] and self.json.closing() == "":   # a whole value (a number ends only here)
                self.phase, self.buf, self.json = "end", ch, None
                return
            self.json.feed(ch)
            if self.json.complete:
                self.phase, self.buf, self.json = "end", "", None
        elif self.phase == "end":
            self.buf += ch
            if self.buf in self._ends():
                self.phase, self.buf, self.at = "tag", "", self.at + 1
            elif not any(e.startswith(self.buf) for e in self._ends()):
                self.broken = True

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
        if self.phase == "json":
            tail = self.json.closing()
            return None if tail is None else tail + END_VALUE + rest
        ends = [e for e in self._ends() if e.startswith(self.buf)]
        return None if not ends else min(ends, key=len)[len(self.buf):] + rest


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
