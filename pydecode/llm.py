"""The public face: `pydecode.load(...)` returns an LLM that generates, streams and chats."""
from __future__ import annotations

import os
import warnings

from .chat import fallback_template, render
from .chat.reasoning import for_template, reasoning_format
from .engine import Engine, Handle
from .errors import ModelClosedError
from .generation import Completion
from .model import Model
from .registry import resolve


class LLM:
    """A model ready to generate. Every call (generate, stream, chat, and llm.engine's own
    submissions) goes through one batching Engine, which leases the model's KV slots: a new
    prompt takes the slot whose cache shares the longest prefix with it, so a chat's history is
    not recomputed. With n_seq > 1 (see load) up to n_seq generations run together, from any
    threads; beyond that, and always with n_seq=1, calls wait their turn (FIFO) for a slot: two
    threads never end or overwrite each other's generation. A stream that is neither finished,
    cancelled nor dropped keeps its slot. close() (or leaving a `with` block) cancels what is
    running and frees the model; any use after it raises ModelClosedError."""

    def __init__(self, model: Model, draft=None):
        self.model = model
        self.tokenizer = model.tokenizer
        self.draft = draft               # None, "lookup" or a speculative.DraftModel (see load)
        self._engine = Engine(model, draft=draft)
        self._closed = False
        self._warned_batch = False

    @property
    def engine(self) -> Engine:
        """The batching engine every generation of this LLM goes through."""
        if self._closed:
            raise ModelClosedError("the LLM is closed")
        return self._engine

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text -> token ids (BOS added when the model wants it)."""
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens, skip_special: bool = False) -> str:
        """Token ids -> text."""
        return self.tokenizer.decode(list(tokens), skip_special=skip_special)

    def _generation(self, prompt, max_tokens, stop, logprobs, sampling, on_prefill=None, draft_tokens=None,
                    structure=None) -> Handle:
        return self.engine.submit(prompt, max_tokens, stop=stop, logprobs=logprobs, on_prefill=on_prefill,
                                  draft_tokens=draft_tokens, **(structure or {}), **sampling)

    def stream(self, prompt: str | list[int], max_tokens: int = 256, *, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, repeat_penalty: float = 1.0,
               frequency_penalty: float = 0.0, presence_penalty: float = 0.0, repeat_last_n: int = 64,
               seed: int | None = None, stop: str | list[str] | None = None,
               logprobs: int | None = None, on_prefill=None, draft_tokens: int | None = None,
               json_schema=None, regex: str | None = None, grammar: str | None = None,
               choices: list[str] | None = None, response_format: dict | None = None,
               logit_bias: dict | None = None, typical_p: float = 1.0, tfs_z: float = 1.0,
               mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
               logits_processor=None, stopping_criteria=None, context_shift: bool = False, n_keep: int = 0,
               n_discard: int = 0) -> Handle:
        """Starts a generation and returns it as an iterator of Pieces (token, text): an Engine
        Handle. It can be ended with .cancel() (or dropped: that cancels it too); .completion
        holds the result once it has ended. Parameters as in generate(). A KeyboardInterrupt while
        iterating ends it (finish_reason "cancelled", what it produced kept) and reaches you.
        on_prefill(done, total): called after each chunk of the prompt (a progress bar)."""
        return self._generation(prompt, max_tokens, stop, logprobs, dict(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
            frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
            repeat_last_n=repeat_last_n, seed=seed, logit_bias=logit_bias, typical_p=typical_p, tfs_z=tfs_z,
            mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta,
            logits_processor=logits_processor, stopping_criteria=stopping_criteria, context_shift=context_shift,
            n_keep=n_keep, n_discard=n_discard), on_prefill, draft_tokens, dict(
            json_schema=json_schema, regex=regex, grammar=grammar, choices=choices, response_format=response_format))

    def generate(self, prompt: str | list[int], max_tokens: int = 256, *, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, repeat_penalty: float = 1.0,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, repeat_last_n: int = 64,
                 seed: int | None = None, stop: str | list[str] | None = None,
                 logprobs: int | None = None, draft_tokens: int | None = None, json_schema=None,
                 regex: str | None = None, grammar: str | None = None, choices: list[str] | None = None,
                 response_format: dict | None = None, logit_bias: dict | None = None, typical_p: float = 1.0,
                 tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_tau: float = 5.0,
                 mirostat_eta: float = 0.1, logits_processor=None, stopping_criteria=None,
                 context_shift: bool = False, n_keep: int = 0, n_discard: int = 0) -> Completion:
        """Generates a continuation of `prompt` (text or token ids).

        temperature=0 is greedy. The sampling chain: penalties (repeat_penalty, frequency_penalty,
        presence_penalty over the last repeat_last_n tokens) -> temperature -> top_k -> tfs_z
        (tail-free) -> typical_p (locally typical) -> top_p -> min_p -> a draw seeded by `seed`;
        mirostat_mode=1 or 2 (Mirostat, Mirostat 2.0: target surprise mirostat_tau bits, learning
        rate mirostat_eta) replaces everything after the temperature (pydecode/sampling_extra.py).
        Generation stops at an end-of-generation token, at max_tokens, at a full context, or at
        any of the `stop` strings (not included in the text).
        logprobs=N records each chosen token's log-probability and the N most likely tokens.
        logit_bias={token id: bias} adds the bias to those tokens' logits before the chain
        (-inf, or None, bans a token).
        logits_processor: f(input_ids, scores) -> scores, or a list of them applied in order
        (llama-cpp-python's), on a copy of each step's logits before everything else (input_ids:
        np.intc, the prompt and the tokens so far; scores: np.float32, one per vocabulary token).
        stopping_criteria: f(input_ids, logits) -> bool, or a list (any True stops), called once
        the next token is chosen; True ends the generation there (finish_reason "stop",
        stop_detail "stopping_criteria", that token not emitted). What they raise, or a
        processor's answer of the wrong type or shape, ends the generation and reaches you.
        draft_tokens: with a drafter (load's `draft`), the most tokens it may propose per pass
        (0 turns speculative decoding off for this call); the output does not change.
        context_shift=True: a full context no longer ends the generation: n_discard tokens
        (default: half of those after the kept ones) after the first n_keep (-1: the whole
        prompt; a BOS is always kept) are dropped, and the rest is prefilled again at its new
        positions, so the cache still equals a recompute (llama-server's --context-shift;
        Completion.stats.shifted counts the tokens dropped). max_tokens then ends it.

        Structured output (at most one): json_schema= (a dict or JSON string), regex=, grammar=
        (Lark, or llama.cpp's GBNF), choices=[...] (one of these strings), or response_format= as
        OpenAI spells it ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name",
        "schema", "strict"}}) or llama-cpp-python does ({"type": "json_object", "schema": {...}}).
        The text then always matches it (finish_reason "stop"), unless max_tokens, the context
        or a stop string cut it off first (then Completion.complete is False). A bad schema,
        regex or grammar raises ValueError before anything is decoded.
        """
        gen = self.stream(prompt, max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                          presence_penalty=presence_penalty, repeat_last_n=repeat_last_n, seed=seed, stop=stop,
                          logprobs=logprobs, draft_tokens=draft_tokens, json_schema=json_schema, regex=regex,
                          grammar=grammar, choices=choices, response_format=response_format,
                          logit_bias=logit_bias, typical_p=typical_p, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
                          mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta,
                          logits_processor=logits_processor, stopping_criteria=stopping_criteria,
                          context_shift=context_shift, n_keep=n_keep, n_discard=n_discard)
        try:
            return gen.result()
        except BaseException:
            gen.cancel()
            raise

    def generate_batch(self, prompts: list[str | list[int]], max_tokens: int = 256, **params) -> list[Completion]:
        """Completions of several prompts, in their order; parameters as in generate(), the same
        for each (a logits_processor or stopping_criteria is called for every sequence, each
        time with that sequence's own input_ids). They run batched: the KV cache grows to a slot
        per prompt if it has fewer (within the memory there is, and n_batch; a warning says when
        it cannot, and the rest queue, joining as others finish)."""
        if isinstance(prompts, str):
            raise TypeError("prompts must be a list of prompts (texts or token-id lists), not one string")
        prompts = list(prompts)
        if len(prompts) > self.engine.max_seqs:
            got = self.engine.grow(len(prompts))
            if got < len(prompts) and not self._warned_batch:
                self._warned_batch = True
                why = (f"n_batch={self.model.n_batch} tokens per step" if got >= self.model.n_batch else
                       f"the memory available for their KV cache ({self.model.slot_bytes() / 1e6:.0f} MB a slot)")
                warnings.warn(f"generate_batch: {len(prompts)} prompts, but only {got} run at once here "
                              f"(limited by {why}); the others wait their turn", RuntimeWarning, stacklevel=2)
        handles = []
        try:
            for p in prompts:   # every prompt is checked before any runs
                handles.append(self.stream(p, max_tokens, **params))
            return [h.result() for h in handles]
        finally:
            for h in handles:   # no-op for finished ones; after an error, none keeps running
                h.cancel()

    def chat_prompt(self, messages: list[dict], add_generation_prompt: bool = True, **template_kwargs) -> str:
        """The prompt text the model's chat template makes of `messages` (an assistant turn may
        carry its `reasoning_content`); template_kwargs are more template variables, e.g.
        enable_thinking=False for Qwen3, reasoning_effort="high" for gpt-oss."""
        tok = self.tokenizer
        meta = self.model.gguf.metadata
        bos = tok.decode([tok.bos_id]) if tok.bos_id is not None else ""
        eos = tok.decode([tok.eos_id]) if tok.eos_id is not None else ""
        return render(for_template(messages, self.reasoning_format), self.template, bos_token=bos, eos_token=eos,
                      add_generation_prompt=add_generation_prompt, **template_kwargs)

    @property
    def template(self) -> str:
        """The chat template's source: `chat_template` when set (a named one, or jinja text), else
        the model's own (GGUF tokenizer.chat_template), else a built-in one for its vocabulary."""
        return (self.chat_template or self.model.gguf.metadata.get("tokenizer.chat_template")
                or fallback_template(self.tokenizer))

    @property
    def chat_template(self) -> str | None:
        return getattr(self, "_chat_template", None)

    @chat_template.setter
    def chat_template(self, source: str | None) -> None:
        """Replaces the model's chat template (None: its own again); a name of
        chat.named_templates (e.g. "chatml", "llama3") stands for that template."""
        from .chat.named_templates import resolve_template
        self._chat_template = None if source is None else resolve_template(source)
        self.__dict__.pop("_reasoning_format", None)

    @property
    def reasoning_format(self) -> str | None:
        """How this model's answers carry reasoning: "think" (<think>...</think>, Qwen3),
        "channel" (Gemma 4's thought channel), "harmony" (gpt-oss's analysis channel) or None
        (see pydecode/chat/reasoning.py)."""
        if not hasattr(self, "_reasoning_format"):
            self._reasoning_format = reasoning_format(self.chat_template or self.model.gguf.metadata.get("tokenizer.chat_template"),
                                                      self.tokenizer)
        return self._reasoning_format

    def chat(self, messages: list[dict], max_tokens: int = 256, **sampling) -> Completion:
        """Replies to a conversation. The history's K/V stay cached across turns, so turn N+1
        prefills only its new tokens (see .stats.cached_tokens). Keywords as in generate()
        (sampling, typical_p / tfs_z / mirostat_*, logits_processor, stopping_criteria, ...)."""
        return self.generate(self.chat_tokens(messages), max_tokens, **sampling)

    def stream_chat(self, messages: list[dict], max_tokens: int = 256, **sampling) -> Handle:
        """Like chat, streamed."""
        return self.stream(self.chat_tokens(messages), max_tokens, **sampling)

    def chat_tokens(self, messages: list[dict], **template_kwargs) -> list[int]:
        """The token ids of the prompt the chat template makes of `messages` (what chat() runs;
        for the Engine, e.g. llm.engine.submit(llm.chat_tokens(messages)))."""
        # The template writes BOS itself when the model wants it: don't add a second one.
        text = self.chat_prompt(messages, **template_kwargs)
        ids = self.tokenizer.encode(text, add_special=False, parse_special=True)
        bos = self.tokenizer.bos_id
        if self.tokenizer.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids = [bos] + ids
        return ids

    # ---- the KV cache's state (pydecode/kvstate.py): save / restore, prompt caches, hand-off ----

    def save_state(self, path: str | os.PathLike, slot: int | Handle | None = None,
                   timeout: float | None = None) -> int:
        """Writes what a KV slot holds (its tokens and their K/V; default: the slot of the last
        finished generation, or the slot a finished Handle ran in) to a state file, atomically.
        Another process with the same model file and kv_type restores it with load_state and
        continues exactly as this one would. Returns the number of tokens saved. Every state call
        waits while a generation leases the slot it needs (or, with no slot given, every slot), as
        generations wait their turn; timeout: TimeoutError after that many seconds of waiting."""
        return self.engine.save_state(path, slot, timeout)

    def load_state(self, path: str | os.PathLike, slot: int | None = None, timeout: float | None = None) -> list[int]:
        """Restores a state file from save_state into a free slot and returns its tokens: the next
        prompt that starts with them (a conversation's history, a long system prompt) reuses their
        K/V instead of prefilling them. A file of another model, kv_type or format version, or a
        truncated or corrupted one, raises StateFileError and changes nothing."""
        return self.engine.load_state(path, slot, timeout)

    def export_state(self, slot: int | Handle | None = None, timeout: float | None = None) -> bytes:
        """save_state's bytes, in memory (a hand-off to another process: import_state)."""
        return self.engine.export_state(slot, timeout)

    def import_state(self, data: bytes, slot: int | None = None, timeout: float | None = None) -> list[int]:
        """load_state from bytes (export_state's)."""
        return self.engine.import_state(data, slot, timeout)

    def close(self) -> None:
        """Cancels every generation in flight (their callers get ModelClosedError), waits for
        the step running, and frees the model. Idempotent."""
        self._closed = True
        self._engine.close()
        if self.draft is not None and self.draft != "lookup":
            self.draft.close()
        self.model.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- embeddings (pydecode/embeddings.py) ----

    def embed(self, inputs, *, pooling: str | None = None, normalize: bool = True) -> list:
        """Embeddings of `inputs`: a string, a list of strings, a list of token ids (one input) or
        a list of such lists; strings get the model's special tokens (BOS/EOS) as llama.cpp adds
        them. Returns one float32 numpy array per input: (n_embd,) when pooled, (n_tokens, n_embd)
        with pooling "none". pooling: "none", "mean", "cls" or "last" (default: the GGUF's, see
        `pooling`); normalize: L2 (True), none (False), or llama.cpp's embd_normalize as an int
        (applied to each token's vector with pooling "none"). The vectors are the final hidden
        states after the output norm (what the head reads). Each input takes a KV slot as a
        generation does (waiting its turn), and leaves its tokens there for a later prompt's prefix.
        An input with no tokens is a ValueError; one over the context a ContextFullError."""
        from . import embeddings
        return embeddings.embed(self.model, inputs, pooling=pooling, normalize=normalize,
                                take=self.engine._taker(None))

    @property
    def pooling(self) -> str:
        """The pooling the GGUF asks for ({arch}.pooling_type): "none" (also when absent, as
        llama.cpp), "mean", "cls", "last" or "rank" (refused by embed unless pooling= is given)."""
        from .embeddings import model_pooling
        return model_pooling(self.model)

    @property
    def n_embd(self) -> int:
        """The width of the hidden state: an embedding's length."""
        return self.model.config.n_embd


def load(model: str | os.PathLike = "smollm2-135m", *, n_ctx: int | None = None, n_threads: int | None = None,
         kv_type: str = "f16", isa: str | None = None, n_seq: int = 1, repack: bool | None = None,
         draft: str | os.PathLike | None = None) -> LLM:
    """Loads a model by registry name (fetched on first use) or by path to a .gguf file.
    n_threads defaults to the number of physical cores; n_ctx (per sequence) to min(4096, the
    model's trained context); n_seq: sequences decoded together (a KV cache slot each); repack:
    see Model (default on: faster kernels for some formats, at the cost of a copy of those weights).
    draft: speculative decoding (pydecode/speculative.py; the output is the same, only faster
    where guesses pay): "lookup" (the context's repeated n-grams propose the next tokens), or a
    registry name or path of a smaller model with the same vocabulary (e.g. qwen2.5-coder-0.5b
    for qwen2.5-coder-1.5b); None (default): plain decoding."""
    from .speculative import DraftModel
    if draft is not None and not isinstance(draft, (str, os.PathLike)):
        raise TypeError(f"draft must be None, 'lookup' or a model name or path, got {type(draft).__name__}")
    m = Model(resolve(model), n_ctx=n_ctx, n_threads=n_threads, kv_type=kv_type, isa=isa, n_seq=n_seq,
              repack=repack)
    try:
        drafter = None if draft is None else "lookup" if draft == "lookup" else DraftModel(m, resolve(draft))
        return LLM(m, drafter)
    except BaseException:
        m.close()
        raise
