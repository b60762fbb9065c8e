"""Our GGUF reader against the gguf package's GGUFReader (the reference), and bad files.

A bad file must raise ModelError naming the problem: never a crash, a hang or a huge allocation.
"""
import struct

import numpy as np
import pytest
from gguf import GGUFReader

from conformance import SHA256, tokenizer_dir
from pydecode import ModelError
from pydecode.gguf_file import GGUFFile

VOCABS = sorted(n for n in SHA256 if n.endswith(".gguf"))   # llama.cpp's vocabularies (fetched, cached)


def _same_as_reader(path):
    ours = GGUFFile(path)
    ref = GGUFReader(str(path))
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        assert key in ours.metadata, key
        want = field.contents()
        got = ours.metadata[key]
        if isinstance(want, float):
            assert got == pytest.approx(want), key
        else:
            assert got == want, key
    assert len(ours.tensors) == len(ref.tensors)
    for t in ref.tensors:
        mine = ours.tensors[t.name]
        assert mine.offset == t.data_offset and list(mine.shape) == [int(x) for x in t.shape]
        assert mine.type == int(t.tensor_type) and mine.n_bytes == t.n_bytes
        assert np.array_equal(ours.tensor_bytes(t.name), np.asarray(t.data).view(np.uint8).reshape(-1))
    return ours


def test_model_file_matches_reference_reader(smollm_path):
    g = _same_as_reader(smollm_path)
    assert g.architecture == "llama" and len(g.tensors) == 272


@pytest.mark.parametrize("name", VOCABS[:4])
def test_vocab_files_match_reference_reader(name):
    _same_as_reader(tokenizer_dir() / name)


def test_tensor_data_is_zero_copy(smollm_path):
    g = GGUFFile(smollm_path)
    view = g.tensor_bytes("blk.0.attn_q.weight")
    assert view.base is not None and not view.flags.writeable  # a view into the read-only map


def _header(n_tensors=0, kvs=b"", n_kv=0, version=3):
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + kvs


def _kv_string(key, value):
    k, v = key.encode(), value.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", 8) + struct.pack("<Q", len(v)) + v


BAD_FILES = {
    "empty": b"",
    "not gguf": b"PK\x03\x04" + b"\0" * 100,
    "bad version": _header(version=99) + b"\0" * 16,
    "huge tensor count": _header(n_tensors=1 << 60) + b"\0" * 16,
    "huge kv count": _header(n_kv=1 << 60) + b"\0" * 16,
    "string longer than file": _header(n_kv=1, kvs=struct.pack("<Q", 1 << 40) + b"abc"),
    "truncated value": _header(n_kv=1, kvs=_kv_string("general.name", "x")[:-1] + b"\0" * 0),
    "unknown value type": _header(n_kv=1, kvs=struct.pack("<Q", 1) + b"k" + struct.pack("<I", 77) + b"\0" * 16),
    "huge array": _header(n_kv=1, kvs=struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 4, 1 << 50) + b"\0" * 16),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_headers_raise_model_error(tmp_path, name):
    p = tmp_path / "bad.gguf"
    p.write_bytes(BAD_FILES[name])
    with pytest.raises(ModelError) as e:
        GGUFFile(p)
    assert str(p) in str(e.value)


def test_truncated_model_names_the_tensor(tmp_path, smollm_path):
    data = smollm_path.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelError, match="truncated.*output_norm|truncated file: tensor"):
        GGUFFile(p)


def _with_tensor_type(src, dst, tensor: str, type_id: int):
    """A copy of GGUF `src` at `dst` whose directory gives `tensor` the type id `type_id`."""
    g = GGUFFile(src)
    data = bytearray(src.read_bytes())
    name = tensor.encode()
    at = data.index(struct.pack("<Q", len(name)) + name, 0, g.data_start)
    type_at = at + 8 + len(name) + 4 + 8 * 2   # name, n_dims, two dims
    data[type_at:type_at + 4] = struct.pack("<I", type_id)
    dst.write_bytes(bytes(data))
    return dst


def test_unknown_tensor_type_named_at_load(tmp_path, smollm_path):
    """Corrupt the type id of one tensor in the directory: load names that tensor."""
    p = _with_tensor_type(smollm_path, tmp_path / "badtype.gguf", "blk.0.attn_q.weight", 250)
    with pytest.raises(ModelError, match="blk.0.attn_q.weight.*unknown type id 250"):
        GGUFFile(p)


def test_unsupported_type_in_model_names_tensor(tmp_path, smollm_path):
    """A known but unsupported type in a weight: Model() names tensor and type. (IQ2_XXS's
    256-value blocks would not fit a 576-value row, a shape error; Q8_1 (9) has 32-value blocks
    and is never stored in files.)"""
    import pydecode

    p = _with_tensor_type(smollm_path, tmp_path / "q81.gguf", "blk.3.ffn_up.weight", 9)
    with pytest.raises(ModelError, match=r"ffn_up.*(unsupported|Q8_1)"):
        pydecode.Model(p, n_ctx=64, n_threads=1)


def test_missing_tensor_and_wrong_arch(tmp_path, smollm_path):
    import pydecode

    g = GGUFFile(smollm_path)
    data = bytearray(smollm_path.read_bytes())
    name = b"blk.7.ffn_gate.weight"
    at = data.index(name, 0, g.data_start)
    data[at:at + len(name)] = b"blk.7.ffn_xxxx.weight"
    p = tmp_path / "missing.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="blk.7.ffn_gate.weight is missing"):
        pydecode.Model(p, n_ctx=64, n_threads=1)

    data = bytearray(smollm_path.read_bytes())
    at = data.index(b"llama", 0, 4096)
    data[at:at + 5] = b"xyzzy"
    p = tmp_path / "arch.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="architecture 'xyzzy' is not supported"):
        pydecode.Model(p, n_ctx=64, n_threads=1)


def test_missing_file():
    with pytest.raises(ModelError, match="cannot open"):
        GGUFFile("/nonexistent/model.gguf")
