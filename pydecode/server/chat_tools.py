"""Tools in chat requests: the tool list in the form chat templates read (OpenAI's
{"type": "function", "function": {name, description, parameters}}), from OpenAI's and
Anthropic's request shapes. The calls' syntax, grammar and parsing: pydecode/chat/tools.py."""
from __future__ import annotations

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
