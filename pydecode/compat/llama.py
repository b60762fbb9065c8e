"""llama-cpp-python's `Llama`, on pydecode: code written for `from llama_cpp import Llama` runs
with `from pydecode import Llama` (or, unchanged, after pydecode.compat.install()).

`create_completion` (also `llm(prompt, ...)`), `create_chat_completion`, `embed` /
`create_embedding` return llama-cpp-python's OpenAI-shaped dicts (or, with stream=True, iterators
of its chunks); eval / sample / generate / save_state / load_state are its token-level API
(compat/tokens.py). Defaults are llama-cpp-python's: a completion samples at temperature 0.8
(top-k 40, top-p 0.95, min-p 0.05) for 16 tokens, a chat completion at 0.2 until the model ends
its turn. Every parameter of its signatures is honoured, or has nothing to do on this runtime
(NO_EFFECT, each with the reason), or is refused by name when given a value other than its
default (REFUSED): none is taken and ignored (tests/test_llama_compat.py walks the signatures).
Differs on purpose: pydecode honours n_ctx exactly; logprobs need no logits_all."""
from __future__ import annotations

import sys
import warnings
from typing import Iterator

import numpy as np

from .. import openai_format as oai
from ..chat import tools as tool_calls
from ..chat.fim import fim_prompt
from ..chat.reasoning import opens_reasoning
from ..llm import LLM, load
from .llama_cache import LlamaState, longest_token_prefix
from .llama_grammar import structure_of
from .llama_speculative import LlamaPromptLookupDecoding
from .tokens import TokenContext, sampling_params

LLAMA_DEFAULT_SEED = 0xFFFFFFFF

# Constructor arguments that only steer llama.cpp's GPU offload, memory mapping, NUMA placement,
# batch splitting or timing output: accepted, nothing to do here.
NO_EFFECT = {
    "n_gpu_layers": "no GPU: every layer runs on the CPU", "split_mode": "no GPUs to split over",
    "main_gpu": "no GPU", "tensor_split": "no GPUs to split over", "use_mmap": "weights are always memory-mapped",
    "use_mlock": "pages stay mapped from the file; nothing is locked", "n_batch": "prefill chunks are sized by "
    "measured speed", "n_ubatch": "prefill chunks are sized by measured speed", "n_threads_batch": "prefill and "
    "decode share one thread pool (n_threads)", "offload_kqv": "no GPU", "flash_attn": "attention is always one "
    "fused pass", "op_offload": "no GPU", "swa_full": "sliding-window layers keep a ring of the window (their "
    "results are the same)", "no_perf": "timings are always kept (Stats)", "numa": "threads are placed by the OS",
}
# Arguments that would change the model's arithmetic or its text, not implemented: their
# defaults (llama-cpp-python's) are accepted, any other value is refused by name.
REFUSED = {
    "kv_overrides": None, "rope_scaling_type": -1, "rope_freq_base": 0.0, "rope_freq_scale": 0.0,
    "yarn_ext_factor": -1.0, "yarn_attn_factor": 1.0, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0,
    "yarn_orig_ctx": 0, "lora_base": None, "lora_scale": 1.0, "lora_path": None, "chat_handler": None,
    "tokenizer": None,
}
# Keyword arguments of older llama-cpp-python versions (its **kwargs took them): accepted with a
# DeprecationWarning saying what became of them. f16_kv=False is honoured (an f32 KV cache).
LEGACY = {"f16_kv": "use type_k / type_v", "n_parts": "a GGUF file is one part", "low_vram": "no GPU",
          "mul_mat_q": "no GPU", "n_gqa": "read from the GGUF metadata", "rms_norm_eps": "read from the GGUF "
          "metadata", "rpc_servers": "no remote backends", "lora_threads": "no LoRA", "embedding_only": "use embedding"}
# ggml type ids llama-cpp-python takes for type_k / type_v -> pydecode's kv_type
_GGML_KV = {0: "f32", 1: "f16", 8: "q8_0"}
# llama.cpp's pooling enum (Llama(pooling_type=...), the GGUF's {arch}.pooling_type)
_POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last"}


def _refuse_unless_default(where: str, given: dict, defaults: dict) -> None:
    for name, default in defaults.items():
        if name in given and given[name] != default and not (given[name] is None and default is None):
            raise NotImplementedError(f"{where}: {name}={given[name]!r} is not supported by pydecode "
                                      f"(only its default, {default!r}, is accepted; nothing is ignored)")


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


class _Context:
    """Stands where llama-cpp-python keeps its llama.cpp context (`llm._ctx.ctx`: None once closed)."""

    def __init__(self, owner):
        self.ctx = owner


class LlamaTokenizer:
    """llama-cpp-python's Llama.tokenizer(): bytes or text in, ids out, and back."""

    def __init__(self, llama: "Llama"):
        self._llama = llama

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return self._llama.tokenize(text, add_bos, special)

    def detokenize(self, tokens, prev_tokens=None, special: bool = False) -> bytes:
        return self._llama.detokenize(tokens, prev_tokens, special)

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenize(text.encode("utf-8", "ignore"), add_bos=add_bos, special=special)

    def decode(self, tokens) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")


class Llama(TokenContext):
    """A GGUF model with llama-cpp-python's interface (see the module docstring)."""

    def __init__(self, model_path: str, *, n_gpu_layers: int = 0, split_mode: int = 1, main_gpu: int = 0,
                 tensor_split=None, vocab_only: bool = False, use_mmap: bool = True, use_mlock: bool = False,
                 kv_overrides=None, seed: int = LLAMA_DEFAULT_SEED, n_ctx: int = 512, n_batch: int = 512,
                 n_ubatch: int = 512, n_threads: int | None = None, n_threads_batch: int | None = None,
                 rope_scaling_type: int | None = -1, pooling_type: int = -1, attention_type: int = -1,
                 rope_freq_base: float = 0.0, rope_freq_scale: float = 0.0, yarn_ext_factor: float = -1.0,
                 yarn_attn_factor: float = 1.0, yarn_beta_fast: float = 32.0, yarn_beta_slow: float = 1.0,
                 yarn_orig_ctx: int = 0, logits_all: bool = False, embedding: bool = False, offload_kqv: bool = True,
                 flash_attn: bool = False, op_offload: bool | None = None, swa_full: bool | None = None,
                 no_perf: bool = False, last_n_tokens_size: int = 64, lora_base: str | None = None,
                 lora_scale: float = 1.0, lora_path: str | None = None, numa: bool | int = False,
                 chat_format: str | None = None, chat_handler=None, draft_model=None, tokenizer=None,
                 type_k: int | None = None, type_v: int | None = None, spm_infill: bool = False,
                 verbose: bool = True, **kwargs):
        given = dict(locals())
        unknown = set(kwargs) - set(LEGACY)
        if unknown:
            raise TypeError(f"Llama() got unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        for name in kwargs:
            warnings.warn(f"Llama({name}=...) is an argument of older llama-cpp-python versions: {LEGACY[name]}"
                          + (" (honoured: an f32 KV cache)" if name == "f16_kv" and kwargs[name] is False
                             and type_k is None and type_v is None else " (it has no effect)"),
                          DeprecationWarning, stacklevel=2)
        _refuse_unless_default("Llama()", given, REFUSED)
        if attention_type not in (-1, 0):   # llama.cpp: -1 unspecified, 0 causal, 1 non-causal
            raise NotImplementedError(f"Llama(): attention_type={attention_type!r}: only causal attention (-1, 0) "
                                      f"is supported by pydecode")
        if pooling_type not in (-1, *_POOLING):
            raise NotImplementedError(f"Llama(): pooling_type={pooling_type!r}: pydecode pools with -1 (the "
                                      f"GGUF's), {', '.join(f'{k} ({v})' for k, v in _POOLING.items())}")
        if kwargs.get("f16_kv") is False and type_k is None and type_v is None:
            type_k = type_v = 0
        kv = {_GGML_KV.get(t, t) for t in (type_k, type_v) if t is not None}
        if len(kv) > 1 or not kv <= set(_GGML_KV.values()):
            raise NotImplementedError(f"Llama(): type_k={type_k!r}, type_v={type_v!r}: the K and V cache types must "
                                      f"be the same, one of {sorted(_GGML_KV.items())} (ggml type ids)")
        if not isinstance(last_n_tokens_size, int) or last_n_tokens_size < 0:
            raise ValueError(f"last_n_tokens_size must be an integer >= 0, got {last_n_tokens_size!r}")
        if draft_model is not None and not isinstance(draft_model, LlamaPromptLookupDecoding):
            raise TypeError(f"draft_model must be a LlamaPromptLookupDecoding (pydecode's prompt lookup), "
                            f"got {type(draft_model).__name__}")
        self.model_path, self.verbose, self.last_n_tokens_size = str(model_path), verbose, last_n_tokens_size
        self._logits_all, self._embedding, self._spm_infill = bool(logits_all), bool(embedding), bool(spm_infill)
        self._pooling = _POOLING.get(pooling_type)
        self._seed = seed
        self.cache = None
        self._is_recurrent = self._is_hybrid = False   # (no recurrent architectures yet)
        self._ctx = _Context(self)
        self.chat_format = chat_format
        if vocab_only:   # the vocabulary alone: tokenize / detokenize, no weights read
            from ..gguf_file import GGUFFile
            from ..tokenizer import Tokenizer
            self._llm = None
            self._tok = Tokenizer.from_metadata(GGUFFile(model_path).metadata)
            self._n_ctx_arg = n_ctx
            self.metadata = {}
            return
        self._llm: LLM = load(model_path, n_ctx=None if n_ctx == 0 else n_ctx, n_threads=n_threads,
                              kv_type=kv.pop() if kv else "f16", draft="lookup" if draft_model is not None else None)
        self._tok = self._llm.tokenizer
        from ..speculative import MAX_DRAFT
        self._draft_tokens = None if draft_model is None else min(draft_model.num_pred_tokens, MAX_DRAFT)
        self.metadata = {k: str(v) for k, v in self._llm.model.gguf.metadata.items() if not isinstance(v, list)}
        if chat_format is not None:   # a named format replaces the model's own template
            from ..chat.named_templates import ALIASES, NAMED, names
            if chat_format.strip().lower() not in NAMED and chat_format.strip().lower() not in ALIASES:
                self._llm.close()
                raise ValueError(f"chat_format={chat_format!r} is not a chat format pydecode has; it has: "
                                 f"{', '.join(names())} (or leave it out: the model's own template)")
            self._llm.chat_template = chat_format
        self._init_context()
        if verbose:
            m = self._llm.model
            print(f"pydecode: loaded {m.path.name} ({m.config.arch}, {m.n_threads} threads, {m.isa}, "
                  f"context {m.n_ctx})", file=sys.stderr)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str, additional_files=None, local_dir=None,
                        local_dir_use_symlinks="auto", cache_dir=None, **kwargs) -> "Llama":
        """A GGUF of a Hugging Face repository (huggingface_hub's cache, downloading when online).
        local_dir_use_symlinks is accepted for old callers: huggingface_hub itself ignores it now."""
        _refuse_unless_default("Llama.from_pretrained", dict(additional_files=additional_files, local_dir=local_dir,
                                                             cache_dir=cache_dir),
                               dict(additional_files=None, local_dir=None, cache_dir=None))
        return cls(f"hf://{repo_id}/{filename}", **kwargs)

    def _require_model(self, what: str) -> None:
        if self._llm is None:
            raise RuntimeError(f"{what}: this Llama was loaded with vocab_only=True (the vocabulary alone)")
        if self._ctx.ctx is None:
            from ..errors import ModelClosedError
            raise ModelClosedError(f"{what}: the Llama is closed")

    # ---- tokens and the model's facts ----

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """UTF-8 bytes -> token ids (BOS first when add_bos and the model wants one)."""
        if not isinstance(text, (bytes, bytearray)):
            raise TypeError(f"tokenize takes UTF-8 bytes, got {type(text).__name__}")
        return self._tok.encode(bytes(text).decode("utf-8", "replace"), add_special=add_bos, parse_special=special)

    def detokenize(self, tokens: list[int], prev_tokens: list[int] | None = None, special: bool = False) -> bytes:
        """Token ids -> their bytes (special tokens' text only when special). As llama-cpp-python,
        the space a SentencePiece vocabulary puts before the first word is dropped after a
        leading BOS; prev_tokens: the tokens before these, so that the bytes are what these
        tokens add to theirs (what a stream shows)."""
        def text(ids) -> bytes:
            out = b"".join(self._tok.piece_bytes(int(t), skip_special=not special) for t in ids)
            return out[1:] if ids and int(ids[0]) == self.token_bos() and out[:1] == b" " else out

        tokens = list(tokens)
        if prev_tokens:
            before, both = text(list(prev_tokens)), text(list(prev_tokens) + tokens)
            if both.startswith(before):
                return both[len(before):]
        return text(tokens)

    def tokenizer(self) -> LlamaTokenizer:
        return LlamaTokenizer(self)

    def n_ctx(self) -> int:
        return self._n_ctx_arg if self._llm is None else self._llm.n_ctx

    def n_vocab(self) -> int:
        return self._tok.vocab_size

    def n_embd(self) -> int:
        self._require_model("n_embd")
        return self._llm.model.config.n_embd

    def token_bos(self) -> int:
        return -1 if self._tok.bos_id is None else self._tok.bos_id

    def token_eos(self) -> int:
        return -1 if self._tok.eos_id is None else self._tok.eos_id

    def token_nl(self) -> int:
        """The newline's token id (-1 when "\\n" is not one token)."""
        ids = self._tok.encode("\n", add_special=False, parse_special=False)
        return ids[0] if len(ids) == 1 else -1

    def pooling_type(self) -> int:
        """llama.cpp's pooling enum of embed(): Llama(pooling_type=...), else the GGUF's."""
        name = self._pooling or (self._llm.pooling if self._llm is not None else "none")
        return {v: k for k, v in _POOLING.items()}.get(name, 0)

    @staticmethod
    def logits_to_logprobs(logits, axis: int = -1) -> np.ndarray:
        x = np.asarray(logits, dtype=np.single)
        m = np.max(x, axis=axis, keepdims=True)
        return x - m - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))

    @staticmethod
    def longest_token_prefix(a, b) -> int:
        return longest_token_prefix(a, b)

    @property
    def ctx(self):
        raise NotImplementedError("Llama.ctx is llama.cpp's C context; pydecode has no llama.cpp C API "
                                  "(use eval / sample / generate, or pydecode.load for pydecode's own)")

    model = ctx

    def set_cache(self, cache) -> None:
        """A LlamaRAMCache / LlamaDiskCache (or None): completions save their state into it and
        start from the cached state sharing the longest prefix with their prompt."""
        self.cache = cache

    def close(self) -> None:
        if self._llm is not None:
            self._llm.close()
        self._ctx.ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- completions ----

    def _sampling(self, temperature, top_p, top_k, min_p, typical_p, tfs_z, mirostat_mode, mirostat_tau,
                  mirostat_eta, repeat_penalty, frequency_penalty, presence_penalty, seed) -> dict:
        return sampling_params(temperature, top_k, top_p, min_p, typical_p, tfs_z, mirostat_mode, mirostat_tau,
                               mirostat_eta, repeat_penalty, frequency_penalty, presence_penalty,
                               self.last_n_tokens_size, self._next_seed(seed))

    def _max_tokens(self, max_tokens, n_prompt: int) -> int:
        room = max(1, self._llm.n_ctx - n_prompt)
        return room if max_tokens is None or max_tokens <= 0 else int(max_tokens)

    def _from_cache(self, ids: list[int]) -> None:
        """llama-cpp-python's prompt cache: a cached state sharing more of the prompt than the
        context does is loaded first."""
        if self.cache is None:
            return
        try:
            item = self.cache[ids]
        except KeyError:
            return
        if longest_token_prefix(item.input_ids[:item.n_tokens].tolist(), ids) > \
                longest_token_prefix(self._input_ids.tolist(), ids):
            self.load_state(item)

    def _finished(self, handle, ids: list[int]) -> None:
        """After a generation: the context follows its slot; the prompt cache gets the state."""
        self._follow(handle)
        if self.cache is not None and handle.completion is not None:
            self.cache[ids + list(handle.completion.tokens)] = self.save_state()

    def create_completion(self, prompt: str | list[int], suffix: str | None = None, max_tokens: int | None = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05,
                          typical_p: float = 1.0, logprobs: int | None = None, echo: bool = False,
                          stop: str | list[str] | None = [], frequency_penalty: float = 0.0,
                          presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                          stream: bool = False, seed: int | None = None, tfs_z: float = 1.0,
                          mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                          model: str | None = None, stopping_criteria=None, logits_processor=None,
                          grammar=None, logit_bias=None) -> dict | Iterator[dict]:
        """An OpenAI text completion of `prompt` (text or token ids), as llama-cpp-python makes
        it; with `suffix`, the code between prompt and suffix (fill-in-the-middle, for models whose
        vocabulary has FIM tokens; spm_infill picks the suffix-first order)."""
        self._require_model("create_completion")
        llm = self._llm
        if suffix is not None:
            if not isinstance(prompt, str) or not isinstance(suffix, str):
                raise TypeError("create_completion: with a suffix, prompt and suffix must both be text")
            ids = fim_prompt(llm, prompt, suffix, spm=self._spm_infill)
        else:
            ids = llm.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        self._from_cache(ids)
        kw = self._sampling(temperature, top_p, top_k, min_p, typical_p, tfs_z, mirostat_mode, mirostat_tau,
                            mirostat_eta, repeat_penalty, frequency_penalty, presence_penalty, seed)
        handle = llm.stream(ids, self._max_tokens(max_tokens, len(ids)), stop=_stops(stop), logprobs=logprobs,
                            draft_tokens=self._draft_tokens, logit_bias=logit_bias or None,
                            logits_processor=logits_processor, stopping_criteria=stopping_criteria,
                            **structure_of(grammar), **kw)
        head = oai.head("text_completion", model or self.model_path)
        prompt_text = prompt if isinstance(prompt, str) else llm.detokenize(ids)
        if stream:
            return self._stream_completion(handle, head, prompt_text if echo else "", logprobs, ids)
        pieces, c = _drain(handle)
        self._finished(handle, ids)
        text = (prompt_text if echo else "") + c.text
        lp = oai.completion_logprobs(llm.tokenizer, pieces, logprobs, len(prompt_text) if echo else 0) \
            if logprobs is not None else None
        return {**head, "choices": [{"text": text, "index": 0, "logprobs": lp,
                                     "finish_reason": oai.finish_reason(c.finish_reason)}],
                "usage": oai.usage(len(ids), len(c.tokens))}

    def _stream_completion(self, handle, head, echo_text, logprobs, ids) -> Iterator[dict]:
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
            self._finished(handle, ids)
            yield {**head, "choices": [{"text": "", "index": 0, "logprobs": None,
                                        "finish_reason": oai.finish_reason(c.finish_reason)}]}
        finally:
            handle.cancel()

    __call__ = create_completion

    # ---- chat ----

    def create_chat_completion(self, messages: list[dict], functions=None, function_call=None, tools=None,
                               tool_choice=None, temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40,
                               min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
                               stop: str | list[str] | None = [], seed: int | None = None,
                               response_format=None, max_tokens: int | None = None,
                               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                               repeat_penalty: float = 1.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
                               mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: str | None = None,
                               logits_processor=None, grammar=None, logit_bias=None, logprobs: bool | None = None,
                               top_logprobs: int | None = None) -> dict | Iterator[dict]:
        """An OpenAI chat completion of `messages`, rendered with the model's chat template. With
        tools (or the legacy functions), calls are generated under each function's JSON Schema
        (pydecode/chat/tools.py: they always parse) and returned as message.tool_calls."""
        self._require_model("create_chat_completion")
        if grammar is not None and response_format is not None:
            raise ValueError("create_chat_completion: give grammar or response_format, not both")
        llm = self._llm
        plan, legacy = _tool_plan(llm, tools, tool_choice, functions, function_call)
        if plan is not None and (grammar is not None or response_format is not None):
            raise ValueError("create_chat_completion: tools cannot be combined with grammar or response_format "
                             "(the answer is held to the tool-call syntax; tool_choice='none' for structured text)")
        ids = llm.chat_tokens(plan.messages(messages), tools=plan.tools) if plan else llm.chat_tokens(messages)
        if plan is not None and opens_reasoning(llm.tokenizer.decode(ids), llm.reasoning_format):
            plan.reasoning_first(llm.tokenizer, llm.reasoning_format)   # (Qwen3.5's <think>: it reasons first)
        self._from_cache(ids)
        kw = self._sampling(temperature, top_p, top_k, min_p, typical_p, tfs_z, mirostat_mode, mirostat_tau,
                            mirostat_eta, repeat_penalty, frequency_penalty, presence_penalty, seed)
        n_top = (top_logprobs or 0) if logprobs else None
        structure = {"grammar": plan.grammar} if plan is not None else structure_of(grammar)
        handle = llm.stream(ids, self._max_tokens(max_tokens, len(ids)), stop=_stops(stop), logprobs=n_top,
                            draft_tokens=self._draft_tokens, logit_bias=logit_bias or None,
                            logits_processor=logits_processor, response_format=response_format, **structure, **kw)
        if stream:
            return self._stream_chat(handle, oai.head("chat.completion.chunk", model or self.model_path), n_top,
                                     plan, legacy, ids)
        pieces, c = _drain(handle)
        self._finished(handle, ids)
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

    def _stream_chat(self, handle, head, n_top, plan, legacy, ids) -> Iterator[dict]:
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
            self._finished(handle, ids)
            finish = oai.finish_reason(c.finish_reason)
            if reader is not None:
                for d in reader.finish():
                    yield chunk(oai.tool_delta(d))
                finish = tool_calls.finish_reason(finish, c, reader.calls)
                finish = "function_call" if legacy and finish == "tool_calls" else finish
            yield chunk({}, finish=finish)
        finally:
            handle.cancel()

    def create_chat_completion_openai_v1(self, *args, **kwargs):
        """create_chat_completion's result as the openai package's ChatCompletion (or, streamed,
        ChatCompletionChunk) objects."""
        try:
            from openai.types.chat import ChatCompletion, ChatCompletionChunk
        except ImportError:
            raise ImportError("create_chat_completion_openai_v1 needs the openai package (pip install openai)") \
                from None
        out = self.create_chat_completion(*args, **kwargs)
        if kwargs.get("stream", False):
            return (ChatCompletionChunk(**c) for c in out)
        return ChatCompletion(**out)

    # ---- embeddings ----

    def embed(self, input: str | list[str], normalize: bool = False, truncate: bool = True,
              return_count: bool = False):
        """The embedding of a text (a list: of each), pooled as pooling_type says (the GGUF's by
        default; "none" gives one vector per token); normalize: L2. truncate: a text longer than
        the context is cut to it (else ContextFullError)."""
        self._require_model("embed")
        if not self._embedding:
            raise RuntimeError("Llama model must be created with embedding=True to call this method")
        texts = [input] if isinstance(input, str) else list(input)
        ids = [self._llm.tokenize(t) if isinstance(t, str) else [int(x) for x in t] for t in texts]
        if truncate:
            ids = [x[:self._llm.n_ctx] for x in ids]
        vecs = self._llm.embed(ids, pooling=self._pooling, normalize=normalize)
        out = [v.tolist() for v in vecs]
        result = out[0] if isinstance(input, str) else out
        return (result, sum(len(x) for x in ids)) if return_count else result

    def create_embedding(self, input: str | list[str], model: str | None = None) -> dict:
        """OpenAI's embeddings response for a text or texts."""
        embeds, n = self.embed(input if isinstance(input, list) else [input], return_count=True)
        return {"object": "list", "model": model or self.model_path,
                "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(embeds)],
                "usage": {"prompt_tokens": n, "total_tokens": n}}


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


__all__ = ["Llama", "LlamaState", "LlamaTokenizer", "LLAMA_DEFAULT_SEED", "NO_EFFECT", "REFUSED", "LEGACY"]
