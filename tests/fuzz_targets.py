"""Fuzz targets for the GGUF loader, the tokenizers, state files and grammars.

Targets (issues 7.3 and 35):
  gguf       bytes -> a file -> GGUFFile -> arch_config -> Model (tokenizer, C model build) -> a
             prefill and a decode step -> LLM.generate of 2 tokens -> tokenizer round trips.
  tokenizer  bytes -> text or token ids -> encode / decode / the streaming decoder of real
             vocabularies (SmolLM2's byte-level BPE, a tiny model's; SentencePiece where the
             conformance vocabularies are present), with invariants (ids in range; byte-level BPE
             decodes back to the text; streaming decode == decode).
  statefile  bytes (half of them with the header length and checksum made right) -> load_state
             / import_state of a tiny model; a refusal leaves the slot as it was.
  grammar    bytes -> GBNF / Lark, regex, JSON schema, choices or response_format -> prepare
             (conversion and the check against the vocabulary) -> constrained tokens drawn.
Allowed outcomes: success, or ModelError / TokenizerError / ValueError (StateFileError is one;
ConstraintError for grammars). Anything else (another
exception, a crash, a hang past -timeout, memory past -rss_limit_mb) is a bug.

Seeds: tests/fuzz_corpus/<target>/ (tiny_models.py GGUFs, 4 KB header prefixes of the real
models, a real tensor directory; text samples), and tests/fuzz_corpus/regressions/<target>/:
every input that once failed, replayed by tests/test_hostile.py::test_fuzz_regressions.
Regenerate the seeds: python tests/fuzz_targets.py seeds

Run longer by hand (atheris = libFuzzer for Python; the first directory collects new inputs):
    pip install atheris
    python tests/fuzz_targets.py gguf -max_total_time=3600 -timeout=20 -rss_limit_mb=4096 \\
        /tmp/fuzz-gguf tests/fuzz_corpus/gguf tests/fuzz_corpus/regressions/gguf
    python tests/fuzz_targets.py tokenizer -max_total_time=600 /tmp/fuzz-tok tests/fuzz_corpus/tokenizer
A failure leaves crash-<sha1> (or timeout-/oom-) in the current directory (-artifact_prefix=DIR/
to move it): copy it into tests/fuzz_corpus/regressions/<target>/ with the fix, so it stays a test.
Without atheris (or under ASan, whose runtime must not mix with atheris' libFuzzer), a plain
random-mutation loop with a fixed budget:
    python tests/fuzz_targets.py gguf --plain --seconds 600 [--seed N] [--out DIR]
Replay files through a target (a stack trace instead of a fuzzer report):
    python tests/fuzz_targets.py replay gguf FILE...
"""
from __future__ import annotations

import atexit
import importlib.util
import os
import random
import shutil
import struct
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "fuzz_corpus"
TARGETS = ("gguf", "tokenizer", "statefile", "grammar")
if importlib.util.find_spec("pydecode") is None:   # run from a checkout without an install
    sys.path.append(str(HERE.parent))

if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] in TARGETS and "--plain" not in sys.argv:
    try:   # coverage feedback from pydecode's Python code (the C core is not instrumented)
        import atheris
        with atheris.instrument_imports(include=["pydecode"]):
            import pydecode  # noqa: F401
            import pydecode.cli  # noqa: F401
    except ImportError:
        atheris = None
else:
    atheris = None

import numpy as np  # noqa: E402

from pydecode import LLM, ContextFullError, Model, ModelError  # noqa: E402
from pydecode.gguf_file import GGUFFile  # noqa: E402
from pydecode.tokenizer import Tokenizer, TokenizerError  # noqa: E402

ALLOWED = (ModelError, TokenizerError, ValueError, ContextFullError)
_SCRATCH: list[Path] = []


def _scratch() -> Path:
    """A private directory (in RAM where /dev/shm exists) for the file each input becomes."""
    if not _SCRATCH:
        d = Path(tempfile.mkdtemp(prefix="pydecode-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
        atexit.register(shutil.rmtree, d, True)
        _SCRATCH.append(d)
    return _SCRATCH[0]


# ----------------------------------------------------------------------------------- gguf

def gguf_target(data: bytes) -> None:
    path = _scratch() / "input.gguf"
    path.write_bytes(data)
    try:
        _exercise_model(path)
    except ALLOWED:
        pass
    finally:
        for p in path.parent.iterdir():   # the SentencePiece cache a load may have written
            if p.name != "input.gguf":
                p.unlink()


STAGES: dict[str, int] = {}   # how far the inputs got (printed by the plain loop)


def _stage(name: str) -> None:
    STAGES[name] = STAGES.get(name, 0) + 1


def _exercise_model(path: Path) -> None:
    g = GGUFFile(path)
    _stage("1 parsed")
    for name in list(g.tensors)[:4]:        # reading tensor bytes must stay inside the mapping
        g.tensor_array(name)
    g.close()
    m = Model(path, n_ctx=8, n_threads=1, n_batch=4)
    _stage("2 model built")
    try:
        v = m.n_vocab
        logits = m.prefill([0, v - 1, v // 2])
        assert logits.shape == (v,)
        m.decode_step(int(np.argmax(logits)) % v, 3)
        tok = m.tokenizer
        ids = tok.encode("Hello <|bos|> world ab\n\u00e9\u4e2d")
        assert all(0 <= i < tok.vocab_size for i in ids), ids
        tok.decode(list(range(min(tok.vocab_size, 300))))
        _stage("3 forward ran")
        out = LLM(m).generate("ab", max_tokens=2)
        assert out.stats.generated_tokens <= 2
        _stage("4 generated")
    finally:
        m.close()


# ----------------------------------------------------------------------------------- tokenizer

_TOKENIZERS: list | None = None


def _tokenizers() -> list:
    """(name, Tokenizer, bytes with a token or None) per vocabulary."""
    global _TOKENIZERS
    if _TOKENIZERS is None:
        found = []
        for p in sorted((CORPUS / "gguf").glob("tiny-*"))[:1]:
            found.append(p)
        smol = Path(os.environ.get("PYDECODE_HOME", Path.home() / ".cache" / "pydecode")) / "models" / \
            "SmolLM2-135M-Instruct.Q4_1.gguf"
        if smol.exists():
            found.append(smol)
        fetched = smol.parent.parent / "conformance" / "tokenizer"   # tests/conformance.py's cache
        for name in ("ggml-vocab-llama-spm.gguf", "ggml-vocab-qwen2.gguf"):
            if (fetched / name).exists():
                found.append(fetched / name)
        _TOKENIZERS = []
        for p in found:
            meta = GGUFFile(p).metadata
            tok = Tokenizer.from_metadata(meta)
            # Byte-level BPE is lossless (decode(encode(text)) == text) for text whose every byte
            # has a token: SmolLM2's vocabulary lacks 0x04 0x06 0x13 0x14 0x16 0x1D (and bytes
            # UTF-8 never uses); those characters are dropped, as llama.cpp drops them.
            if meta.get("tokenizer.ggml.model") == "gpt2":
                have = {tok.token_bytes(i) for i in range(tok.vocab_size)}
                lossless = frozenset(b for b in range(256) if bytes([b]) in have)
            else:
                lossless = None
            _TOKENIZERS.append((p.name, tok, lossless))
    return _TOKENIZERS


def tokenizer_target(data: bytes) -> None:
    if len(data) < 2:
        return
    toks = _tokenizers()
    name, tok, lossless = toks[data[0] % len(toks)]
    mode, body = data[1] % 4, data[2:]
    if mode < 2:   # text
        text = body.decode("utf-8", "surrogateescape")   # lone surrogates too: a TokenizerError
        try:
            ids = tok.encode(text, add_special=bool(mode), parse_special=bool(mode))
        except ALLOWED:
            return
        assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids), (name, ids)
        back = tok.decode(ids)
        if lossless is not None and not (mode and tok.add_bos) and \
                lossless.issuperset(text.encode("utf-8", "surrogatepass")):
            assert back == text, (name, text, back)
    else:          # ids, some outside the vocabulary
        ids = [x % (tok.vocab_size + 8) - (4 if mode == 3 else 0) for x in
               struct.unpack(f"<{len(body) // 4}I", body[:len(body) // 4 * 4])]
        try:
            text = tok.decode(ids, skip_special=mode == 3)
        except ALLOWED:
            assert any(not 0 <= i < tok.vocab_size for i in ids)
            return
        dec = tok.decoder(skip_special=mode == 3, start=True)
        streamed = "".join(dec.feed(i) for i in ids) + dec.flush()
        assert streamed == text, (name, ids, streamed, text)


# ----------------------------------------------------------------------------------- state files

_STATE: dict = {}


def _state_llm():
    """A tiny model with two slots; slot 1 takes the inputs, `_STATE["good"]` is a real state."""
    if not _STATE:
        llm = LLM(Model(CORPUS / "gguf" / "tiny-llama", n_ctx=32, n_threads=1, n_batch=8, n_seq=2))
        llm.generate([1, 2, 3, 4, 5, 6], max_tokens=3)
        _STATE.update(llm=llm, good=llm.export_state())
    return _STATE["llm"], _STATE["good"]


def _sealed(data: bytes) -> bytes:
    """The input with its header length and checksum made right, so that mutations reach the
    header parser and the payload checks instead of stopping at the checksum."""
    import hashlib
    import json
    from pydecode.kvstate import _PREFIX
    if len(data) < _PREFIX.size + 32:
        return data
    body = bytearray(data[:-32])
    try:   # the header ends where its JSON value ends (the payload after it is binary)
        _, end = json.JSONDecoder().raw_decode(body[_PREFIX.size:].decode("utf-8", "replace"))
        struct.pack_into("<I", body, 12, len(body[_PREFIX.size:].decode("utf-8", "replace")[:end].encode()))
    except (ValueError, RecursionError):
        pass
    return bytes(body) + hashlib.sha256(body).digest()


def statefile_target(data: bytes) -> None:
    """bytes -> load_state (a file) or import_state (bytes) into slot 1 of a tiny model. A refusal
    is a StateFileError that left slot 1 as it was; a state taken continues (one more token)."""
    from pydecode.kvstate import StateFileError
    if not data:
        return
    llm, good = _state_llm()
    mode, body = data[0] % 4, data[1:]
    body = _sealed(body) if mode & 1 else body
    llm.import_state(good, slot=1)
    try:
        if mode & 2:
            path = _scratch() / "input.state"
            path.write_bytes(body)
            tokens = llm.load_state(path, slot=1)
        else:
            tokens = llm.import_state(body, slot=1)
    except StateFileError as e:
        _stage("refused: " + "".join(c for c in str(e).split(": ", 1)[1] if not c.isdigit())[:20])
        assert llm.export_state(slot=1) == good, "a refused state changed the slot"
        return
    _stage("taken")
    assert all(type(t) is int and 0 <= t < llm.model.n_vocab for t in tokens)
    if len(tokens) < llm.n_ctx:
        llm.generate(tokens + [7], max_tokens=1)


# ----------------------------------------------------------------------------------- grammars

GRAMMAR_KINDS = ("grammar", "regex", "json_schema", "choices", "response_format")


def grammar_target(data: bytes) -> None:
    """bytes -> one structured-output keyword (GBNF/Lark, regex, JSON schema text, choices split
    at NUL, response_format JSON) -> constraint.prepare on the tiny model's vocabulary -> (odd
    second byte) four constrained tokens drawn. Allowed: ValueError (limits, bad input) and
    ConstraintError (a grammar that fails or can never match)."""
    import json
    from pydecode import constraint
    if len(data) < 2:
        return
    kind = GRAMMAR_KINDS[data[0] % len(GRAMMAR_KINDS)]
    text = data[2:].decode("utf-8", "replace")
    value: object = text
    if kind == "choices":
        value = text.split("\x00")
    elif kind in ("json_schema", "response_format"):
        try:
            value = json.loads(text)
        except ValueError:
            value = text if kind == "json_schema" else {"type": text}
    llm, _ = _state_llm()
    try:
        g = constraint.prepare(llm.tokenizer, **{kind: value})
        _stage(f"{kind} checked")
        if g is not None and data[1] % 2:
            llm.generate("a", max_tokens=4, grammar=g, temperature=1.0, seed=data[1])
            _stage(f"{kind} drawn")
    except (ValueError, constraint.ConstraintError) as e:
        _stage(f"{kind} {type(e).__name__}")


TARGET_FUNCS = {"gguf": gguf_target, "tokenizer": tokenizer_target, "statefile": statefile_target,
                "grammar": grammar_target}


# ----------------------------------------------------------------------------------- seeds

def make_seeds() -> None:
    """Writes tests/fuzz_corpus/{gguf,tokenizer,statefile,grammar}/ (deterministic; ~100 KB)."""
    sys.path.insert(0, str(HERE))
    from tiny_models import write_tiny_model

    out = CORPUS / "gguf"
    out.mkdir(parents=True, exist_ok=True)
    for arch, n_layer in (("llama", 1), ("qwen2", 1), ("gemma3", 2)):
        write_tiny_model(out / f"tiny-{arch}", arch, n_layer=n_layer, n_embd=32, n_head=2, n_head_kv=1,
                         head_dim=16, n_ff=32, window=2)
    from pydecode.registry import model_path

    for name in ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"):
        try:
            p = model_path(name)
        except Exception:
            continue
        with open(p, "rb") as f:
            (out / f"prefix-4k-{name}").write_bytes(f.read(4096))
        if name == "smollm2-135m":
            (out / "directory-smollm2").write_bytes(_directory_seed(p))
    txt = CORPUS / "tokenizer"
    txt.mkdir(parents=True, exist_ok=True)
    samples = [b"Hello, world!", "caf\u00e9 na\u00efve \u4e2d\u6587 \U0001f600\U0001f44d\U0001f3fd".encode(),
               b"<|im_start|>user\nHi<|im_end|>\n", b"  leading and trailing  \t\n", b"\xff\xfe\xc3(\xe2\x82",
               "e\u0301\u200b\ufeff\u0000x".encode(), b"def f(x):\n    return x**2  # 1234567890"]
    for i, s in enumerate(samples):
        for mode in (0, 1):
            (txt / f"text-{i}-{mode}").write_bytes(bytes([i, mode]) + s)
    (txt / "ids").write_bytes(bytes([1, 2]) + struct.pack("<8I", 0, 1, 2, 3, 198, 49151, 49152, 7))
    st = CORPUS / "statefile"
    st.mkdir(parents=True, exist_ok=True)
    _, good = _state_llm()
    for mode in range(4):
        (st / f"state-{mode}").write_bytes(bytes([mode]) + good)
    (st / "deep-header").write_bytes(b"\x01" + good[:16] + b"[" * 2000 + good[16:])
    gr = CORPUS / "grammar"
    gr.mkdir(parents=True, exist_ok=True)
    samples = {"grammar": ['root ::= "yes" | "no"', 'root ::= ([a-z] | "if")+ "."', 'start: /[0-9]+/ "x"',
                           'root ::= item+\nitem ::= [a-c] " "?'],
               "regex": [r"[0-9]{3}-[a-z]+", r"(a|b)*c", r"[^\s\S]"],
               "json_schema": ['{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}',
                               '{"type":"array","items":{"enum":["x","y"]},"maxItems":3}'],
               "choices": ["red\x00green\x00blue"],
               "response_format": ['{"type":"json_object"}',
                                   '{"type":"json_schema","json_schema":{"schema":{"type":"string"}}}']}
    for kind, texts in samples.items():
        for i, t in enumerate(texts):
            (gr / f"{kind}-{i}").write_bytes(bytes([GRAMMAR_KINDS.index(kind), 1]) + t.encode())


def _directory_seed(path) -> bytes:
    """A real header with its big arrays cut to 16 entries: every tensor name and shape of the
    real directory in ~15 KB (the data section is not there: offsets point past the end)."""
    g = GGUFFile(path)
    with open(path, "rb") as f:
        buf = f.read(g.header_size)
    sys.path.insert(0, str(HERE))
    from test_hostile import ARR, Header, _skip_value

    h = Header(buf, 0)
    for kv in h.kvs:
        if kv[1] == ARR:
            etype, count = struct.unpack_from("<IQ", kv[2])
            if count > 16:
                end = 12
                for _ in range(16):
                    end = _skip_value(kv[2], end, etype)
                kv[2] = struct.pack("<IQ", etype, 16) + kv[2][12:end]
    return h.to_bytes()


# ----------------------------------------------------------------------------------- plain fuzzing

INTERESTING = [0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 33, 63, 64, 255, 256, 1024, 4096, 65535, 65536,
               2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**60, 2**63 - 1, 2**63, 2**64 - 1]


def mutate(data: bytes, rng: random.Random, pool: list[bytes]) -> bytes:
    """One to four random edits: bit flips, interesting little-endian integers, cuts, inserts,
    duplicated ranges, splices with another seed."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        n = len(b)
        op = rng.randrange(8)
        if n == 0 or op == 7:
            other = rng.choice(pool)
            at = rng.randint(0, n)
            cut = rng.randint(0, len(other))
            b = b[:at] + other[cut:cut + rng.randint(1, 256)]
            continue
        i = rng.randrange(n)
        if op == 0:
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[i] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        elif op in (2, 3):   # a 4- or 8-byte field: a count, a length, a dim, an offset, a type
            size = 4 if op == 2 else 8
            v = rng.choice(INTERESTING) + rng.choice([0, 0, -1, 1])
            b[i:i + size] = struct.pack("<Q", v % 2**64)[:size]
        elif op == 4:
            del b[i:i + rng.choice([1, 2, 4, 8, rng.randint(1, 4096)])]
        elif op == 5:
            b = b[:rng.randint(0, n)]
        elif op == 6:
            j = rng.randrange(n)
            b[i:i] = b[j:j + rng.randint(1, 64)]
    return bytes(b)


def plain_fuzz(target: str, seconds: float, seed: int = 0, out_dir: Path | None = None,
               seeds: list[Path] | None = None) -> dict:
    """Random mutations of the seed corpus for `seconds`; returns {execs, failures: [paths]}.
    A failing input is written to out_dir (default: the current directory) as crash-<n>."""
    fn = TARGET_FUNCS[target]
    files = seeds if seeds is not None else sorted(p for d in (CORPUS / target, CORPUS / "regressions" / target)
                                                   if d.is_dir() for p in d.iterdir() if p.is_file())
    pool = [p.read_bytes() for p in files] or [b""]
    rng = random.Random(seed)
    out_dir = Path(out_dir or ".")
    execs, failures = 0, []
    for data in pool:          # the seeds themselves first
        execs += 1
        _run_one(fn, data, out_dir, failures)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        data = mutate(rng.choice(pool), rng, pool)
        execs += 1
        if _run_one(fn, data, out_dir, failures) and len(failures) >= 20:
            break
    return {"execs": execs, "failures": failures}


def _run_one(fn, data: bytes, out_dir: Path, failures: list) -> bool:
    try:
        fn(data)
        return False
    except Exception:
        out_dir.mkdir(parents=True, exist_ok=True)
        p = out_dir / f"crash-{len(failures)}-{abs(hash(data)) % 10**8}"
        p.write_bytes(data)
        failures.append(str(p))
        sys.stderr.write(f"FAILURE {p}:\n{traceback.format_exc()}\n")
        return True


def replay(target: str, paths) -> int:
    bad = 0
    for p in paths:
        try:
            TARGET_FUNCS[target](Path(p).read_bytes())
        except Exception:
            bad += 1
            print(f"{p}: FAILS\n{traceback.format_exc()}")
    return bad


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in TARGETS + ("seeds", "replay"):
        print(__doc__)
        return 2
    if argv[0] == "seeds":
        make_seeds()
        return 0
    if argv[0] == "replay":
        return 1 if replay(argv[1], argv[2:]) else 0
    target, rest = argv[0], argv[1:]
    if "--plain" in rest or atheris is None:
        if atheris is None and "--plain" not in rest:
            print("atheris is not installed: plain random-mutation fuzzing instead", file=sys.stderr)
        opts = {k: v for k, v in zip(rest, rest[1:]) if k.startswith("--")}
        t0 = time.monotonic()
        r = plain_fuzz(target, float(opts.get("--seconds", 60)), int(opts.get("--seed", 0)),
                       Path(opts["--out"]) if "--out" in opts else None)
        print(f"plain fuzz {target}: {r['execs']} execs in {time.monotonic() - t0:.1f} s, "
              f"{len(r['failures'])} failures {r['failures']}; stages reached {dict(sorted(STAGES.items()))}")
        return 1 if r["failures"] else 0
    fn = TARGET_FUNCS[target]
    if target == "tokenizer":
        _tokenizers()   # built once, before fuzzing starts
    atheris.Setup([sys.argv[0]] + rest, fn)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
