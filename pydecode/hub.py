"""Models named by their Hugging Face repository, resolved through huggingface_hub's cache.

Accepted forms (llama.cpp's `-hf` and ollama's `hf.co/` spellings included):
    hf://OWNER/REPO/FILE.gguf      one file of the repository (FILE may be a glob: *Q4_K_M.gguf)
    hf://OWNER/REPO  OWNER/REPO    the repository's Q4_K_M file (llama.cpp's default), else its
                                   only or first .gguf
    OWNER/REPO:QUANT               the .gguf whose name carries QUANT (Q8_0, q4_k_m, ...)
    hf.co/OWNER/REPO[:QUANT]       the same

A file already in the local cache is used without the network; otherwise it is downloaded
(huggingface_hub's progress bar, its cache, its token and endpoint settings). With
HF_HUB_OFFLINE=1, or no network, a file not in the cache is a clear error. huggingface_hub is
an optional dependency: `pip install 'pydecode[hf]'`.
"""
from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

from .errors import ModelError

_REPO = r"[A-Za-z0-9][\w.-]*/[\w.-]+"
_SHORT = re.compile(rf"^(?:hf\.co/|huggingface\.co/)?({_REPO})(?::([\w.-]+))?$")
DEFAULT_QUANT = "Q4_K_M"


def parse(name: str) -> tuple[str, str | None, str | None] | None:
    """(repo_id, file or glob, quant) if `name` is a Hugging Face spelling, else None."""
    if name.startswith("hf://"):
        rest = name[len("hf://"):].strip("/")
        parts = rest.split("/")
        if len(parts) < 2 or not all(parts[:2]):
            raise ModelError(f"{name!r}: expected hf://OWNER/REPO or hf://OWNER/REPO/FILE.gguf")
        repo, file = "/".join(parts[:2]), "/".join(parts[2:]) or None
        quant = None
        if file is None and ":" in repo:
            repo, quant = repo.split(":", 1)
        return repo, file, quant
    m = _SHORT.match(name)
    if m and not name.endswith(".gguf"):
        return m.group(1), None, m.group(2)
    return None


def _hub():
    try:
        import huggingface_hub
        import huggingface_hub.constants  # noqa: F401  (a submodule: not loaded by the package itself)
    except ImportError:
        raise ModelError("naming a model by its Hugging Face repository needs huggingface_hub: "
                         "pip install 'pydecode[hf]' (or pip install huggingface_hub)") from None
    return huggingface_hub


def _offline(hub) -> bool:
    return bool(getattr(hub.constants, "HF_HUB_OFFLINE", False))


def _cached_files(hub, repo: str) -> list[str]:
    """Files of `repo`'s cached snapshot of its main revision (relative paths), or []."""
    root = Path(hub.constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
    try:
        rev = (root / "refs" / "main").read_text().strip()
    except OSError:
        snaps = sorted((root / "snapshots").glob("*")) if (root / "snapshots").is_dir() else []
        if not snaps:
            return []
        rev = snaps[-1].name
    snap = root / "snapshots" / rev
    return sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file() or p.is_symlink())


def _pick(files: list[str], file: str | None, quant: str | None, what: str) -> str:
    ggufs = [f for f in files if f.lower().endswith(".gguf")]
    if file is not None:
        hits = [f for f in files if fnmatch.fnmatch(f, file)] if any(c in file for c in "*?[") else \
            [f for f in files if f == file]
        if not hits:
            raise ModelError(f"{what}: no file matches {file!r} (it has: {', '.join(ggufs[:12]) or 'no .gguf files'})")
        return sorted(hits)[0]
    want = (quant or DEFAULT_QUANT).lower()
    hits = [f for f in ggufs if want in Path(f).name.lower()]
    if not hits and quant is None and ggufs:
        hits = ggufs
    if not hits:
        raise ModelError(f"{what}: no .gguf file {'for quantization ' + repr(quant) if quant else ''} "
                         f"(it has: {', '.join(ggufs[:12]) or 'no .gguf files'})")
    return sorted(hits, key=lambda f: ("-of-" in f, len(f), f))[0]


def resolve(name: str) -> Path:
    """The local path of the Hugging Face model `name` (see the module docstring)."""
    repo, file, quant = parse(name)
    hub = _hub()
    what = f"Hugging Face repository {repo}"
    cached = _cached_files(hub, repo)
    if file is not None and not any(c in file for c in "*?["):
        path = hub.try_to_load_from_cache(repo, file)
        if isinstance(path, str) and os.path.exists(path):
            return Path(path)
    else:
        try:
            chosen = _pick(cached, file, quant, what) if cached else None
        except ModelError:
            chosen = None
        if chosen is not None:
            return Path(hub.try_to_load_from_cache(repo, chosen))
    if _offline(hub):
        raise ModelError(f"{name!r} is not in the Hugging Face cache ({hub.constants.HF_HUB_CACHE}) and "
                         f"HF_HUB_OFFLINE is set; download it once online, or pass a path to the .gguf")
    try:
        if file is None or any(c in file for c in "*?["):
            file = _pick(hub.HfApi().list_repo_files(repo), file, quant, what)
        return Path(hub.hf_hub_download(repo, file))
    except ModelError:
        raise
    except Exception as e:   # network, authentication, a missing repository: say which
        raise ModelError(f"{what}: cannot fetch {file or 'its file list'}: {type(e).__name__}: {e}") from None
