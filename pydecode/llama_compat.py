"""llama-cpp-python's `Llama`, on pydecode: code written for `from llama_cpp import Llama` runs
with `from pydecode import Llama`.

`create_completion` (also `llm(prompt, ...)`) and `create_chat_completion` return the same
OpenAI-shaped dicts as llama-cpp-python (choices with text / message, finish_reason, usage,
logprobs), or, with stream=True, an iterator of the same chunks (text / delta). Defaults are
llama-cpp-python's: a completion samples at temperature 0.8 (top-k 40, top-p 0.95, min-p
0.05) for 16 tokens, a chat completion at temperature 0.2 until the model ends its turn.
Constructor arguments that only mean something to llama.cpp's GPU or memory machinery
(n_gpu_layers, use_mlock, ...) are accepted and have nothing to do here. Every other parameter
is either honoured or refused with an error naming it when given a value other than its
default (logits_processor, mirostat, a LoRA, ... : not yet implemented), never taken
and ignored. `grammar` (GBNF text or a LlamaGrammar) constrains the output through llguidance;
`top_p=0` keeps only the most likely token, as llama.cpp's top-p does.
"""
from __future__ import annotations

import sys
from typing import Iterator

import numpy as np

from . import openai_format as oai
from .chat import tools as tool_calls
from .llm import LLM, load

LLAMA_DEFAULT_SEED = 0xFFFFFFFF

# llama-cpp-python constructor arguments that only steer llama.cpp's GPU offload, memory
# mapping, NUMA placement, batch splitting or timing output: nothing to do on this runtime
# (weights are always memory-mapped; every position's logits are always there for logprobs).
_NO_EFFECT = {"n_gpu_layers", "split_mode", "main_gpu", "tensor_split", "rpc_servers", "use_mmap", "use_mlock",
              "n_ubatch", "n_threads_batch", "logits_all", "offload_kqv", "flash_attn", "op_offload", "swa_full",
              "no_perf", "numa"}
# Constructor arguments that would change the model's arithmetic or its text: their defaults
# (llama-cpp-python's) are accepted, any other value is refused by name until implemented.
_UNSUPPORTED_UNLESS_DEFAULT = {
    "vocab_only": False, "kv_overrides": None, "rope_scaling_type": -1, "pooling_type": -1,
    "rope_freq_base": 0.0, "rope_freq_scale": 0.0, "yarn_ext_factor": -1.0, "yarn_attn_factor": 1.0,
    "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0, "yarn_orig_ctx": 0, "embedding": False,
    "lora_base": None, "lora_scale": 1.0, "lora_path": None, "chat_handler": None, "tokenizer": None,
    "spm_infill": False, "chat_template_kwargs": None}
# ggml type ids llama-cpp-python takes for type_k / type_v -> pydecode's kv_type
_GGML_KV = {0: "f32", 1: "f16", 8: "q8_0"}
# Sampling parameters of create_completion / create_chat_completion not implemented yet, with
# the default that means "off" (the only value accepted).
_SAMPLING_OFF = {"typical_p": 1.0, "tfs_z": 1.0, "mirostat_mode": 0,
                 "logits_processor": None, "stopping_criteria": None}


def _refuse_unless_default(where: str, given: dict, defaults: dict) -> None:
    for name, default in defaults.items():
        if name in given and given[name] != default and not (given[name] is None and default is None):
            raise NotImplementedError(f"{where}: {name}={given[name]!r} is not supported by pydecode yet "
                                      f"(only its default, {default!r}, is accepted; nothing is ignored)")


class LlamaGrammar:
    """llama-cpp-python's LlamaGrammar: a GBNF grammar, for create_completion(grammar=...)."""

    def __init__(self, *, _grammar: str):
        if not isinstance(_grammar, str) or not _grammar.strip():
            raise ValueError("a LlamaGrammar needs GBNF text")
        self._grammar = _grammar

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> "LlamaGrammar":
        return cls(_grammar=grammar)

    @classmethod
    def from_file(cls, file: str, verbose: bool = True) -> "LlamaGrammar":
        with open(file, encoding="utf-8") as f:
            return cls(_grammar=f.read())


def _gbnf(grammar) -> str | None:
    if grammar is None:
        return None
    if isinstance(grammar, LlamaGrammar) or isinstance(getattr(grammar, "_grammar", None), str):
        return grammar._grammar
    if isinstance(grammar, str):
        return grammar
    raise TypeError(f"grammar must be a LlamaGrammar or GBNF text, got {type(grammar).__name__}")


def _drain(handle):
    """(every piece of a handle, its Completion): the generation run to its end (cancelled if
    anything interrupts it)."""
    try:
        pieces = list(handle)
    except BaseException:
        handle.cancel()
        raise
    return pieces, handle.completion


def _stops(stop) -> list[str] | None:
    if stop is None or stop == []:
        return None
    return [stop] if isinstance(stop, str) else list(stop)


class LlamaPromptLookupDecoding:
    """llama-cpp-python's prompt-lookup draft model (llama_cpp.llama_speculative), for
    Llama(draft_model=...): pydecode's speculative decoding by prompt lookup (load(draft="lookup"),
    self-tuned; the arguments are accepted and checked, the lookup picks its own n-gram and k)."""

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10):
        for name, v in (("max_ngram_size", max_ngram_size), ("num_pred_tokens", num_pred_tokens)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        self.max_ngram_size, self.num_pred_tokens = max_ngram_size, num_pred_tokens


class Llama:
    """A GGUF model with llama-cpp-python's interface (see the module docstring)."""

    def __init__(self, model_path: str, *, n_ctx: int = 512, n_batch: int = 512, n_threads: int | None = None,
                 seed: int = LLAMA_DEFAULT_SEED, verbose: bool = True, chat_format: str | None = None,
                 draft_model: "LlamaPromptLookupDecoding | None" = None, type_k: int | None = None,
                 type_v: int | None = None, last_n_tokens_size: int = 64, **kwargs):
        unknown = set(kwargs) - _NO_EFFECT - set(_UNSUPPORTED_UNLESS_DEFAULT)
        if unknown:
            raise TypeError(f"Llama() got unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        _refuse_unless_default("Llama()", kwargs, _UNSUPPORTED_UNLESS_DEFAULT)
        kv = {_GGML_KV.get(t, t) for t in (type_k, type_v) if t is not None}
        if len(kv) > 1 or not kv <= set(_GGML_KV.values()):
            raise NotImplementedError(f"Llama(): type_k={type_k!r}, type_v={type_v!r}: the K and V cache types must "
                                      f"be the same, one of {sorted(_GGML_KV.items())} (ggml type ids)")
        if not isinstance(last_n_tokens_size, int) or last_n_tokens_size < 0:
            raise ValueError(f"last_n_tokens_size must be an integer >= 0, got {last_n_tokens_size!r}")
        self._repeat_last_n = last_n_tokens_size
        self.model_path = str(model_path)
        self.verbose = verbose
        if draft_model is not None and not isinstance(draft_model, LlamaPromptLookupDecoding):
            raise TypeError(f"draft_model must be a LlamaPromptLookupDecoding (pydecode's prompt lookup), "
                            f"got {type(draft_model).__name__}")
        self._llm: LLM = load(model_path, n_ctx=None if n_ctx == 0 else n_ctx, n_threads=n_threads,
                              kv_type=kv.pop() if kv else "f16", draft="lookup" if draft_model is not None else None)
        from .speculative import MAX_DRAFT
        self._draft_tokens = None if draft_model is None else min(draft_model.num_pred_tokens, MAX_DRAFT)
        self.metadata = {k: str(v) for k, v in self._llm.model.gguf.metadata.items() if not isinstance(v, list)}
        self.chat_format = chat_format
        if chat_format is not None:   # a named format replaces the model's own template
            from .chat.named_templates import ALIASES, NAMED, names
            if chat_format.strip().lower() not in NAMED and chat_format.strip().lower() not in ALIASES:
                self._llm.close()
                raise ValueError(f"chat_format={chat_format!r} is not a chat format pydecode has; it has: "
                                 f"{', '.join(names())} (or leave it out: the model's own template)")
            self._llm.chat_template = chat_format
        # One generator for the calls that give no seed, seeded here like llama.cpp's sampler:
        # the same sequence of calls draws the same text.
        self._rng = np.random.default_rng(None if seed in (LLAMA_DEFAULT_SEED, -1) else seed)
        if verbose:
            m = self._llm.model
            print(f"pydecode: loaded {m.path.name} ({m.config.arch}, {m.n_threads} threads, {m.isa}, "
                  f"context {m.n_ctx})", file=sys.stderr)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str, **kwargs) -> "Llama":
        """A GGUF of a Hugging Face repository (huggingface_hub's cache, downloading when online)."""
        return cls(f"hf://{repo_id}/{filename}", **kwargs)

    # ---- tokens ----

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """UTF-8 bytes -> token ids (BOS first when add_bos and the model wants one)."""
        if not isinstance(text, (bytes, bytearray)):
            raise TypeError(f"tokenize takes UTF-8 bytes, got {type(text).__name__}")
        return self._llm.tokenizer.encode(bytes(text).decode("utf-8", "replace"), add_special=add_bos,
                                          parse_special=special)

    def detokenize(self, tokens: list[int], prev_tokens: list[int] | None = None, special: bool = False) -> bytes:
        """Token ids -> their bytes (special tokens' text only when special)."""
        tok = self._llm.tokenizer
        return b"".join(tok.piece_bytes(int(t), skip_special=not special) for t in tokens)

    def n_ctx(self) -> int:
        return self._llm.n_ctx

    def n_vocab(self) -> int:
        return self._llm.model.n_vocab

    def token_bos(self) -> int:
        return -1 if self._llm.tokenizer.bos_id is None else self._llm.tokenizer.bos_id

    def token_eos(self) -> int:
        return -1 if self._llm.tokenizer.eos_id is None else self._llm.tokenizer.eos_id

    def reset(self) -> None:
        """Kept for compatibility: the KV cache is reused by prefix on its own."""

    def close(self) -> None:
        self._llm.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- completions ----

    def _sampling(self, temperature, top_p, top_k, min_p, repeat_penalty, frequency_penalty, presence_penalty,
                  seed) -> dict:
        if seed is None:
            seed = int(self._rng.integers(0, 2**63))
        # llama.cpp's top-p keeps tokens until their mass reaches p, at least one: p <= 0 keeps only
        # the most likely token (greedy), p >= 1 keeps all.
        if top_p <= 0:
            temperature = 0.0
        return dict(temperature=max(0.0, float(temperature)), top_p=min(1.0, float(top_p)) if top_p > 0 else 1.0,
                    top_k=max(0, int(top_k)), min_p=float(min_p), repeat_penalty=float(repeat_penalty),
                    frequency_penalty=float(frequency_penalty), presence_penalty=float(presence_penalty),
                    repeat_last_n=self._repeat_last_n, seed=seed)

    def _max_tokens(self, max_tokens, n_prompt: int) -> int:
        room = max(1, self._llm.n_ctx - n_prompt)
        return room if max_tokens is None or max_tokens <= 0 else int(max_tokens)

    def create_completion(self, prompt: str | list[int], suffix: str | None = None, max_tokens: int | None = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05,
                          typical_p: float = 1.0, logprobs: int | None = None, echo: bool = False,
                          stop: str | list[str] | None = None, frequency_penalty: float = 0.0,
                          presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                          stream: bool = False, seed: int | None = None, tfs_z: float = 1.0,
                          mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                          model: str | None = None, stopping_criteria=None, logits_processor=None,
                          grammar=None, logit_bias=None) -> dict | Iterator[dict]:
        """An OpenAI text completion of `prompt` (text or token ids), as llama-cpp-python makes it."""
        _refuse_unless_default("create_completion", dict(
            typical_p=typical_p, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
            logits_processor=logits_processor, stopping_criteria=stopping_criteria), _SAMPLING_OFF)
        if suffix is not None:
            raise NotImplementedError("create_completion: suffix (fill-in-the-middle) is not supported by pydecode yet")
        llm = self._llm
        ids = llm.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        kw = self._sampling(temperature, top_p, top_k, min_p, repeat_penalty, frequency_penalty,
                            presence_penalty, seed)
        kw["logit_bias"] = logit_bias or None
        handle = llm.stream(ids, self._max_tokens(max_tokens, len(ids)), stop=_stops(stop),
                            logprobs=logprobs, draft_tokens=self._draft_tokens, grammar=_gbnf(grammar), **kw)
        head = oai.head("text_completion", model or self.model_path)
        prompt_text = prompt if isinstance(prompt, str) else llm.detokenize(ids)
        if stream:
            return self._stream_completion(handle, head, prompt_text if echo else "", logprobs)
        pieces, c = _drain(handle)
        text = (prompt_text if echo else "") + c.text
        lp = oai.completion_logprobs(llm.tokenizer, pieces, logprobs, len(prompt_text) if echo else 0) \
            if logprobs is not None else None
        return {**head, "choices": [{"text": text, "index": 0, "logprobs": lp,
                                     "finish_reason": oai.finish_reason(c.finish_reason)}],
                "usage": oai.usage(len(ids), len(c.tokens))}

    def _stream_completion(self, handle, head, echo_text, logprobs) -> Iterator[dict]:
        try:
            if echo_text:
                yield {**head, "choices": [{"text": echo_text, "index": 0, "logprobs": None, "finish_reason": None}]}
            offset = len(echo_text)
            for p in handle:
                if not p.text:
                    continue
                lp = oai.completion_logprobs(self._llm.tokenizer, [p], logprobs, offset) \
                    if logprobs is not None else None
                offset += len(p.text)
                yield {**head, "choices": [{"text": p.text, "index": 0, "logprobs": lp, "finish_reason": None}]}
            c = handle.completion
            yield {**head, "choices": [{"text": "", "index": 0, "logprobs": None,
                                        "finish_reason": oai.finish_reason(c.finish_reason)}]}
        finally:
            handle.cancel()

    __call__ = create_completion

    # ---- chat ----

    def create_chat_completion(self, messages: list[dict], functions=None, function_call=None, tools=None,
                               tool_choice=None, temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40,
                               min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
                               stop: str | list[str] | None = None, seed: int | None = None,
                               response_format=None, max_tokens: int | None = None,
                               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                               repeat_penalty: float = 1.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
                               mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: str | None = None,
                               logits_processor=None, grammar=None, logit_bias=None, logprobs: bool = False,
                               top_logprobs: int | None = None) -> dict | Iterator[dict]:
        """An OpenAI chat completion of `messages`, rendered with the model's chat template. With
        tools (or the legacy functions), calls are generated under each function's JSON Schema
        (pydecode/chat/tools.py: they always parse) and returned as message.tool_calls."""
        _refuse_unless_default("create_chat_completion", dict(
            typical_p=typical_p, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
            logits_processor=logits_processor), _SAMPLING_OFF)
        if grammar is not None and response_format is not None:
            raise ValueError("create_chat_completion: give grammar or response_format, not both")
        llm = self._llm
        plan, legacy = _tool_plan(llm, tools, tool_choice, functions, function_call)
        if plan is not None and (grammar is not None or response_format is not None):
            raise ValueError("create_chat_completion: tools cannot be combined with grammar or response_format "
                             "(the answer is held to the tool-call syntax; tool_choice='none' for structured text)")
        ids = llm.chat_tokens(plan.messages(messages), tools=plan.tools) if plan else llm.chat_tokens(messages)
        kw = self._sampling(temperature, top_p, top_k, min_p, repeat_penalty, frequency_penalty,
                            presence_penalty, seed)
        kw["logit_bias"] = logit_bias or None
        n_top = (top_logprobs or 0) if logprobs else None
        handle = llm.stream(ids, self._max_tokens(max_tokens, len(ids)), stop=_stops(stop), logprobs=n_top,
                            draft_tokens=self._draft_tokens, response_format=response_format,
                            grammar=plan.grammar if plan else _gbnf(grammar), **kw)
        if stream:
            return self._stream_chat(handle, oai.head("chat.completion.chunk", model or self.model_path), n_top,
                                     plan, legacy)
        pieces, c = _drain(handle)
        msg, finish = {"role": "assistant", "content": c.text}, oai.finish_reason(c.finish_reason)
        if plan is not None:
            answer, calls = plan.parse(c.text)
            if calls:
                msg.update(content=answer or None, tool_calls=calls)
                finish = tool_calls.finish_reason(finish, c, len(calls))
                if legacy:   # the functions API's shape: the (first) call as message.function_call
                    msg["function_call"] = calls[0]["function"]
                    finish = "function_call" if finish == "tool_calls" else finish
        return {**oai.head("chat.completion", model or self.model_path),
                "choices": [{"index": 0, "message": msg,
                             "logprobs": oai.chat_logprobs(llm.tokenizer, pieces, n_top) if n_top is not None else None,
                             "finish_reason": finish}],
                "usage": oai.usage(len(ids), len(c.tokens))}

    def _stream_chat(self, handle, head, n_top, plan=None, legacy=False) -> Iterator[dict]:
        reader = plan.stream() if plan is not None else None

        def chunk(delta, lp=None, finish=None):
            return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}]}

        try:
            yield chunk({"role": "assistant"})
            for p in handle:
                if not p.text:
                    continue
                lp = oai.chat_logprobs(self._llm.tokenizer, [p], n_top) if n_top is not None else None
                if reader is None:
                    yield chunk({"content": p.text}, lp)
                    continue
                ds = reader.feed(p.text)
                for i, d in enumerate(ds):
                    yield chunk(oai.tool_delta(d), lp if i == len(ds) - 1 else None)
            c = handle.completion
            finish = oai.finish_reason(c.finish_reason)
            if reader is not None:
                for d in reader.finish():
                    yield chunk(oai.tool_delta(d))
                finish = tool_calls.finish_reason(finish, c, reader.calls)
                finish = "function_call" if legacy and finish == "tool_calls" else finish
            yield chunk({}, finish=finish)
        finally:
            handle.cancel()


def _tool_plan(llm, tools, tool_choice, functions, function_call):
    """(the ToolPlan of a chat request, whether it came as the legacy functions API): functions
    are tools, function_call ("auto" | "none" | {"name"}) their tool_choice."""
    legacy = bool(functions) and not tools
    if functions and tools:
        raise ValueError("create_chat_completion: give tools or functions (the legacy form), not both")
    if legacy:
        tools = [{"type": "function", "function": f} for f in functions]
        if tool_choice is None and function_call is not None:
            tool_choice = function_call if isinstance(function_call, str) else \
                {"type": "function", "function": {"name": (function_call or {}).get("name")}}
    elif function_call is not None:
        raise ValueError("create_chat_completion: function_call goes with functions; with tools, use tool_choice")
    for t in tools or []:
        if not (isinstance(t, dict) and t.get("type", "function") == "function" and isinstance(t.get("function"), dict)
                and isinstance(t["function"].get("name"), str)):
            raise ValueError(f"create_chat_completion: each tool must be {{'type': 'function', 'function': "
                             f"{{'name': ..., 'parameters': {{...}}}}}}, got {t!r}")
    return tool_calls.plan(llm.tokenizer, llm.template, tools, tool_choice), legacy
