"""The shortest way to finish a JSON value under a JSON Schema, from any prefix of it.

Structured output must parse even when max_tokens cuts it short. llguidance (constraint.py)
keeps the output a prefix of a valid value but cannot say how far the end is; this module can:
`JsonCloser` reads the output as it is generated (one character at a time, a stack of open
frames: object, array, string, number, literal) and `closing()` returns the shortest text that
completes it under the schema: the open string closed (to a pattern's or an enum's end where it
must), a number given its missing digit, required properties added with their shortest values,
arrays filled to minItems, and the brackets closed. Constraint checks the text against the
grammar before forcing it, so a gap in this model of the schema shows as a refused closing
(logged, and a search takes over), never as invalid output.

What is modelled, as llguidance's JSON compiler reads a schema in its compact form: $ref /
$defs, allOf (merged), anyOf / oneOf, type lists, const, enum; properties in their order, then
additional ones; required, additionalProperties; prefixItems / items / minItems; minLength,
pattern (a regex, unanchored unless it says ^ / $: json_leaves.py), format (date, time,
date-time, email, uuid); minimum / maximum / exclusive bounds.
"""
from __future__ import annotations

import json

from .json_leaves import kind_of, number_rest, string_rest

_START = {"{": "object", "[": "array", '"': "string", "t": "boolean", "f": "boolean", "n": "null"}
_NEVER = None   # a schema no value satisfies (false, {"not": {}})
_INF = 1 << 30


def _dumps(v) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


class Schemas:
    """A root schema's subschemas, resolved: `branches(s)` lists the concrete alternatives of s
    ($ref followed, allOf merged, anyOf / oneOf and type lists expanded), each a dict with at
    most one "type"; `shortest(s)` is the shortest JSON text valid under s (None: none)."""

    def __init__(self, root):
        self.root = root if isinstance(root, dict) else ({} if root is not False else {"not": {}})
        self._branches: dict = {}
        self._shortest: dict = {}

    def _ref(self, ref: str):
        if not isinstance(ref, str) or not ref.startswith("#"):
            return {}   # a remote reference: llguidance refuses it at compile time
        node = self.root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part, {}) if isinstance(node, dict) else {}
        return node

    def branches(self, s) -> list[dict]:
        key = id(s)
        got = self._branches.get(key)
        if got is None:
            self._branches[key] = []   # (a reference to itself in progress: no branch)
            got = self._branches[key] = self._expand(s, 0)
        return got

    def _expand(self, s, depth: int) -> list[dict]:
        if s is True or s is None:
            return [{}]
        if s is False or not isinstance(s, dict) or depth > 32:
            return []
        if s.get("not") == {}:
            return []
        if "$ref" in s:
            rest = {k: v for k, v in s.items() if k != "$ref"}
            return [self._merge(b, rest) for b in self._expand(self._ref(s["$ref"]), depth + 1)]
        if "allOf" in s:
            out = [{k: v for k, v in s.items() if k != "allOf"}]
            for sub in s["allOf"]:
                out = [self._merge(a, b) for a in out for b in self._expand(sub, depth + 1)][:16]
            return [b for a in out for b in self._expand(a, depth + 1)]
        for key in ("anyOf", "oneOf"):
            if key in s:
                rest = {k: v for k, v in s.items() if k != key}
                return [b for sub in s[key] for b in self._expand(self._merge(rest, sub) if rest else sub, depth + 1)]
        t = s.get("type")
        if isinstance(t, list):
            return [dict(s, type=x) for x in t]
        return [s]

    @staticmethod
    def _merge(a: dict, b) -> dict:
        if not isinstance(b, dict):
            return a
        out = dict(a)
        for k, v in b.items():
            if k == "properties" and isinstance(out.get(k), dict):
                out[k] = {**out[k], **v}
            elif k == "required" and isinstance(out.get(k), list):
                out[k] = list(dict.fromkeys(out[k] + list(v)))
            elif k in ("minimum", "exclusiveMinimum", "minLength", "minItems") and k in out:
                out[k] = max(out[k], v)
            elif k in ("maximum", "exclusiveMaximum", "maxLength", "maxItems") and k in out:
                out[k] = min(out[k], v)
            else:
                out[k] = v
        return out

    # ---- the shortest value of a schema

    def shortest(self, s) -> str | None:
        key = id(s)
        if key in self._shortest:
            return self._shortest[key]
        self._shortest[key] = None   # a recursive schema in progress: not this way
        best = None
        for b in self.branches(s):
            t = self.shortest_branch(b)
            if t is not None and (best is None or len(t) < len(best)):
                best = t
        self._shortest[key] = best
        return best

    def shortest_branch(self, s: dict) -> str | None:
        if "const" in s:
            return _dumps(s["const"])
        if "enum" in s:
            return min((_dumps(v) for v in s["enum"]), key=len, default=None)
        kind = kind_of(s)
        if kind == "object":
            parts = []
            for k in required_order(s):
                v = self.shortest(prop_schema(s, k))
                if v is None:
                    return None
                parts.append(f"{_dumps(k)}:{v}")
            return "{" + ",".join(parts) + "}"
        if kind == "array":
            parts = []
            for i in range(int(s.get("minItems", 0))):
                v = self.shortest(item_schema(s, i))
                if v is None:
                    return None
                parts.append(v)
            return "[" + ",".join(parts) + "]"
        if kind == "string":
            rest = string_rest(s, "")
            return None if rest is None else _dumps(rest)
        if kind in ("number", "integer"):
            return number_rest(s, "")
        if kind == "boolean":
            return "true"
        if kind == "null":
            return "null"
        return "0"   # any value


def accepts_start(s: dict, ch: str) -> bool:
    """Whether a value valid under branch s can begin with ch."""
    if "const" in s or "enum" in s:
        vals = [s["const"]] if "const" in s else s["enum"]
        return any(_dumps(v)[:1] == ch for v in vals)
    kind = kind_of(s)
    if kind == "any":
        return True
    want = _START.get(ch, "number")
    return want == kind or (want == "number" and kind == "integer")


def required_order(s: dict) -> list[str]:
    """The required properties in the order llguidance emits them: the defined ones in their
    order, then the others."""
    props = s.get("properties") or {}
    req = [k for k in s.get("required") or [] if isinstance(k, str)]
    return [k for k in props if k in req] + [k for k in req if k not in props]


def prop_schema(s: dict, key: str):
    props = s.get("properties") or {}
    if key in props:
        return props[key]
    extra = s.get("additionalProperties", True)
    return extra if isinstance(extra, dict) else ({} if extra is not False else False)


def item_schema(s: dict, i: int):
    prefix = s.get("prefixItems") or []
    if i < len(prefix):
        return prefix[i]
    items = s.get("items", True)
    return items if isinstance(items, dict) else ({} if items is not False else False)


class JsonCloser:
    """Reads a JSON value as it is generated (`feed`) and says the shortest text that completes
    it (`closing`). Frames are small lists, so `snapshot` / `restore` are cheap:

        ["top", opts, st]                  st: "val" (nothing yet) | "after"
        ["obj", opts, seen, st, key]       st: "k0" (after "{") "k" (after ",") "key" "colon" "val" "after"
        ["arr", opts, count, st]           st: "v0" (after "[") "v" (after ",") "after"
        ["str", opts, content, esc, key?]  esc: "" | "\\" | "u", "u1".. (an escape in progress)
        ["num", opts, text], ["lit", opts, text]

    opts: the schema branches the value may still be, each as (branch, index of the parent's
    branch it belongs to): a closing takes one consistent choice of branches down the stack."""

    def __init__(self, schema):
        self.schemas = Schemas(schema)
        self.stack: list[list] = [["top", [(b, None) for b in self.schemas.branches(self.schemas.root)], "val"]]
        self.broken = False   # text this model of the schema does not follow (closing() is None)

    @property
    def complete(self) -> bool:
        """Whether a whole object or array was read (a number is known complete only by what
        follows it)."""
        return len(self.stack) == 1 and self.stack[0][2] == "after" and not self.broken

    def snapshot(self):
        return [f[:] for f in self.stack], self.broken

    def restore(self, snap) -> None:
        stack, self.broken = snap
        self.stack = [f[:] for f in stack]

    # ---- reading

    def feed(self, text: str) -> None:
        for ch in text:
            if not self.broken:
                self._char(ch)

    def _sub(self, opts, pick) -> list:
        return [(b, j) for j, (s, _) in enumerate(opts) for b in self.schemas.branches(pick(s))]

    def _start(self, ch: str, opts: list) -> None:
        """A value begins with ch: its frame is pushed (the parent is then after a value)."""
        opts = [o for o in opts if accepts_start(o[0], ch)] or opts
        if ch == "{":
            self.stack.append(["obj", opts, (), "k0", None])
        elif ch == "[":
            self.stack.append(["arr", opts, 0, "v0"])
        elif ch == '"':
            self.stack.append(["str", opts, "", "", False])
        elif ch in "tfn":
            self.stack.append(["lit", opts, ch])
        elif ch == "-" or ch.isdigit():
            self.stack.append(["num", opts, ch])
        else:
            self.broken = True

    def _char(self, ch: str) -> None:
        f = self.stack[-1]
        kind = f[0]
        if kind == "str":
            self._str_char(f, ch)
            return
        if kind == "num":
            if ch.isdigit() or ch in ".eE+-":
                f[2] += ch
                return
            self.stack.pop()
            self._char(ch)
            return
        if kind == "lit":
            f[2] += ch
            if f[2] in ("true", "false", "null"):
                self.stack.pop()
            return
        if ch in " \t\r\n":
            return
        st = f[-1] if kind != "obj" else f[3]
        if kind == "top":
            if st == "val":
                f[2] = "after"
                self._start(ch, f[1])
        elif kind == "obj":
            if st in ("k0", "k") and ch == '"':
                f[3] = "key"
                self.stack.append(["str", [], "", "", True])
            elif ch == "}" and st in ("k0", "after"):
                self.stack.pop()
            elif st == "colon" and ch == ":":
                f[3] = "val"
            elif st == "val":
                f[3] = "after"
                key = f[4]
                self._start(ch, self._sub(f[1], lambda s: prop_schema(s, key)))
            elif st == "after" and ch == ",":
                f[3] = "k"
            else:
                self.broken = True
        elif kind == "arr":
            if ch == "]" and st in ("v0", "after"):
                self.stack.pop()
            elif st in ("v0", "v"):
                i = f[2]
                f[2], f[3] = i + 1, "after"
                self._start(ch, self._sub(f[1], lambda s: item_schema(s, i)))
            elif st == "after" and ch == ",":
                f[3] = "v"
            else:
                self.broken = True

    def _str_char(self, f: list, ch: str) -> None:
        esc = f[3]
        if esc == "\\":
            if ch == "u":
                f[3] = "u"
                return
            f[2] += {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}.get(ch, ch)
            f[3] = ""
        elif esc:
            f[3] += ch
            if len(f[3]) == 5:
                try:
                    f[2] += chr(int(f[3][1:], 16))
                except ValueError:
                    self.broken = True
                f[3] = ""
        elif ch == "\\":
            f[3] = "\\"
        elif ch == '"':
            self.stack.pop()
            if f[4]:   # an object's key: the object's branches narrow to those that allow it
                obj = self.stack[-1]
                obj[2] += (f[2],)
                obj[3], obj[4] = "colon", f[2]
                obj[1] = [o for o in obj[1] if prop_schema(o[0], f[2]) is not False] or obj[1]
        else:
            f[2] += ch

    # ---- the shortest completion

    def closing(self) -> str | None:
        """The shortest text that makes what was fed a complete value ('' when it is one);
        None when it cannot be worked out (then the caller searches).

        Bottom-up: `best` maps each branch of the frame below to the shortest text that closes
        everything above it when that branch is the one."""
        if self.broken:
            return None
        stack = self.stack
        i, best = len(stack) - 1, None
        top = stack[i]
        if top[0] == "str" and top[4]:   # inside a key: the object's closing chooses the key
            obj, i = stack[i - 1], i - 2
            best = self._group((self._close_obj_as(s, obj, _pending(top)), p) for s, p in obj[1])
        elif top[0] in ("str", "num", "lit"):
            i -= 1
            best = self._group((_close_leaf(s, top), p) for s, p in top[1] or [({}, 0)])
        while i >= 1:
            f = stack[i]
            close = self._close_obj_as if f[0] == "obj" else self._close_arr_as
            cands = []
            for j, (s, p) in enumerate(f[1]):
                child = "" if best is None else best.get(j)
                if child is not None:
                    own = close(s, f, None) if f[0] == "obj" else close(s, f)
                    cands.append((None if own is None else child + own, p))
            best = self._group(cands)
            i -= 1
        if best is None:   # nothing open above the top frame
            if stack[0][2] == "after":
                return ""
            best = self._group((self.schemas.shortest_branch(s), j) for j, (s, _) in enumerate(stack[0][1]))
        return min(best.values(), key=len, default=None)

    @staticmethod
    def _group(cands) -> dict:
        out: dict = {}
        for text, p in cands:
            if text is not None and (p not in out or len(text) < len(out[p])):
                out[p] = text
        return out

    def _close_obj_as(self, s: dict, f: list, partial_key) -> str | None:
        """The rest of object frame f as branch s: the key being written (partial_key: its
        content and the characters that finish a pending escape), its value, the required
        properties not yet written, the brace."""
        seen, st = f[2], f[3]
        props = list((s.get("properties") or {}).keys())
        req = required_order(s)
        last = max((props.index(k) for k in seen if k in props), default=-1)
        if partial_key is not None or st == "k":   # a key to choose: the cheapest allowed one
            done, fix = partial_key if partial_key is not None else ("", "")
            opening = "" if partial_key is not None else '"'
            best = None
            for j in range(last + 1, len(props)):
                k = props[j]
                if k.startswith(done) and k not in seen:
                    v = self.schemas.shortest(prop_schema(s, k))
                    tail = self._required_after(s, props, seen + (k,), j)
                    if v is not None and tail is not None:
                        t = fix + _dumps(k[len(done):])[1:] + ":" + v + tail
                        if best is None or len(t) < len(best):
                            best = t
                if k in req and k not in seen:
                    break   # a required property cannot be skipped
            extra = s.get("additionalProperties", True)
            if extra is not False and all(k in seen for k in req) and done not in props:
                v = self.schemas.shortest(extra if isinstance(extra, dict) else {})
                if v is not None and (best is None or len(fix) + 2 + len(v) < len(best)):
                    best = fix + '":' + v
            return None if best is None else opening + best + "}"
        head = ""
        if st in ("colon", "val"):
            v = self.schemas.shortest(prop_schema(s, f[4]))
            if v is None:
                return None
            head = (":" if st == "colon" else "") + v
        tail = self._required_after(s, props, seen, last)
        if tail is None:
            return None
        if st == "k0" and tail:
            tail = tail[1:]   # (no comma before the first property)
        return head + tail + "}"

    def _required_after(self, s: dict, props: list, seen: tuple, last: int) -> str | None:
        """The required properties not yet written, each as ,"key":value (None: one was
        skipped, so s cannot be the branch)."""
        parts = []
        for k in required_order(s):
            if k in seen:
                continue
            if k in props and props.index(k) < last:
                return None
            v = self.schemas.shortest(prop_schema(s, k))
            if v is None:
                return None
            parts.append(f",{_dumps(k)}:{v}")
        return "".join(parts)

    def _close_arr_as(self, s: dict, f: list) -> str | None:
        n, st = f[2], f[3]
        parts = []
        if st == "v":   # after a comma: an item must follow
            parts.append(self.schemas.shortest(item_schema(s, n)))
            n += 1
        while n < int(s.get("minItems", 0)):
            v = self.schemas.shortest(item_schema(s, n))
            parts.append(None if v is None else ("," if n else "") + v)
            n += 1
        return None if None in parts else "".join(parts) + "]"


def _pending(f: list) -> tuple[str, str]:
    """A string frame's content with a pending escape finished, and the characters that finish
    it ("\\" + "n", "\\u12" + "00")."""
    esc = f[3]
    if not esc:
        return f[2], ""
    if esc == "\\":
        return f[2] + "\n", "n"
    fix = "0" * (5 - len(esc))
    return f[2] + chr(int((esc[1:] + fix), 16)), fix


def _close_leaf(s: dict, f: list) -> str | None:
    """The rest of a string, number or literal frame f as branch s."""
    kind, text = f[0], f[2]
    if kind == "lit":
        return next((w[len(text):] for w in ("true", "null", "false") if w.startswith(text)), None)
    if kind == "num":
        if "const" in s or "enum" in s:
            vals = [_dumps(v) for v in ([s["const"]] if "const" in s else s["enum"])]
            return min((v[len(text):] for v in vals if v.startswith(text)), key=len, default=None)
        k = kind_of(s)
        return number_rest(s if k in ("number", "integer") else {}, text) if k in ("number", "integer", "any") else None
    done, fix = _pending(f)
    rest = string_rest(s, done)
    return None if rest is None else fix + _dumps(rest)[1:]
