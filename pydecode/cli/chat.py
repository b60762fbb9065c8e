"""`pydecode chat`: the interactive chat in a terminal, or one answer to piped stdin / -p."""
from __future__ import annotations

import sys

import click

from ..chat import ChatSession, is_base_model
from ..errors import PydecodeError
from . import common
from .terminal import ReasoningView, Style, WordWrapper, use_colour

CHAT_HELP = """\
Commands:
  /reset           forget the conversation and start fresh (keeps the system prompt)
  /system TEXT     set the system prompt and start fresh (/system alone removes it)
  /stats           the last answer's statistics: tokens, speed, time to first token, cache use
  /help            this help
  /exit            quit (also /quit, /bye, Ctrl-D, or Ctrl-C twice at the prompt)
Ctrl-C while the model answers stops the answer. Start with \"\"\" to type several lines; end with \"\"\"."""


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def finish_words(c) -> str:
    if c.finish_reason == "cancelled":
        return "[stopped]"
    return c.finish_reason + (f" ({c.stop_detail})" if c.stop_detail else "")


def stats_lines(session: ChatSession) -> list[str]:
    c, lines = session.last, []
    if c is None:
        lines.append("no answer yet")
    else:
        s = c.stats
        new = s.prompt_tokens - s.cached_tokens
        lines += [
            f"answer:      {s.generated_tokens} tokens, {s.decode_tokens_per_s:.1f} tokens/s, finish: {finish_words(c)}",
            f"first token: {_ms(s.ttft_s)} (TTFT)",
            f"prompt:      {s.prompt_tokens} tokens: {new} prefilled new, {s.cached_tokens} reused from cache "
            f"({_ms(s.prefill_s)}, {s.prefill_tokens_per_s:.1f} tokens/s)",
        ]
        if s.draft_tokens:
            lines.append(f"drafts:      {s.accepted_tokens} of {s.draft_tokens} accepted "
                         f"({100 * s.acceptance_rate:.0f}%), {s.tokens_per_pass:.2f} tokens per model pass")
    try:
        used = session.prompt_tokens() if session.history else 0
        lines.append(f"context:     {len(session.history)} messages, {used} of {session.llm.n_ctx} tokens"
                     + (f" ({session.dropped} old messages dropped)" if session.dropped else ""))
    except Exception:
        pass
    return lines


def _verbose_line(c) -> str:
    s = c.stats
    return (f"[{s.generated_tokens} tokens, {s.decode_tokens_per_s:.1f} t/s, TTFT {_ms(s.ttft_s)}, "
            f"prefilled {s.prompt_tokens - s.cached_tokens} new + {s.cached_tokens} cached prompt tokens, "
            f"finish: {finish_words(c)}]")


def _stderr_write(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def _read_input(prompt: str, to_stdout: bool) -> str:
    if to_stdout:
        return input(prompt)
    sys.stderr.write(prompt)
    sys.stderr.flush()
    return input()


def _repl(session: ChatSession, llm, verbose: bool, banner: str) -> int:
    # A Ctrl-C that lands outside input() and the answer (in the "again" notice after a first one,
    # between two lines) quits as the second Ctrl-C would, not through click's "Aborted!" (exit 1).
    try:
        return _repl_loop(session, llm, verbose, banner)
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        return 0


def _repl_loop(session: ChatSession, llm, verbose: bool, banner: str) -> int:
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    tty_out = sys.stdout.isatty()
    style = Style(use_colour(sys.stdout))
    # readline must know which prompt characters take no room: \001..\002 around the escapes.
    prompt = style.prompt(">>> ").replace("\033", "\001\033").replace("m", "m\002") if style.on else ">>> "
    click.echo(banner, err=True)
    ctrl_c = 0
    while True:
        try:
            line = _read_input(prompt, tty_out)
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
                click.echo(style.dim("\n".join(stats_lines(session))))
            else:
                click.echo(f"unknown command {cmd}; /help lists them", err=True)
            continue
        wrap = WordWrapper.for_terminal(common.stdout_write)
        view = ReasoningView(wrap, common.stdout_write, style)
        progress = common.PrefillProgress()
        try:
            c = session.ask(text, view.content, on_prefill=progress, write_reasoning=view.reasoning)
        except (PydecodeError, ValueError) as e:
            click.echo(f"error: {common.message(e)}", err=True)
            continue
        finally:
            progress.close()
            view.close()
        wrap.flush()
        common.stdout_write("\n")
        if c.finish_reason == "cancelled":
            click.echo(style.dim("[stopped]"), err=True)
        elif c.finish_reason == "length":
            click.echo(style.dim(f"[answer cut: {c.stop_detail}]"), err=True)
        if verbose:
            click.echo(style.dim(_verbose_line(c)), err=True)
        common.stdout_write("\n")


@click.command()
@common.model_args
@click.option("-p", "--prompt", default=None,
              help="Ask one question, print the answer and exit. Without it: interactive, or, when "
                   "stdin is not a terminal, all of stdin is the question.")
@click.option("-s", "--system", default=None, help="System prompt.")
@click.option("-n", "--max-tokens", "--n-predict", "max_tokens", type=click.IntRange(min=1), default=512,
              show_default=True, help="Max tokens per answer.")
@common.sampling_options
@common.structure_options
@click.option("-v", "--verbose", is_flag=True, help="Print tokens/s and time to first token after each answer.")
@common.runtime_options
def chat(model, model_arg, prompt, system, max_tokens, verbose, threads, n_ctx, isa, draft, kv_type, prompt_cache,
         **kw):
    """Chat with MODEL in the terminal.

    Interactive when stdin is a terminal: /help lists the commands, Ctrl-C stops an answer,
    Ctrl-D (or Ctrl-C twice at the prompt) quits. `echo question | pydecode chat` answers once.

    Sampling: the model's recommendation from its GGUF metadata (general.sampling.*) when it has
    one, else temperature 0.8, top-k 40, top-p 0.95, min-p 0.05 and a 1.1 repeat penalty; any
    sampler flag overrides (--temp 0 for greedy). The banner says which is in force."""
    from ..sampling import SamplingParams, chat_defaults

    name = common.model_name(model, model_arg)
    try:
        path = common.resolve_model(name)          # a missing model is the first thing to hear of
    except (PydecodeError, ValueError, OSError) as e:
        common.fail(e)
    interactive = prompt is None and sys.stdin.isatty()
    if prompt is None and not interactive:
        prompt = sys.stdin.read()
        if not prompt.strip():
            common.fail(ValueError("nothing to answer: stdin was empty (use -p TEXT, or run in a terminal)"))
    try:
        llm = common.load_llm(path, n_ctx, threads, isa, draft=draft, kv_type=kv_type)
        common.restore_prompt_cache(llm, prompt_cache)
        defaults, source = chat_defaults(llm.model.gguf.metadata)
        flags_given = any(kw.get(k) is not None for k in common.SAMPLING)
        sampling = common.resolve_sampling(kw, defaults)
        SamplingParams(**sampling)                 # a bad value fails before the first question
        sampling.update(common.resolve_structure(kw, llm))   # so does a bad schema: every answer follows it
        session = ChatSession(llm, system=system, max_tokens=max_tokens, sampling=sampling,
                              notice=lambda msg: click.echo(msg, err=True), consume=common.consume)
    except (PydecodeError, ValueError, OSError) as e:
        common.fail(e)
    meta = llm.model.gguf.metadata
    if is_base_model(meta):
        click.echo(Style(use_colour(sys.stderr)).warn(
            f"warning: {llm.model.path.name} has no chat template and its name does not say it is tuned for "
            f"chat: it looks like a base model, which continues text rather than answering (try `pydecode run`, "
            f"or an instruct model)"), err=True)
    if interactive:
        banner = (f"pydecode chat: {llm.model.path.name} ({llm.model.n_threads} threads, {llm.model.isa}, context "
                  f"{llm.n_ctx}). Sampling: {common.describe_sampling(sampling)} ("
                  f"{'your flags over ' if flags_given else ''}{source}). /help for commands, Ctrl-D to quit.")
        try:
            code = _repl(session, llm, verbose, banner)
        finally:
            common.save_prompt_cache(llm, prompt_cache)
        sys.exit(code)
    progress = common.PrefillProgress()
    # One answer: stdout has the answer alone; a reasoning model's reasoning goes to stderr.
    view = ReasoningView(WordWrapper(_stderr_write, None), _stderr_write, Style(use_colour(sys.stderr)))
    try:
        c = session.ask(prompt.strip(), common.stdout_write, on_prefill=progress, write_reasoning=view.reasoning)
    except (PydecodeError, ValueError) as e:
        common.fail(e)
    finally:
        progress.close()
        view.close()
    common.save_prompt_cache(llm, prompt_cache)
    common.stdout_write("\n")
    if verbose:
        click.echo(_verbose_line(c), err=True)
    sys.exit(130 if c.finish_reason == "cancelled" else 0)
