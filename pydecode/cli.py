"""The command line: parse, call the API, print. `pydecode --help` lists the commands."""
from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict

import click

from . import registry
from .errors import PydecodeError

DEFAULT_MODEL = "smollm2-135m"


def _load(model: str, n_ctx, threads, isa):
    from .llm import load

    return load(model, n_ctx=n_ctx, n_threads=threads, isa=isa)


# API parameter names -> the flags that set them, so that an error names what the user typed.
_FLAGS = {"temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
          "repeat_penalty": "--repeat-penalty", "frequency_penalty": "--frequency-penalty",
          "presence_penalty": "--presence-penalty", "repeat_last_n": "--repeat-last-n", "seed": "--seed",
          "max_tokens": "-n/--max-tokens", "n_ctx": "-c/--ctx", "n_threads": "-t/--threads", "stop": "--stop"}


def _message(e: Exception) -> str:
    msg = str(e)
    for name, flag in _FLAGS.items():
        if msg.startswith(name + " "):
            return f"{flag}: {msg}"
    return msg


def _fail(e: Exception, code: int = 1):
    click.echo(f"error: {_message(e)}", err=True)
    sys.exit(code)


@click.group()
@click.version_option(package_name="pydecode")
def main():
    """pydecode: run GGUF language models fast on a CPU."""
    # SIGTERM (a `kill`, a service manager) ends the command like Ctrl-C would a script: cleanly,
    # through every `finally`, so a download leaves no temporary files and no pip behind.
    try:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    except ValueError:   # not the main thread (an embedding test runner)
        pass


_model_opt = click.option("-m", "--model", default=DEFAULT_MODEL, show_default=True,
                          help="Registry name (fetched on first use) or path to a .gguf file.")
_threads_opt = click.option("-t", "--threads", type=click.IntRange(1, 512), default=None, help="Threads (default: physical cores).")
_ctx_opt = click.option("-c", "--ctx", "n_ctx", type=click.IntRange(min=1), default=None, help="Context size in tokens.")
_isa_opt = click.option("--isa", default=None, help="Force kernels: scalar, avx2 (default: best for this CPU, or $PYDECODE_ISA).")


def _sampling_options(f):
    """The sampler flags shared by `run` and `chat` (ranges as the API checks them)."""
    opts = [
        click.option("--temp", "temperature", type=click.FloatRange(min=0), default=0.0, show_default=True,
                     help="Sampling temperature (0 = greedy)."),
        click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Keep the K most likely tokens (0 = off)."),
        click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True,
                     help="Nucleus sampling: keep the smallest set with this much probability (1 = off)."),
        click.option("--min-p", type=click.FloatRange(0, 1), default=0.0, show_default=True,
                     help="Drop tokens less likely than MIN_P x the most likely one (0 = off)."),
        click.option("--repeat-penalty", type=click.FloatRange(min=0, min_open=True), default=1.0,
                     show_default=True, help="Penalize tokens seen in the last --repeat-last-n (1 = off)."),
        click.option("--frequency-penalty", type=float, default=0.0, show_default=True,
                     help="Subtract this x a token's count in the window (0 = off)."),
        click.option("--presence-penalty", type=float, default=0.0, show_default=True,
                     help="Subtract this from every token present in the window (0 = off)."),
        click.option("--repeat-last-n", type=click.IntRange(min=0), default=64, show_default=True,
                     help="The penalty window, in tokens."),
        click.option("--seed", type=int, default=None, help="Seed for a reproducible draw (-1: random)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "frequency_penalty", "presence_penalty",
             "repeat_last_n", "seed")


def _sampling(kw: dict) -> dict:
    return {k: kw.pop(k) for k in _SAMPLING}


@contextmanager
def _ctrl_c_cancels(stream):
    """While a stream runs, Ctrl-C asks it to stop (stream.cancel(): it ends at the next step,
    keeping what it produced); a second Ctrl-C interrupts whatever runs (the stream still ends
    cleanly, finish_reason "cancelled")."""
    hits = []

    def on_sigint(signum, frame):
        hits.append(signum)
        stream.cancel()
        if len(hits) == 2:                  # e.g. stuck in a long prefill: interrupt it
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


def _consume(stream, write=None):
    """Iterates `stream` to its end, passing each piece's text to `write`; returns its Completion.
    Ctrl-C cancels it (see _ctrl_c_cancels)."""
    with _ctrl_c_cancels(stream):
        try:
            for piece in stream:
                if write is not None and piece.text:
                    write(piece.text)
        except KeyboardInterrupt:           # landed outside the stream's own step: end it ourselves
            stream.cancel()
            for piece in stream:            # (cancelled: only text it held back comes out)
                if write is not None and piece.text:
                    write(piece.text)
    return stream.completion


def _stdout_write(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:                 # `pydecode run ... | head`: the reader has gone
        os._exit(0)


def _stats_dict(c) -> dict:
    s = c.stats
    d = asdict(s)
    d.update(decode_s=s.decode_s, decode_tokens_per_s=s.decode_tokens_per_s,
             prefill_tokens_per_s=s.prefill_tokens_per_s)
    return d


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


@main.command()
@_model_opt
@click.option("-p", "--prompt", required=True, help="Prompt text.")
@click.option("-n", "--max-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Tokens to generate.")
@_sampling_options
@click.option("--stop", multiple=True, help="Stop at this text (not printed). Repeatable.")
@click.option("--chat", "as_chat", is_flag=True,
              help="Wrap the prompt in the model's chat template, as a user message.")
@click.option("-s", "--system", default=None, help="System prompt (implies --chat).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object (text, tokens, finish_reason, stop_detail, stats) and nothing else.")
@_threads_opt
@_ctx_opt
@_isa_opt
@click.option("--stats/--no-stats", default=True, show_default=True, help="Print timing to stderr.")
def run(model, prompt, max_tokens, stop, as_chat, system, as_json, threads, n_ctx, isa, stats, **kw):
    """Stream the continuation of PROMPT to stdout."""
    sampling = _sampling(kw)
    try:
        llm = _load(model, n_ctx, threads, isa)
        if as_chat or system is not None:
            messages = ([{"role": "system", "content": system}] if system is not None else []) + \
                       [{"role": "user", "content": prompt}]
            stream = llm.stream_chat(messages, max_tokens, stop=list(stop) or None, **sampling)
        else:
            stream = llm.stream(prompt, max_tokens, stop=list(stop) or None, **sampling)
        c = _consume(stream, None if as_json else _stdout_write)
    except (PydecodeError, ValueError, OSError) as e:
        _fail(e)
    if as_json:
        out = {"model": llm.model.path.name, "text": c.text, "tokens": list(c.tokens),
               "finish_reason": c.finish_reason, "stop_detail": c.stop_detail,
               "stats": _stats_dict(c), "threads": llm.model.n_threads, "isa": llm.model.isa}
        _stdout_write(json.dumps(out, ensure_ascii=False) + "\n")
    else:
        _stdout_write("\n")
        if stats:
            s = c.stats
            click.echo(f"[{s.prompt_tokens} prompt tokens: {_ms(s.prefill_s)} ({s.prefill_tokens_per_s:.1f} t/s) | "
                       f"{s.generated_tokens} generated: {s.decode_tokens_per_s:.1f} t/s | ttft {_ms(s.ttft_s)} | "
                       f"{llm.model.n_threads} threads, {llm.model.isa} | finish: {c.finish_reason}"
                       f"{f' ({c.stop_detail})' if c.stop_detail else ''}]", err=True)
    sys.exit(130 if c.finish_reason == "cancelled" else 0)     # 130: stopped by Ctrl-C


# ------------------------------------------------------------------------------------- chat

CHAT_HELP = """\
Commands:
  /reset           forget the conversation and start fresh (keeps the system prompt)
  /system TEXT     set the system prompt and start fresh (/system alone removes it)
  /stats           the last answer's statistics: tokens, speed, time to first token, cache use
  /help            this help
  /exit            quit (also /quit, /bye, Ctrl-D, or Ctrl-C twice at the prompt)
Ctrl-C while the model answers stops the answer. Start with \"\"\" to type several lines; end with \"\"\"."""


class ChatSession:
    """A conversation with an LLM: the message history, kept inside the context window.

    Each turn re-renders the whole history with the chat template; the LLM reuses the K/V of
    the prefix it already computed, so only the new tokens are prefilled."""

    def __init__(self, llm, *, system: str | None = None, max_tokens: int = 512, sampling: dict | None = None,
                 notice=None):
        self.llm, self.max_tokens, self.sampling = llm, max_tokens, dict(sampling or {})
        self.system = system or None
        self.notice = notice or (lambda msg: click.echo(msg, err=True))
        self.history: list[dict] = []
        self.last = None          # the last answer's Completion
        self.dropped = 0          # messages dropped to fit the context, since the last reset
        self.reset()

    def reset(self) -> None:
        self.history = [{"role": "system", "content": self.system}] if self.system else []
        self.dropped = 0

    def set_system(self, text: str | None) -> None:
        self.system = text or None
        self.reset()

    def prompt_tokens(self, messages=None) -> int:
        return len(self.llm.tokenize(self.llm.chat_prompt(self.history if messages is None else messages)))

    def _fit(self) -> None:
        """Drops the oldest exchanges (never the system prompt) until the history plus room for
        an answer fits the context. Raises ContextFullError if the new message alone cannot."""
        from .errors import ContextFullError

        n_ctx = self.llm.n_ctx
        room = max(1, min(self.max_tokens, n_ctx // 2))
        first = 1 if self.system else 0
        # First whether the new message fits at all (with the system prompt): if not, nothing
        # is dropped and the caller takes the message back, so the history stays as it was.
        n = self.prompt_tokens(self.history[:first] + self.history[-1:])
        if n >= n_ctx:
            raise ContextFullError(f"the message takes {n} tokens with the template, but the context "
                                   f"holds {n_ctx} (see -c/--ctx); the conversation is kept as it was")
        n_before = len(self.history)
        while True:
            n = self.prompt_tokens()
            if n + room <= n_ctx:
                break
            if len(self.history) - first <= 1:          # only the new message is left
                if n >= n_ctx:
                    raise ContextFullError(f"the message takes {n} tokens with the template, but the context "
                                           f"holds {n_ctx} (see -c/--ctx)")
                break                                    # it fits; the answer may be cut short
            # Drop one exchange: the oldest message and whatever follows it up to the next user turn.
            del self.history[first]
            while len(self.history) - first > 1 and self.history[first]["role"] != "user":
                del self.history[first]
        dropped = n_before - len(self.history)
        if dropped:
            self.dropped += dropped
            self.notice(f"[context full ({n_ctx} tokens): dropped the {dropped} oldest message"
                        f"{'s' if dropped > 1 else ''}{', kept the system prompt' if self.system else ''}]")

    def ask(self, text: str, write=None):
        """Adds the user's message, streams the answer through `write`, returns the Completion."""
        self.history.append({"role": "user", "content": text})
        try:
            self._fit()
            stream = self.llm.stream_chat(self.history, self.max_tokens, **self.sampling)
        except Exception:
            self.history.pop()
            raise
        c = _consume(stream, write)
        self.last = c
        if c.finish_reason == "cancelled" and not c.text.strip():
            self.history.pop()                           # stopped before it said anything
        else:
            self.history.append({"role": "assistant", "content": c.text})
        return c

    def stats_lines(self) -> list[str]:
        c = self.last
        if c is None:
            return ["no answer yet"]
        s = c.stats
        new = s.prompt_tokens - s.cached_tokens
        lines = [
            f"answer:      {s.generated_tokens} tokens, {s.decode_tokens_per_s:.1f} tokens/s, "
            f"finish: {c.finish_reason}" + (f" ({c.stop_detail})" if c.stop_detail else ""),
            f"first token: {_ms(s.ttft_s)} (TTFT)",
            f"prompt:      {s.prompt_tokens} tokens: {new} prefilled new, {s.cached_tokens} reused from cache "
            f"({_ms(s.prefill_s)}, {s.prefill_tokens_per_s:.1f} tokens/s)",
        ]
        try:
            used = self.prompt_tokens()
            lines.append(f"context:     {len(self.history)} messages, {used} of {self.llm.n_ctx} tokens"
                         + (f" ({self.dropped} old messages dropped)" if self.dropped else ""))
        except Exception:
            pass
        return lines


def _verbose_line(c) -> str:
    s = c.stats
    return (f"[{s.generated_tokens} tokens, {s.decode_tokens_per_s:.1f} t/s, TTFT {_ms(s.ttft_s)}, "
            f"prefilled {s.prompt_tokens - s.cached_tokens} new + {s.cached_tokens} cached prompt tokens, "
            f"finish: {c.finish_reason}]")


def _read_input(prompt: str, to_stdout: bool) -> str:
    if to_stdout:
        return input(prompt)
    sys.stderr.write(prompt)
    sys.stderr.flush()
    return input()


def _repl(session: ChatSession, llm, verbose: bool) -> int:
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    tty_out = sys.stdout.isatty()
    click.echo(f"pydecode chat: {llm.model.path.name} ({llm.model.n_threads} threads, {llm.model.isa}, "
               f"context {llm.n_ctx}). /help for commands, Ctrl-D to quit.", err=True)
    ctrl_c = 0
    while True:
        try:
            line = _read_input(">>> ", tty_out)
            if line.lstrip().startswith('"""'):
                lines = [line.lstrip()[3:]]
                while not (lines[-1].rstrip().endswith('"""') and (len(lines) > 1 or lines[0].strip() != "")):
                    lines.append(_read_input("... ", tty_out))
                line = "\n".join(lines).rstrip()[:-3]
        except EOFError:
            sys.stdout.write("\n")
            return 0
        except KeyboardInterrupt:
            ctrl_c += 1
            if ctrl_c >= 2:
                sys.stdout.write("\n")
                return 0
            click.echo("\n(Ctrl-C again or Ctrl-D to quit)", err=True)
            continue
        ctrl_c = 0
        text = line.strip()
        if not text:
            continue
        if text.startswith("/") and not text.startswith("//"):
            cmd, _, arg = text.partition(" ")
            cmd, arg = cmd.lower(), arg.strip()
            if cmd in ("/exit", "/quit", "/bye"):
                return 0
            if cmd in ("/help", "/?"):
                click.echo(CHAT_HELP)
            elif cmd in ("/reset", "/clear"):
                session.reset()
                click.echo("[conversation cleared]", err=True)
            elif cmd == "/system":
                session.set_system(arg)
                click.echo("[system prompt set; conversation cleared]" if arg else
                           "[system prompt removed; conversation cleared]", err=True)
            elif cmd == "/stats":
                click.echo("\n".join(session.stats_lines()))
            else:
                click.echo(f"unknown command {cmd}; /help lists them", err=True)
            continue
        try:
            c = session.ask(text, _stdout_write)
        except (PydecodeError, ValueError) as e:
            click.echo(f"error: {_message(e)}", err=True)
            continue
        _stdout_write("\n")
        if c.finish_reason == "cancelled":
            click.echo("[stopped]", err=True)
        elif c.finish_reason == "length":
            click.echo(f"[answer cut: {c.stop_detail}]", err=True)
        if verbose:
            click.echo(_verbose_line(c), err=True)
        _stdout_write("\n")


@main.command()
@_model_opt
@click.option("-p", "--prompt", default=None,
              help="Ask one question, print the answer and exit. Without it: interactive, or, when "
                   "stdin is not a terminal, all of stdin is the question.")
@click.option("-s", "--system", default=None, help="System prompt.")
@click.option("-n", "--max-tokens", type=click.IntRange(min=1), default=512, show_default=True,
              help="Max tokens per answer.")
@_sampling_options
@click.option("-v", "--verbose", is_flag=True, help="Print tokens/s and time to first token after each answer.")
@_threads_opt
@_ctx_opt
@_isa_opt
def chat(model, prompt, system, max_tokens, verbose, threads, n_ctx, isa, **kw):
    """Chat with MODEL in the terminal.

    Interactive when stdin is a terminal: /help lists the commands, Ctrl-C stops an answer,
    Ctrl-D (or Ctrl-C twice at the prompt) quits. `echo question | pydecode chat` answers once."""
    sampling = _sampling(kw)
    interactive = prompt is None and sys.stdin.isatty()
    if prompt is None and not interactive:
        prompt = sys.stdin.read()
        if not prompt.strip():
            _fail(ValueError("nothing to answer: stdin was empty (use -p TEXT, or run in a terminal)"))
    try:
        llm = _load(model, n_ctx, threads, isa)
        _check_sampling(sampling)
        session = ChatSession(llm, system=system, max_tokens=max_tokens, sampling=sampling)
    except (PydecodeError, ValueError, OSError) as e:
        _fail(e)
    if interactive:
        sys.exit(_repl(session, llm, verbose))
    try:
        c = session.ask(prompt.strip(), _stdout_write)
    except (PydecodeError, ValueError) as e:
        _fail(e)
    _stdout_write("\n")
    if verbose:
        click.echo(_verbose_line(c), err=True)
    sys.exit(130 if c.finish_reason == "cancelled" else 0)


def _check_sampling(sampling: dict) -> None:
    """Fails early (before the first question) on sampler values the API rejects."""
    from .sampling import SamplingParams

    SamplingParams(**sampling)


@main.command()
@click.argument("model", default=DEFAULT_MODEL)
def info(model):
    """Architecture, size, quant mix, context and KV bytes of MODEL."""
    from .config import arch_config
    from .gguf_file import GGUFFile

    try:
        path = registry.resolve(model)
        g = GGUFFile(path)
        c = arch_config(g)
    except (PydecodeError, ValueError, OSError) as e:
        _fail(e)
    n_params = sum(t.n_elements for t in g.tensors.values())
    mix = Counter()
    by_bytes = Counter()
    for t in g.tensors.values():
        mix[t.type_name] += 1
        by_bytes[t.type_name] += t.n_bytes
    weight = sum(t.n_bytes for t in g.tensors.values())
    emb = g.tensors["token_embd.weight"].n_bytes
    per_token = weight - emb + (emb if c.tied_output else 0)
    kv = c.kv_bytes_per_token(2)
    click.echo(f"file            {path} ({g.file_size / 1e6:.1f} MB)")
    click.echo(f"name            {g.metadata.get('general.name', '?')}")
    click.echo(f"architecture    {c.arch}: {c.n_layer} layers, d_model {c.n_embd}, {c.n_head} heads "
               f"({c.n_head_kv} kv), head_dim {c.head_dim}, ffn {c.n_ff}, vocab {c.n_vocab}")
    click.echo(f"parameters      {n_params / 1e6:.1f} M")
    click.echo(f"context         {c.n_ctx_train} tokens (trained); rope base {c.rope_base:g}, dims {c.rope_dim}")
    click.echo(f"output head     {'tied to token_embd' if c.tied_output else 'output.weight'}")
    click.echo("quant mix       " + ", ".join(f"{k}: {mix[k]} tensors, {by_bytes[k] / 1e6:.1f} MB"
                                             for k in sorted(mix, key=lambda k: -by_bytes[k])))
    click.echo(f"weights/token   {per_token / 1e6:.1f} MB read per decoded token")
    click.echo(f"KV cache        {kv} bytes per token (F16), {kv * c.n_ctx_train / 1e6:.1f} MB at full context")
    click.echo(f"tokenizer       {g.metadata.get('tokenizer.ggml.model')} / {g.metadata.get('tokenizer.ggml.pre', '-')}")
    try:   # what loading does on this CPU: which kernels, which weights it repacks (a small context)
        from .model import Model
        with Model(path, n_ctx=16, n_threads=1) as m:
            kinds = Counter(t for _, t, _ in m.repacked)
            click.echo(f"on this CPU     {m.isa} kernels; " + (
                f"{len(m.repacked)} tensors repacked at load ({', '.join(f'{k}: {v}' for k, v in kinds.items())}), "
                f"{m.repacked_bytes / 1e6:.1f} MB beyond the mapped file (PYDECODE_REPACK=0: none)"
                if m.repacked else "weights read in the file's layout (zero-copy)"))
    except (PydecodeError, ValueError, OSError) as e:
        click.echo(f"on this CPU     cannot load: {e}")


@main.command()
@_model_opt
@click.option("-p", "--prompt", required=True, help="Prompt text.")
@click.option("-n", "--max-tokens", "n", type=click.IntRange(min=1), default=8, show_default=True,
              help="New tokens to decode (greedy).")
@click.option("--tol", type=click.FloatRange(min=0), default=None,
              help="Max |logit difference| allowed (default: the cache tests' bound, 2e-3).")
@click.option("--kv-type", type=click.Choice(["f16", "f32"]), default="f16", show_default=True, help="KV cache type.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@_threads_opt
@_ctx_opt
@_isa_opt
def verify(model, prompt, n, tol, kv_type, as_json, threads, n_ctx, isa):
    """Check the KV cache: decode with it and, side by side, by recomputing the whole prefix at
    every step (a second model on the same file). Prints per step the max |logit difference|,
    whether the chosen tokens agree, the positions whose K/V each path computed, the time of
    each, and the KV bytes in use. Exit status 1 if the two paths disagree."""
    from . import verify as _verify

    printed = [0, 0]
    detok = []

    def on_step(step):
        if as_json:
            return
        if step.index == 1:
            click.echo(_verify.HEADER)
        printed[0] += step.positions_cached
        printed[1] += step.positions_recompute
        click.echo(_verify.step_line(step, printed[0], printed[1], detok[0] if detok else None))

    class _Model(_verify.Model):            # keeps the tokenizer for the text column
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            if not detok:
                detok.append(lambda ids: self.tokenizer.decode(ids))

    try:
        path = registry.resolve(model)
        v = _verify.verify(path, prompt, n, n_threads=threads, n_ctx=n_ctx, isa=isa, kv_type=kv_type,
                           tolerance=_verify.TOLERANCE if tol is None else tol, on_step=on_step, model_cls=_Model)
    except (PydecodeError, ValueError, OSError) as e:
        _fail(e)
    if as_json:
        click.echo(json.dumps({
            "model": str(path), "prompt_tokens": v.prompt_tokens, "tokens": v.tokens, "ok": v.ok,
            "tolerance": v.tolerance, "max_abs_diff": v.max_abs_diff, "positions_cached": v.positions_cached,
            "positions_recompute": v.positions_recompute, "cached_s": v.cached_s, "recompute_s": v.recompute_s,
            "kv_bytes_in_use": v.steps[-1].kv_bytes_in_use, "kv_bytes_allocated": v.kv_bytes_allocated,
            "n_ctx": v.n_ctx, "steps": [asdict(s) for s in v.steps]}))
    else:
        for line in _verify.summary_lines(v):
            click.echo(line)
    sys.exit(0 if v.ok else 1)


@main.command()
@click.argument("name")
@click.option("--force", is_flag=True, help="Download again even if cached.")
def pull(name, force):
    """Download a registry model into the cache."""
    try:
        path = registry.pull(name, force=force)
    except (PydecodeError, ValueError, OSError) as e:
        _fail(e)
    click.echo(str(path))


@main.command()
@click.option("-m", "--model", default=DEFAULT_MODEL, show_default=True,
              help="Registry name (fetched on first use) or path to a .gguf file.")
@click.option("-t", "--threads", type=int, multiple=True, help="Thread counts (repeatable; default 1 and all physical cores).")
@click.option("-r", "--reps", default=5, show_default=True, help="Repetitions per test (after a warm-up).")
@click.option("-p", "--n-prompt", default=64, show_default=True, help="Prompt tokens for the pp test (0: skip).")
@click.option("-n", "--n-gen", default=128, show_default=True, help="Tokens for the tg test.")
@click.option("-d", "--depth", type=int, multiple=True, help="Context depths for tg (repeatable; e.g. -d 0 -d 512 -d 2048).")
@click.option("--bandwidth", is_flag=True, help="Probe read bandwidth and show %% of it reached by tg.")
@click.option("--compare", type=click.Choice(["llama-cpp-python"]), default=None,
              help="A/B against llama-cpp-python on the same file (must be installed).")
@click.option("--concurrency", default=None, metavar="C1,C2,...",
              help="Instead of pp/tg: C sequences of N_GEN tokens each at once through the batching Engine, "
                   "for each level (e.g. 1,2,4,8,16): aggregate and per-sequence t/s, ITL, TTFT.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@_isa_opt
def bench(model, threads, reps, n_prompt, n_gen, depth, bandwidth, compare, concurrency, as_json, isa):
    """Speed of MODEL, llama-bench style: pp / tg tokens/s (mean ± std), roofline, depth sweep;
    --concurrency: many sequences decoded at once."""
    import json as _json

    from . import bench as _bench
    from .model import MAX_N_SEQ, physical_cores

    try:
        path = registry.resolve(model)
        threads = list(threads) or sorted({1, physical_cores()})
        if reps < 1 or n_gen < 1 or n_prompt < 0 or any(t < 1 for t in threads) or any(x < 0 for x in depth):
            raise click.BadParameter("reps, n-gen and threads must be >= 1; n-prompt and depths >= 0")
        if concurrency is not None:
            try:
                levels = [int(x) for x in concurrency.split(",")]
            except ValueError:
                levels = []
            if not levels or any(not 1 <= c <= MAX_N_SEQ for c in levels):
                raise click.BadParameter(f"a comma-separated list of integers in 1..{MAX_N_SEQ}, got {concurrency!r}",
                                         param_hint="--concurrency")
            rows = [r for t in threads for r in _bench.bench_concurrency(path, t, levels, n_gen, isa=isa, reps=reps)]
            click.echo(_json.dumps({"concurrency": rows}) if as_json else _bench.format_concurrency(rows))
            return
        if compare:
            try:
                import llama_cpp  # noqa: F401
            except ImportError:
                raise click.UsageError("--compare llama-cpp-python needs the llama-cpp-python package installed")
        lines = []
        result = _bench.run(path, threads, reps=reps, n_prompt=n_prompt, n_gen=n_gen, depths=tuple(depth) or (0,),
                            bandwidth=bandwidth, compare=compare, isa=isa,
                            echo=(lines.append if as_json else click.echo))
    except (PydecodeError, ValueError, OSError) as e:
        _fail(e)
    if as_json:
        click.echo(_json.dumps(result, default=str))


@main.command("list")
def list_models():
    """Models in the registry (and whether they are downloaded)."""
    for m in registry.list_models():
        mark = m["status"] if m["status"] != "changed on disk" else "changed on disk: re-verified at next use"
        click.echo(f"{m['name']:22s} {m['size'] / 1e6:8.1f} MB  {m['arch']:8s} {m['quant']:8s} [{mark}]  {m['description']}")


if __name__ == "__main__":
    main()
