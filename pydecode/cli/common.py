"""What every command shares: the model argument, the option spellings (llama.cpp's long ones
too), loading, error messages that name the flag, streaming a generation to the terminal with
Ctrl-C, and the prefill progress bar."""
from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import contextmanager

import click

DEFAULT_MODEL = "smollm2-135m"
ISAS = ("scalar", "avx2", "avxvnni", "avx512", "neon", "dotprod", "i8mm")   # every kernel table (csrc/kernels/dispatch.c)


# ---------------------------------------------------------------- options

def model_args(f):
    """[MODEL] as the first argument (as in `ollama run MODEL`), or -m/--model."""
    f = click.argument("model_arg", metavar="[MODEL]", required=False)(f)
    return click.option("-m", "--model", default=None,
                        help=f"Registry name (fetched on first use), path to a .gguf, or a Hugging Face "
                             f"name (hf://OWNER/REPO/FILE.gguf, OWNER/REPO:QUANT). Default: {DEFAULT_MODEL}.")(f)


def model_name(model: str | None, model_arg: str | None) -> str:
    if model and model_arg and model != model_arg:
        raise click.UsageError(f"two models given: {model_arg!r} and -m {model!r}")
    return model or model_arg or DEFAULT_MODEL


threads_opt = click.option("-t", "--threads", type=click.IntRange(1, 512), default=None,
                           help="Threads (default: physical cores).")
ctx_opt = click.option("-c", "--ctx", "--ctx-size", "n_ctx", type=click.IntRange(min=1), default=None,
                       help="Context size in tokens (default: min(4096, the model's trained context)).")


def _isa_help() -> str:
    from .._core import lib

    here = [i for i in ISAS if lib.pd_isa_supported(i.encode())]
    return (f"Force a kernel table: {', '.join(ISAS)} (this CPU runs {', '.join(here)}; default: the best, "
            f"or $PYDECODE_ISA).")


isa_opt = click.option("--isa", type=click.Choice(ISAS), default=None, help=_isa_help())

# API parameter names -> the flags that set them, so that an error names what the user typed.
FLAGS = {"temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
         "repeat_penalty": "--repeat-penalty", "frequency_penalty": "--frequency-penalty",
         "presence_penalty": "--presence-penalty", "repeat_last_n": "--repeat-last-n", "seed": "--seed",
         "max_tokens": "-n/--max-tokens", "n_ctx": "-c/--ctx-size", "n_threads": "-t/--threads", "stop": "--stop"}
SAMPLING = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "frequency_penalty", "presence_penalty",
            "repeat_last_n", "seed")


def sampling_options(f):
    """The sampler flags of `run` and `chat` (ranges as the API checks them). Unset flags take
    the command's defaults (see resolve_sampling)."""
    opts = [
        click.option("--temp", "--temperature", "temperature", type=click.FloatRange(min=0), default=None,
                     help="Sampling temperature (0 = greedy)."),
        click.option("--top-k", type=click.IntRange(min=0), default=None, help="Keep the K most likely tokens (0 = off)."),
        click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=None,
                     help="Nucleus sampling: keep the smallest set with this much probability (1 = off)."),
        click.option("--min-p", type=click.FloatRange(0, 1), default=None,
                     help="Drop tokens less likely than MIN_P x the most likely one (0 = off)."),
        click.option("--repeat-penalty", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="Penalize tokens seen in the last --repeat-last-n (1 = off)."),
        click.option("--frequency-penalty", type=float, default=None,
                     help="Subtract this x a token's count in the window (0 = off)."),
        click.option("--presence-penalty", type=float, default=None,
                     help="Subtract this from every token present in the window (0 = off)."),
        click.option("--repeat-last-n", type=click.IntRange(min=0), default=None, help="The penalty window, in tokens."),
        click.option("--seed", type=int, default=None, help="Seed for a reproducible draw (-1: random)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def structure_options(f):
    """Structured output flags of `run` and `chat` (pydecode/constraint.py): at most one."""
    opts = [
        click.option("--json-schema", default=None, metavar="FILE|JSON",
                     help="Answer with JSON valid under this JSON Schema (a file, or the schema itself)."),
        click.option("--regex", default=None, help="Answer with text matching this regular expression."),
        click.option("--grammar", "grammar_file", default=None, metavar="FILE",
                     help="Answer with text this grammar accepts (a Lark or llama.cpp GBNF file)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def resolve_structure(kw: dict, llm) -> dict:
    """Pops the structured-output flags out of kw: the keyword arguments for LLM.stream, checked
    against the model's vocabulary now (a bad schema fails before anything is decoded)."""
    from ..constraint import compile_grammar, grammar_of
    schema, regex, gfile = kw.pop("json_schema", None), kw.pop("regex", None), kw.pop("grammar_file", None)
    out = {}
    if schema is not None:
        if os.path.isfile(schema) or not schema.lstrip().startswith(("{", "[", "true", "false")):
            try:
                with open(schema, encoding="utf-8") as fh:
                    schema = fh.read()
            except OSError as e:
                raise ValueError(f"--json-schema {schema!r}: not a JSON Schema and not a readable file "
                                 f"({e.strerror})") from None
        out["json_schema"] = schema
    if regex is not None:
        out["regex"] = regex
    if gfile is not None:
        try:
            with open(gfile, encoding="utf-8") as fh:
                out["grammar"] = fh.read()
        except OSError as e:
            raise ValueError(f"--grammar {gfile!r}: cannot read it ({e.strerror})") from None
    g = grammar_of(**out)
    if g is not None:
        compile_grammar(llm.tokenizer, g)
    return out


def resolve_sampling(kw: dict, defaults: dict) -> dict:
    """Pops the sampler flags out of kw: those given on the command line, else `defaults`."""
    given = {k: kw.pop(k) for k in SAMPLING}
    return {**defaults, **{k: v for k, v in given.items() if v is not None}}


def describe_sampling(s: dict) -> str:
    if not s.get("temperature"):
        return "greedy"
    parts = [f"temperature {s['temperature']:g}"]
    for key, label, off in (("top_k", "top-k", 0), ("top_p", "top-p", 1.0), ("min_p", "min-p", 0.0),
                            ("repeat_penalty", "repeat penalty", 1.0)):
        if s.get(key, off) != off:
            parts.append(f"{label} {s[key]:g}")
    return ", ".join(parts)


# ---------------------------------------------------------------- errors

def message(e: Exception) -> str:
    msg = str(e)
    for name, flag in FLAGS.items():
        if msg.startswith(name + " "):
            return f"{flag}: {msg}"
    return msg


def fail(e: Exception, code: int = 1):
    click.echo(f"error: {message(e)}", err=True)
    sys.exit(code)


def install_sigterm() -> None:
    """SIGTERM (a `kill`, a service manager) ends the command cleanly, through every `finally`,
    so a download leaves no temporary files and no pip behind."""
    try:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    except ValueError:   # not the main thread (an embedding test runner)
        pass


# ---------------------------------------------------------------- loading

def resolve_model(model: str):
    from .. import registry

    return registry.resolve(model)


kv_type_opt = click.option(
    "--kv-type", "kv_type", type=click.Choice(["f16", "f32", "q8_0"]), default="f16", show_default=True,
    help="KV cache format: q8_0 takes about half of f16's memory (longer contexts; faster at depth) "
         "at a small cost in accuracy (bench/README.md measures it).")

prompt_cache_opt = click.option(
    "--prompt-cache", "prompt_cache", type=click.Path(dir_okay=False), default=None, metavar="FILE",
    help="Keep the KV cache in FILE: the longest prefix of the prompt it holds is restored instead "
         "of prefilled, and FILE is updated after the run (a state of another model or --kv-type is "
         "ignored with a warning, then replaced; a file that is not a state file is never replaced).")


def restore_prompt_cache(llm, path) -> int:
    """--prompt-cache: restores FILE's tokens and K/V into the LLM (its next prompt reuses the
    prefix they share); returns the tokens restored, 0 when FILE is absent or does not fit."""
    from ..kvstate import StateFileError, replaceable
    if not path:
        return 0
    if not replaceable(path):
        raise click.BadParameter(f"{path} exists and is not a pydecode state file: refusing to replace it "
                                 f"(remove it or name another FILE)", param_hint="--prompt-cache")
    if not os.path.exists(path):
        return 0
    try:
        return len(llm.load_state(path))
    except (StateFileError, OSError) as e:
        click.echo(f"warning: prompt cache ignored (it will be rewritten): {message(e)}", err=True)
        return 0


def save_prompt_cache(llm, path) -> None:
    """--prompt-cache: writes what the last generation left in the KV cache to FILE (atomically)."""
    if not path:
        return
    try:
        llm.save_state(path)
    except RuntimeError:      # nothing was generated (an error before the first step)
        pass
    except OSError as e:
        click.echo(f"warning: could not write the prompt cache: {message(e)}", err=True)


draft_opt = click.option(
    "--draft", default=None, metavar="lookup|MODEL",
    help="Speculative decoding, same output, faster where guesses pay: 'lookup' (repeated n-grams "
         "of the context propose the next tokens) or a smaller model of the same vocabulary "
         "(registry name or .gguf path, e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b).")



def runtime_options(f):
    """The flags of `run` and `chat` that shape the loaded model: threads, context, ISA table,
    draft, KV cache type, prompt cache (in that order in --help)."""
    for opt in reversed((threads_opt, ctx_opt, isa_opt, draft_opt, kv_type_opt, prompt_cache_opt)):
        f = opt(f)
    return f


def load_llm(path, n_ctx, threads, isa, n_seq: int = 1, draft: str | None = None, kv_type: str = "f16"):
    """The LLM, with a warning when -c asks for more than the model was trained on."""
    from ..llm import load

    llm = load(path, n_ctx=n_ctx, n_threads=threads, isa=isa, n_seq=n_seq, draft=draft, kv_type=kv_type)
    trained = llm.model.config.n_ctx_train
    if n_ctx is not None and n_ctx > trained:
        click.echo(f"warning: -c {n_ctx} is more than the {trained} tokens this model was trained on; "
                   f"past those, its output degrades", err=True)
    return llm


# ---------------------------------------------------------------- streaming to the terminal

@contextmanager
def ctrl_c_cancels(stream):
    """While a stream runs, Ctrl-C asks it to stop (stream.cancel(): it ends at the next step
    boundary, a prompt chunk at most, keeping what it produced); a second Ctrl-C interrupts
    whatever runs (the stream still ends cleanly, finish_reason "cancelled")."""
    hits = []

    def on_sigint(signum, frame):
        hits.append(signum)
        stream.cancel()
        if len(hits) == 2:
            raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:                      # not the main thread: leave Ctrl-C alone
        yield hits
        return
    try:
        yield hits
    finally:
        signal.signal(signal.SIGINT, old)


def consume(stream, write=None):
    """Iterates `stream` to its end, passing each piece's text to `write`; returns its Completion.
    Ctrl-C cancels it (see ctrl_c_cancels)."""
    with ctrl_c_cancels(stream):
        try:
            for piece in stream:
                if write is not None and piece.text:
                    write(piece.text)
        except KeyboardInterrupt:           # the stream has ended itself (see Handle): drain it
            for piece in stream:
                if write is not None and piece.text:
                    write(piece.text)
    return stream.completion


def stdout_write(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:                 # `pydecode run ... | head`: the reader has gone
        os._exit(0)


class PrefillProgress:
    """A prompt's prefill progress on stderr, for the Engine's on_prefill(done, total) hook:
    shown only on a terminal, and only once the prompt is expected to take more than about a
    second (measured from its first chunks); it clears itself when the prompt is done."""

    def __init__(self, enabled: bool | None = None, after_s: float = 1.0):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.after_s, self.bar, self.t0 = after_s, None, time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            took = time.perf_counter() - self.t0
            if done >= total or took * total / max(done, 1) < self.after_s:
                return
            import shutil

            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, unit="tok", desc="prompt", leave=False,
                            ncols=shutil.get_terminal_size().columns, nrows=shutil.get_terminal_size().lines,
                            file=sys.stderr)
        self.bar.update(done - self.bar.n)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
