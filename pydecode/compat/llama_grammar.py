"""llama-cpp-python's llama_grammar module: LlamaGrammar (GBNF text, or a JSON Schema turned into
a grammar), enforced by pydecode's structured output (llguidance, pydecode/constraint.py)."""
from __future__ import annotations

import json

from .. import constraint



class LlamaGrammar:
    """A grammar for create_completion / create_chat_completion / generate (grammar=...): GBNF
    text (from_string, from_file), or a JSON Schema (from_json_schema: the schema itself is
    enforced, as response_format does, not a GBNF translation of it). A grammar that does not
    parse is a ValueError when it is made, naming the problem."""

    def __init__(self, *, _grammar: str | None = None, _schema: dict | None = None):
        if _schema is None and (not isinstance(_grammar, str) or not _grammar.strip()):
            raise ValueError("a LlamaGrammar needs GBNF text")
        self._grammar, self._schema = _grammar, _schema
        # Checked now (llguidance converts it): a bad grammar fails here, not in the middle of a call.
        constraint.grammar_of(**self.structure())

    def structure(self) -> dict:
        """The structured-output keyword pydecode's generate / stream take for it."""
        return {"json_schema": self._schema} if self._schema is not None else {"grammar": self._grammar}

    @property
    def grammar(self) -> str:
        return self._grammar if self._grammar is not None else json.dumps(self._schema)

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> "LlamaGrammar":
        return cls(_grammar=grammar)

    @classmethod
    def from_file(cls, file: str, verbose: bool = True) -> "LlamaGrammar":
        with open(file, encoding="utf-8") as f:
            return cls(_grammar=f.read())

    @classmethod
    def from_json_schema(cls, json_schema: str, verbose: bool = True) -> "LlamaGrammar":
        try:
            schema = json.loads(json_schema) if isinstance(json_schema, str) else json_schema
        except json.JSONDecodeError as e:
            raise ValueError(f"from_json_schema: not JSON: {e}") from None
        if not isinstance(schema, dict):
            raise ValueError("from_json_schema: the schema must be a JSON object")
        return cls(_schema=schema)


def json_schema_to_gbnf(schema: str, prop_order=None) -> str:
    raise NotImplementedError("json_schema_to_gbnf: pydecode enforces JSON Schemas directly "
                              "(LlamaGrammar.from_json_schema, response_format), not through GBNF")


def structure_of(grammar) -> dict:
    """grammar= as the compat entry points take it (a LlamaGrammar, GBNF text or None) -> the
    structured-output keyword of pydecode's generate / stream ({} for None)."""
    if grammar is None:
        return {}
    if isinstance(grammar, LlamaGrammar):
        return grammar.structure()
    if isinstance(grammar, str):
        return {"grammar": grammar}
    raise TypeError(f"grammar must be a LlamaGrammar or GBNF text, got {type(grammar).__name__}")
