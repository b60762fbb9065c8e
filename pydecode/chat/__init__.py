"""Chat: the GGUF's chat template rendered in a sandbox (templates.py), and a conversation kept
inside the context window (session.py)."""
from .session import ChatSession, is_base_model
from .templates import CHATML, GEMMA, LLAMA3, TemplateError, fallback_name_and_template, fallback_template, render

__all__ = ["ChatSession", "is_base_model", "render", "fallback_template", "fallback_name_and_template",
           "TemplateError", "CHATML", "GEMMA", "LLAMA3"]
