"""What `pydecode serve`'s flags set for every request: llama-server's server-wide settings
(sampling defaults, the n_predict cap, which optional routes are on, where slots are saved, the
chat template), in one place that the routes read."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

LOCALHOST_ORIGIN = re.compile(r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?$")


@dataclass
class Settings:
    sampling: dict = field(default_factory=dict)   # request defaults set by --temp, --seed, --top-k, ...
    n_predict: int = -1              # --n-predict: the tokens a request without a limit generates (-1: to the full context)
    metrics: bool = False            # --metrics: GET /metrics (501 when off, as llama-server)
    slots: bool = True               # --slots / --no-slots: GET /slots (501 when off)
    slot_save_path: str | None = None   # --slot-save-path: where /slots/N?action=save|restore write and read
    chat_template: str | None = None    # --chat-template(-file): replaces the model's template
    reasoning: str = "auto"          # --reasoning on|off|auto: the template's thinking switch
    reasoning_format: str = "auto"   # --reasoning-format: auto|deepseek (split) or none (left in content)
    tags: tuple = ()                 # --tags: listed in /models
    aliases: tuple = ()              # every name a request's "model" may use (--alias, the file's name)
    alias_names: tuple = ()          # the names --alias gave (listed in /models)
    strict_model: bool = False       # --strict-model: 404 for other model names (default: any name)
    context_shift: bool = False      # --context-shift: a full context drops old tokens instead of ending
    keep: int = 0                    # --keep: tokens at the start a context shift keeps (-1: the prompt)
    embeddings: bool = False         # --embedding: /v1/embeddings
    pooling: str | None = None       # --pooling: none|mean|cls|last (default: the model's)
    props_writable: bool = False     # --props: POST /props may change the default sampling
    sleep_idle_s: float | None = None   # --sleep-idle-seconds: free the model's memory when idle
    cors: tuple = ()                 # --cors / --cors-origins: origins allowed ('*', 'localhost', URLs)
    model_path: str = ""
    verbose: bool = False            # --verbose: every chat answer carries "__verbose" (the prompt)

    def cors_allows(self, origin: str, keyed: bool) -> bool:
        """Whether a browser page at `origin` may call the API. Given origins decide; without
        any, a server with an API key lets any origin (the key guards it, as llama-server does)
        and one without lets only pages served from this machine."""
        rules = self.cors or (("*",) if keyed else ("localhost",))
        for r in rules:
            if r == "*" or r == origin or (r == "localhost" and LOCALHOST_ORIGIN.match(origin)):
                return True
        return False

    def slot_file(self, name) -> str:
        """The path of a slot file named in a request: a plain file name inside --slot-save-path
        (no folder, no '..', nothing hidden), else ValueError naming the rule."""
        if self.slot_save_path is None:
            raise PermissionError("slot files are off: start the server with --slot-save-path DIR")
        if not isinstance(name, str) or not name:
            raise ValueError(f"filename must be a non-empty string, got {name!r}")
        if (os.sep in name or "/" in name or "\\" in name or name.startswith(".") or "\0" in name
                or len(name) > 255 or not re.fullmatch(r"[\w.\-+@=,]+", name)):
            raise ValueError(f"filename {name!r} is not a plain file name (letters, digits and ._-+@=, only; "
                             f"no folders, not starting with a dot)")
        return os.path.join(self.slot_save_path, name)
