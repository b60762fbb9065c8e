"""Tools in chat requests: the tool list in the form chat templates read (OpenAI's
{"type": "function", "function": {name, description, parameters}}), from OpenAI's and
Anthropic's request shapes; and the tool calls in a model's answer, parsed back out of the
text in the syntax its template taught it (Hermes/Qwen <tool_call>, Mistral [TOOL_CALLS],
Llama 3 JSON), into OpenAI's tool_calls."""
from __future__ import annotations

import json
import re
import uuid

from .params import bad


def template_tools(body: dict) -> list[dict] | None:
    """The request's tools as the chat template takes them, or None. Anthropic's
    {"name", "description", "input_schema"} become OpenAI's function tools."""
    tools = body.get("tools")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise bad("tools", f"must be a list of tools, got {type(tools).__name__}")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise bad("tools", f"tools[{i}] must be an object")
        if t.get("type") == "function" and isinstance(t.get("function"), dict):
            fn = t["function"]
        elif "name" in t and ("input_schema" in t or "parameters" in t):   # Anthropic's, or a bare function
            fn = {"name": t["name"], "description": t.get("description", ""),
                  "parameters": t.get("input_schema", t.get("parameters", {}))}
        else:
            raise bad("tools", f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\", \"parameters\"}}}}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad("tools", f"tools[{i}].function.name must be a non-empty string")
        out.append({"type": "function", "function": {"name": fn["name"], "description": fn.get("description", ""),
                                                     "parameters": fn.get("parameters") or {"type": "object"}}})
    return out


def call_format(template: str) -> str | None:
    """Which tool-call syntax a chat template teaches: "hermes" (<tool_call>{json}</tool_call>,
    Qwen and Hermes), "mistral" ([TOOL_CALLS][...]), "llama3" (a bare {"name", "parameters"}
    object, Llama 3.x), or None."""
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3"
    return None


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def _call(obj) -> dict | None:
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(name, str):
        return None
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def parse_tool_calls(text: str, fmt: str | None, names: set[str]) -> tuple[str, list[dict]]:
    """(the text outside the calls, the calls) of a model's answer. Only calls of the offered
    tools (names) that parse as JSON count; anything else stays text."""
    calls: list[dict] = []
    if fmt == "hermes" or "<tool_call>" in text:
        rest = text
        for m in _HERMES.finditer(text):
            try:
                c = _call(json.loads(m.group(1)))
            except ValueError:
                c = None
            if c is not None and c["function"]["name"] in names:
                calls.append(c)
                rest = rest.replace(m.group(0), "", 1)
        return rest.strip() if calls else text, calls
    body = text.strip()
    if fmt == "mistral" and body.startswith("[TOOL_CALLS]"):
        body = body[len("[TOOL_CALLS]"):].strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>"):].strip()
    if body[:1] in "[{":
        try:
            obj = json.loads(body)
        except ValueError:
            return text, []
        for o in obj if isinstance(obj, list) else [obj]:
            c = _call(o)
            if c is not None and c["function"]["name"] in names:
                calls.append(c)
        if calls:
            return "", calls
    return text, []
