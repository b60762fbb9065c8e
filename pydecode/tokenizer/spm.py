"""SentencePiece ("llama" vocabularies: Llama 2, Mistral, Phi-3, Gemma): `sentencepiece` runs a
model built from the GGUF vocabulary (and cached beside the model file)."""
from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from array import array
from pathlib import Path

from .common import BYTE, NORMAL, TokenizerError

#
# llama.cpp's SPM tokenizer (llm_tokenizer_spm) escapes spaces as U+2581, prepends one to every
# plain-text fragment when add_space_prefix is set, then merges adjacent symbols, best vocabulary
# score first (ties: leftmost first), and spells symbols left outside the vocabulary as <0xNN>
# byte tokens. That is exactly SentencePiece's BPE model with byte fallback, so the vocabulary is
# written as a SentencePiece ModelProto (by hand: the wire format is simple and avoids needing
# `protobuf`) and run by `sentencepiece`. The escaping and the prefix are done here, with
# SentencePiece's normalizer off, so nothing else (NFKC, whitespace folding) touches the text.
#
# llama.cpp can merge into *any* vocabulary entry (control, user-defined, unused ones too), while
# SentencePiece never produces control/user-defined/unused pieces by merging; so every entry is
# written as NORMAL except the unknown piece and the byte pieces, which SentencePiece needs
# typed. Special tokens written in text are cut out before (Tokenizer._partition).

_SPM_NORMAL, _SPM_UNKNOWN, _SPM_BYTE = 1, 2, 6
_SPM_CACHE_FORMAT = "pydecode-spm-1"
_SPM_CHECK_FIELD = 1000  # not a ModelProto field: parsers skip it
_SPACE = "\u2581"


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # protobuf writes negative int32 as 10-byte two's complement
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _pb_bytes(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _pb_int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


class _SentencePiece:
    """Backend for `tokenizer.ggml.model == "llama"`: SentencePiece (BPE-style merges by score)."""

    default_add_bos = True  # llama.cpp's defaults for SPM vocabularies
    default_ids = {"bos": 1, "eos": 2}

    def __init__(self, meta: dict, tokens: list[str], vocab: dict[str, int],
                 cache_path: str | os.PathLike | None = None):
        import sentencepiece

        n = len(tokens)
        self.add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        unk = meta.get("tokenizer.ggml.unknown_token_id")
        unk = int(unk) if unk is not None and 0 <= int(unk) < n else 0
        types = meta.get("tokenizer.ggml.token_type") or [NORMAL] * n
        scores = meta.get("tokenizer.ggml.scores") or [0.0] * n  # llama.cpp: missing -> 0
        for key, values in (("token_type", types), ("scores", scores)):
            if len(values) < n:
                raise TokenizerError(f"tokenizer.ggml.{key} has {len(values)} entries "
                                     f"for {n} tokens")

        pieces = list(tokens)
        kinds = bytearray([_SPM_NORMAL]) * n
        bytes_ = {f"<0x{b:02X}>": b for b in range(256)}
        byte_ids = [i for i in range(n) if types[i] == BYTE and pieces[i] in bytes_]
        # Byte fallback needs all 256 byte pieces (llama.cpp would otherwise fail on the rest).
        self.byte_fallback = len({pieces[i] for i in byte_ids}) == 256
        if self.byte_fallback:
            for i in byte_ids:
                kinds[i] = _SPM_BYTE
        kinds[unk] = _SPM_UNKNOWN
        # SentencePiece refuses duplicate pieces; llama.cpp's text -> id map keeps the last one,
        # so earlier copies get an unreachable name.
        if len(vocab) < n:
            for i, text in enumerate(pieces):
                if vocab[text] != i:
                    pieces[i] = f"\ue000pydecode-duplicate-{i}"
                    kinds[i] = _SPM_NORMAL

        scores32 = array("f", scores[:n])
        header = self._header(pieces, scores32, kinds, unk)
        proto = self._load_cache(cache_path, header)
        sp = None
        if proto is not None:
            try:
                sp = sentencepiece.SentencePieceProcessor(model_proto=proto)
            except RuntimeError:  # unreadable after all: rebuild it
                proto = None
        if proto is None:
            proto = header + self._pieces_proto(pieces, scores32, kinds) + _pb_bytes(
                3, _pb_bytes(1, b"identity") + _pb_int(3, 0) + _pb_int(4, 0) + _pb_int(5, 0))
            # Last, in a field SentencePiece ignores: a hash of all the bytes before it.
            proto += _pb_bytes(_SPM_CHECK_FIELD, hashlib.sha256(proto).digest())
            try:
                sp = sentencepiece.SentencePieceProcessor(model_proto=proto)
            except RuntimeError as e:
                raise TokenizerError(f"SentencePiece refused the vocabulary: {e}") from None
            self._save_cache(cache_path, proto)
        self.proto = proto  # a complete SentencePiece model file (what the cache holds)
        self._encode_ids = sp.encode
        self.sentencepiece = sp

    def _header(self, pieces, scores32, kinds, unk) -> bytes:
        """The serialized trainer_spec, written first in the proto. It carries a hash of
        everything the proto is made of, so a cached proto is reused only for the same input."""
        h = hashlib.sha256(_SPM_CACHE_FORMAT.encode())
        h.update(array("I", [len(p) for p in pieces]).tobytes())
        h.update("\0".join(pieces).encode("utf-8", "surrogatepass"))
        h.update(scores32.tobytes())
        h.update(bytes(kinds))
        h.update(struct.pack("<iB", unk, self.byte_fallback))
        spec = (_pb_bytes(2, f"{_SPM_CACHE_FORMAT}:{h.hexdigest()}".encode())  # model_prefix
                + _pb_int(3, 2)                                 # model_type = BPE
                + _pb_int(4, len(pieces))                       # vocab_size
                + _pb_int(35, int(self.byte_fallback))          # byte_fallback
                + _pb_int(40, unk)                              # unk_id
                + _pb_int(41, -1) + _pb_int(42, -1) + _pb_int(43, -1))  # bos/eos/pad: ours
        return _pb_bytes(2, spec)

    @staticmethod
    def _pieces_proto(pieces, scores32, kinds) -> bytes:
        """ModelProto.pieces: {1: piece, 2: score (float), 3: type} per vocabulary entry."""
        out = []
        append = out.append
        raw_scores = scores32.tobytes()
        for i, piece in enumerate(pieces):
            text = piece.encode("utf-8", "surrogatepass")
            body = (b"\x0a" + _varint(len(text)) + text + b"\x15" + raw_scores[4 * i:4 * i + 4]
                    + b"\x18" + kinds[i:i + 1])
            append(b"\x0a" + _varint(len(body)) + body)
        return b"".join(out)

    @staticmethod
    def _load_cache(cache_path, header: bytes) -> bytes | None:
        """The cached proto if it was made from this vocabulary (header) and is intact."""
        if cache_path is None:
            return None
        try:
            data = Path(cache_path).read_bytes()
        except OSError:
            return None
        check = _pb_bytes(_SPM_CHECK_FIELD, bytes(32))[:-32]
        body, tag, digest = data[:-len(check) - 32], data[-len(check) - 32:-32], data[-32:]
        if (data.startswith(header) and tag == check
                and hashlib.sha256(body).digest() == digest):
            return data
        return None

    @staticmethod
    def _save_cache(cache_path, proto: bytes) -> None:
        """Write atomically (temporary file + rename); an unwritable place just means no cache."""
        if cache_path is None:
            return
        path = Path(cache_path)
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(proto)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
            tmp = None
        except OSError:
            pass
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def encode(self, text: str) -> list[int]:
        """Ids of one plain-text fragment (llama.cpp prefixes every fragment with a space)."""
        if self.add_space_prefix:
            text = " " + text
        return self._encode_ids(text.replace(" ", _SPACE))

    @staticmethod
    def token_bytes(text: str) -> bytes:
        return text.replace(_SPACE, " ").encode()
