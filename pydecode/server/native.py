"""llama-server's own routes on the same Engine: POST /completion (and /completions), /infill,
/apply-template, the token counters, GET/POST /props, /slots with save / restore / erase.

Field names, response shapes and error types are llama-server's (tools/server/README.md of
llama.cpp), so that its clients and its own test suite work unchanged; the generation under them
is the same Engine submission as the OpenAI routes' (app.submit)."""
from __future__ import annotations

import asyncio
import math
import os
import time

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import __version__
from ..chat.templates import TemplateError
from ..kvstate import StateFileError
from ..slots import SlotBusy
from . import params
from .app import _ended, _finished, begin, read_json, submit
from ..chat.fim import fim_ids
from .params import APIError, bad
from .streams import EventStream, failure, sse

# Fields of llama-server's request that change the output and that pydecode does not implement:
# refused unless they hold the value that means "off".
_OFF = {"dynatemp_range": 0.0, "xtc_probability": 0.0, "dry_multiplier": 0.0, "top_n_sigma": -1.0}


# ---------------------------------------------------------------- requests

def prompt_of(llm, p, add_special: bool = True) -> list[int]:
    """One prompt of llama-server's forms: a string, token ids, a mixed list of both (ids as
    they are, strings tokenized; a leading string gets the BOS), or {"prompt_string": ...}
    (with "multimodal_data": refused, this runtime reads text)."""
    if isinstance(p, dict):
        if p.get("multimodal_data"):
            raise bad("prompt", "multimodal_data: this model reads text only (no image or audio input)", "unsupported")
        p = p.get("prompt_string")
        if not isinstance(p, str):
            raise bad("prompt", "prompt_string must be a string")
    if isinstance(p, str):
        return llm.tokenize(p, add_special)
    if isinstance(p, list) and p and all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in p):
        ids: list[int] = []
        for k, x in enumerate(p):
            if isinstance(x, str):
                ids += llm.tokenize(x, add_special and k == 0)
            elif not 0 <= x < llm.model.n_vocab:
                raise bad("prompt", f"token id {x} is outside the vocabulary (0..{llm.model.n_vocab - 1})")
            else:
                ids.append(x)
        return ids
    raise bad("prompt", "must be a string, a list of token ids (and strings), {\"prompt_string\": ...}, "
                        "or a list of those")


def prompts_of(llm, body: dict) -> tuple[list[list[int]], bool]:
    """The request's prompts (token ids each), and whether it gave a list of prompts (then the
    answer is a list)."""
    p = body.get("prompt", body.get("content"))
    if p is None:
        raise bad("prompt", "is required", "missing")
    many = isinstance(p, list) and p and (all(isinstance(x, str) for x in p) or
                                          any(isinstance(x, (list, dict)) for x in p))
    given = p if many else [p]
    return [prompt_of(llm, x) for x in given], bool(many)


def native_generation(state, llm, body: dict, chat: bool = False) -> params.Generation:
    """llama-server's generation fields on top of OpenAI's: n_predict, n_probs, the server's
    default sampling (--temp, --seed, ...) and its --n-predict cap."""
    for k, off in _OFF.items():
        v = body.get(k)
        if v is not None and v != off:
            raise bad(k, f"is not supported by this server (only {off}, off)", "unsupported")
    b = dict(body)
    if "n_predict" in b and "max_tokens" not in b:
        b["max_tokens"] = b.pop("n_predict")
    if isinstance(b.get("max_tokens"), int) and b["max_tokens"] <= 0:
        b["max_tokens"] = None            # -1: until the context is full (the key stays: it was given)
    if not chat and "n_probs" in b:
        b["logprobs"] = b.pop("n_probs") or None
    b.pop("logit_bias", None)
    g = params.generation(b, chat=chat, default_max_tokens=None, defaults=state.settings.sampling)
    if g.max_tokens is None and state.settings.n_predict >= 0 and "max_tokens" not in b:   # --n-predict: the default
        g.max_tokens = state.settings.n_predict or None
    bias = params.resolve_logit_bias(llm, body.get("logit_bias"))
    if g.ignore_eos:
        bias = {**(bias or {}), **{t: -math.inf for t in llm.tokenizer.eog_ids}}
        g.ignore_eos = False       # the bias does it, and shows in generation_settings as llama-server's
    g.sampling["logit_bias"] = bias
    return g


# ---------------------------------------------------------------- answers

def timings(c, progress: tuple[int, int, float] | None = None) -> dict:
    """llama-server's timings of a finished (or, with progress, a prefilling) generation. The
    generation rate is over the decode steps after the first token (that one comes from the
    prompt's last logits)."""
    s = c.stats if c is not None else None
    if progress is not None:
        done, cache, ms = progress
        prompt_n, prompt_ms, n, pred_ms = done - cache, ms, 0, 0.0
        cache_n = cache
    else:
        cache_n, prompt_n = s.cached_tokens, s.prompt_tokens - s.cached_tokens
        prompt_ms, n, pred_ms = s.prefill_s * 1e3, s.generated_tokens, s.decode_s * 1e3
    steps = max(0, n - 1)
    return {"cache_n": cache_n, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n and prompt_ms else 0.0,
            "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_n and prompt_ms else 0.0,
            "predicted_n": n, "predicted_ms": pred_ms,
            "predicted_per_token_ms": pred_ms / steps if steps and pred_ms else 0.0,
            "predicted_per_second": 1e3 / pred_ms * steps if steps and pred_ms else 0.0}


def stop_type(c) -> tuple[str, str]:
    """(stop_type, stopping_word): "eos" (an end-of-generation token), "word" (a stop string),
    "limit" (n_predict or the context), "none" (cancelled)."""
    if c.finish_reason == "stop":
        if c.stop_detail.startswith("stop string "):
            return "word", c.stop_detail[len("stop string "):].strip("'\"")
        return "eos", ""
    return ("limit", "") if c.finish_reason == "length" else ("none", "")


def truncated(c) -> bool:
    """llama-server's "truncated": a context shift dropped tokens, or the full context ended it."""
    return bool(c.stats.shifted) or c.stop_detail.startswith("context full")


def settings_json(state, llm, g: params.Generation | None) -> dict:
    """generation_settings: the sampling a request ran with (or the defaults, for /props)."""
    s = dict(params.generation({}, chat=False, default_max_tokens=None, defaults=state.settings.sampling).sampling)
    n_predict = state.settings.n_predict
    if g is not None:
        s.update(g.sampling)
        n_predict = -1 if g.max_tokens is None else g.max_tokens
    bias = s.pop("logit_bias", None) or {}
    return {"n_predict": n_predict, "seed": -1 if s.get("seed") is None else s["seed"],
            "temperature": s["temperature"], "top_k": s["top_k"], "top_p": s["top_p"], "min_p": s["min_p"],
            "repeat_penalty": s["repeat_penalty"], "repeat_last_n": s["repeat_last_n"],
            "presence_penalty": s["presence_penalty"], "frequency_penalty": s["frequency_penalty"],
            "typical_p": s.get("typical_p", 1.0), "mirostat": s.get("mirostat_mode", 0),
            "mirostat_tau": s.get("mirostat_tau", 5.0), "mirostat_eta": s.get("mirostat_eta", 0.1),
            "xtc_probability": 0.0, "dry_multiplier": 0.0, "adaptive_target": -1.0, "adaptive_decay": 0.9,
            "stop": list(g.stop or []) if g is not None else [], "n_probs": (g.logprobs or 0) if g else 0,
            "ignore_eos": bool(bias) and all(t in bias for t in llm.tokenizer.eog_ids),
            "logit_bias": [{"token": t, "bias": None if v == -math.inf else v} for t, v in bias.items()],
            "n_keep": g.shift.get("n_keep", state.settings.keep) if g is not None else state.settings.keep,
            "n_discard": g.shift.get("n_discard", 0) if g is not None else 0,
            "n_ctx": llm.n_ctx, "model": state.model_id, "stream": bool(g and g.stream),
            "samplers": _samplers(s)}


def _samplers(s: dict) -> list[str]:
    """The chain a request's sampling runs, in order (llama-server's names where it has them)."""
    if s.get("mirostat_mode"):
        return ["penalties", "temperature", "mirostat" if s["mirostat_mode"] == 1 else "mirostat_v2"]
    return (["penalties", "temperature", "top_k"] + (["tfs_z"] if s.get("tfs_z", 1.0) < 1.0 else [])
            + (["typ_p"] if s.get("typical_p", 1.0) < 1.0 else []) + ["top_p", "min_p"])


def probs(tok, pieces, n: int, post: bool) -> list[dict]:
    """completion_probabilities of `pieces`: each token's log-probability (or, post_sampling_probs,
    probability) and its n best alternatives."""
    def entry(t, lp):
        e = {"id": t, "token": tok.decode([t]), "bytes": list(tok.token_bytes(t))}
        lp = 0.0 if lp is None else lp
        if post:
            e["prob"] = math.exp(lp)
        else:
            e["logprob"] = lp
        return e

    out = []
    for p in pieces:
        if p.token < 0:
            continue
        alts = [entry(t, lp) for t, lp in (p.top_logprobs or [])[:n]]
        if post:
            alts = [a for a in alts if a["prob"] > 0.0]
        out.append({**entry(p.token, p.logprob), ("top_probs" if post else "top_logprobs"): alts})
    return out


def final_json(state, llm, h, g, body: dict, pieces, prompt_text: str | None, k: int) -> dict:
    c = h.completion
    kind, word = stop_type(c)
    out = {"index": k, "content": c.text, "tokens": list(c.tokens) if body.get("return_tokens") else [],
           "id_slot": h.slot if h.slot is not None else -1, "stop": True, "model": state.model_id,
           "tokens_predicted": len(c.tokens), "tokens_evaluated": c.stats.prompt_tokens,
           "generation_settings": settings_json(state, llm, g),
           "prompt": prompt_text if prompt_text is not None else llm.detokenize(h.prompt),
           "has_new_line": "\n" in c.text, "truncated": truncated(c),
           "stop_type": kind, "stopping_word": word, "tokens_cached": c.stats.prompt_tokens + len(c.tokens),
           "timings": timings(c)}
    if g.logprobs is not None:
        out["completion_probabilities"] = probs(llm.tokenizer, pieces, g.logprobs,
                                                bool(body.get("post_sampling_probs")))
    fields = body.get("response_fields")
    if isinstance(fields, list) and fields:
        picked = {}
        for f in fields:
            v = out
            for part in str(f).split("/"):
                v = v.get(part) if isinstance(v, dict) else None
            if v is not None:
                picked[f] = v
        return picked
    return out


# ---------------------------------------------------------------- /completion

class Progress:
    """The prompt_progress events of one request (return_progress), from the stepping thread to
    the stream on the event loop."""

    def __init__(self, wake):
        self.events: list[tuple[int, int, float]] = []
        self.wake, self.t0, self.cache = wake, time.perf_counter(), None

    def first(self, cache: int, total: int) -> None:
        self.cache = cache
        self.events.insert(0, (cache, total, 0.0))   # (before any chunk's event that came already)

    def __call__(self, done: int, total: int) -> None:   # Engine's on_prefill
        self.events.append((done, total, (time.perf_counter() - self.t0) * 1e3))
        self.wake()


async def completion(request: Request) -> Response:
    """POST /completion (and /completions): llama-server's native completion."""
    state, llm, body = await begin(request)
    g = native_generation(state, llm, body)
    ids, many = await run_in_threadpool(prompts_of, llm, body)
    return await run_native(request, state, llm, body, g, ids, many)


async def run_native(request, state, llm, body, g, ids, many: bool, prompt_texts=None) -> Response:
    slot = params._int(body, "id_slot", -1, lo=-1, hi=llm.engine.model.n_seq - 1)
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()

    def wake():
        loop.call_soon_threadsafe(ready.set)

    progress = Progress(wake) if body.get("return_progress") and g.stream else None
    extra = {"slot": None if slot < 0 else slot}
    if progress is not None:
        extra["on_prefill"] = progress
    handles = await submit(state, llm, ids, g, "prompt", extra)
    if not g.stream:
        pieces = await _finished(state, request, handles)
        outs = [final_json(state, llm, h, g, body, ps, None if prompt_texts is None else prompt_texts[k // g.n], k)
                for k, (h, ps) in enumerate(zip(handles, pieces))]
        return JSONResponse(outs if many or len(outs) > 1 else outs[0])

    per_token = bool(body.get("timings_per_token"))

    async def stream():
        for h in handles:
            h.set_waker(wake)
        sent_first = False
        waiting = list(range(len(handles)))
        while waiting:
            ready.clear()
            if progress is not None:
                if not sent_first:
                    sent_first = True
                    h0 = handles[0]
                    cache = h0._s.policy.stats.cached_tokens if h0._s.slot is not None else 0
                    progress.first(cache, len(h0.prompt))
                while progress.events:
                    done, total, ms = progress.events.pop(0)
                    cache = progress.cache or 0
                    yield sse({"index": 0, "content": "", "tokens": [], "stop": False,
                               "prompt_progress": {"total": total, "cache": cache, "processed": done, "time_ms": ms},
                               "timings": timings(None, (done, cache, ms))})
            for k in list(waiting):
                h = handles[k]
                got, done = h.take()
                real = [p for p in got if p.token >= 0 or p.text]
                if real:
                    text = "".join(p.text for p in real)
                    chunk = {"index": k, "content": text, "tokens": [p.token for p in real if p.token >= 0],
                             "stop": False, "id_slot": h.slot if h.slot is not None else -1,
                             "tokens_predicted": len(h.tokens), "tokens_evaluated": len(h.prompt)}
                    if g.logprobs is not None:
                        chunk["completion_probabilities"] = probs(llm.tokenizer, real, g.logprobs,
                                                                  bool(body.get("post_sampling_probs")))
                    if per_token:
                        chunk["timings"] = timings(None, (len(h.prompt), 0, 0.0)) if h.completion is None \
                            else timings(h.completion)
                    if not chunk["tokens"] and not text:
                        continue
                    yield sse(chunk)
                if done:
                    waiting.remove(k)
                    err = failure(h)
                    if err is not None:
                        yield sse(err.body())
                        continue
                    last = final_json(state, llm, h, g, body, [], None, k)
                    last.update(content="", tokens=[])
                    yield sse(last)
            if waiting:
                await ready.wait()

    return EventStream(stream(), on_close=lambda: _ended(state, handles))


# ---------------------------------------------------------------- /infill

def infill_prompt(llm, body: dict) -> list[int]:
    """llama-server's /infill prompt: [the extra files, each after <file_sep> / <repo_name>]
    <fim_prefix> input_prefix + prompt <fim_suffix> input_suffix <fim_middle> (PSM order, as
    Qwen2.5-Coder, StarCoder and CodeLlama were trained)."""
    fim = fim_ids(llm)
    if not {"pre", "suf", "mid"} <= fim.keys():
        raise APIError(501, "this model's vocabulary has no fill-in-the-middle tokens (<fim_prefix>, <fim_suffix>, "
                            "<fim_middle>): /infill needs a code model trained for it", code="not_supported",
                       type="not_supported_error")
    pre, suf = params.text_field(body, "input_prefix"), params.text_field(body, "input_suffix")
    extra = body.get("input_extra") or []
    if not isinstance(extra, list) or not all(isinstance(x, dict) and isinstance(x.get("text", ""), str)
                                              for x in extra):
        raise bad("input_extra", "must be a list of {\"filename\", \"text\"} objects")
    tok = llm.tokenizer
    ids = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    if extra and "sep" in fim:
        if "rep" in fim:
            ids += [fim["rep"]] + llm.tokenize("myproject\n", False, False)
        for x in extra:
            ids += [fim["sep"]] + llm.tokenize(f"{x.get('filename', 'tmp')}\n{x.get('text', '')}", False, False)
        ids += [fim["sep"]] + llm.tokenize("filename\n", False, False)
    prompt = body.get("prompt") or ""
    if not isinstance(prompt, str):
        raise bad("prompt", "must be a string (the text after input_prefix, up to the cursor)")
    ids += [fim["pre"]] + llm.tokenize(pre + prompt, False, False)
    ids += [fim["suf"]] + llm.tokenize(suf, False, False) + [fim["mid"]]
    return ids


async def infill(request: Request) -> Response:
    state, llm, body = await begin(request)
    g = native_generation(state, llm, body)
    ids = await run_in_threadpool(infill_prompt, llm, body)
    return await run_native(request, state, llm, body, g, [ids], False)


# ---------------------------------------------------------------- templates and token counts

async def apply_template(request: Request) -> Response:
    """POST /apply-template: the prompt text the chat template makes of the messages."""
    state = request.app.state.pd
    llm = state.model()
    body = await read_json(request, state.max_body)
    from .chat_route import template_args
    msgs, kwargs, prefill = template_args(state, body)
    add = params.flag(body, "add_generation_prompt", True)
    try:
        text = await run_in_threadpool(lambda: llm.chat_prompt(msgs, add_generation_prompt=add, **kwargs) + prefill)
    except (TemplateError, ValueError) as e:
        raise APIError(400, f"messages: {e}", param="messages", code="invalid_messages") from None
    return JSONResponse({"prompt": text})


async def count_chat_tokens(request: Request) -> Response:
    """POST /chat/completions/input_tokens: how many tokens the prompt of these messages is."""
    state = request.app.state.pd
    llm = state.model()
    body = await read_json(request, state.max_body)
    from .chat_route import prompt_of, template_args
    msgs, kwargs, prefill = template_args(state, body)
    try:
        ids = (await run_in_threadpool(prompt_of, llm, msgs, kwargs, prefill))[0]
    except (TemplateError, ValueError) as e:
        raise APIError(400, f"messages: {e}", param="messages", code="invalid_messages") from None
    return JSONResponse({"input_tokens": len(ids)})


# ---------------------------------------------------------------- /props and /slots

async def props(request: Request) -> Response:
    state = request.app.state.pd
    if request.method == "POST":
        if not state.settings.props_writable:
            raise APIError(403, "POST /props is off: start the server with --props", code="forbidden",
                           type="permission_error")
        body = await read_json(request, state.max_body)
        new = params.generation(body, chat=False, default_max_tokens=None, defaults=state.settings.sampling).sampling
        given = set(body) | ({"mirostat_mode"} if "mirostat" in body else set())   # (llama-server's name)
        state.settings.sampling = {k: v for k, v in new.items() if k in given or k in state.settings.sampling}
        return JSONResponse({"success": True})
    llm = state.llm if state.status == "ok" else None
    out = {"model_path": state.settings.model_path, "model_alias": state.model_id,
           "total_slots": llm.engine.max_seqs if llm else 0, "is_sleeping": state.check_sleep(),
           "modalities": {"vision": False, "audio": False}, "build_info": f"pydecode-{__version__}",
           "webui": False}
    if llm is not None:
        out["default_generation_settings"] = {"n_ctx": llm.n_ctx, "params": settings_json(state, llm, None)}
        out["chat_template"] = llm.template
        tok = llm.tokenizer
        out["bos_token"] = tok.decode([tok.bos_id]) if tok.bos_id is not None else ""
        out["eos_token"] = tok.decode([tok.eos_id]) if tok.eos_id is not None else ""
    return JSONResponse(out)


def _slot_id(request: Request, llm) -> int:
    raw = request.path_params.get("id", "")
    n = llm.engine.model.n_seq
    if not raw.isdigit() or not 0 <= int(raw) < n:
        raise bad("id_slot", f"must be a slot number in 0..{n - 1}, got {raw!r}")
    return int(raw)


async def slots(request: Request) -> Response:
    """GET /slots: each slot's state (llama-server's fields that mean something here)."""
    state = request.app.state.pd
    if not state.settings.slots:
        raise APIError(501, "the slots endpoint is off (--no-slots)", code="not_supported", type="not_supported_error")
    if state.status == "ok" and state.sleeping and state.llm is None:   # asleep: every slot empty
        n_seq, n_ctx = state.shape
        return JSONResponse([{"id": i, "n_ctx": n_ctx, "is_processing": False, "n_cached": 0,
                              "next_token": [{"has_next_token": False, "n_remain": -1, "n_decoded": 0}]}
                             for i in range(n_seq)])
    llm = state.model()
    ledger, out = llm.engine.model.slots, []
    active = {s.slot: s for s in list(llm.engine._active)}
    for i in range(llm.engine.model.n_seq):
        s = active.get(i)
        busy = s is not None or ledger.is_leased(i)
        remain = -1 if s is None else max(0, s.policy.max_tokens - len(s.policy.tokens))
        out.append({"id": i, "n_ctx": llm.n_ctx, "is_processing": busy, "n_cached": len(ledger.held(i)),
                    "next_token": [{"has_next_token": busy, "n_remain": remain,
                                    "n_decoded": 0 if s is None else len(s.policy.tokens)}]})
    return JSONResponse(out)


async def slot_action(request: Request) -> Response:
    """POST /slots/{id}?action=save|restore|erase: a slot's cache to and from a file under
    --slot-save-path (pydecode's state file, with its checks), or forgotten."""
    state = request.app.state.pd
    llm = state.model()
    slot = _slot_id(request, llm)
    action = request.query_params.get("action")
    body = await read_json(request, state.max_body) if action in ("save", "restore") else {}
    try:
        if action == "erase":
            n = llm.engine.model.slots.erase(slot)
            return JSONResponse({"id_slot": slot, "n_erased": n})
        if action not in ("save", "restore"):
            raise bad("action", f"must be save, restore or erase, got {action!r}")
        name = body.get("filename")
        path = state.settings.slot_file(name)
        t0 = time.perf_counter()
        if action == "save":
            n = await run_in_threadpool(llm.save_state, path, slot, 60.0)
            return JSONResponse({"id_slot": slot, "filename": name, "n_saved": n, "n_written": os.path.getsize(path),
                                 "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}})
        if not os.path.exists(path):
            raise APIError(404, f"no slot file {name!r} in --slot-save-path", code="not_found")
        toks = await run_in_threadpool(llm.load_state, path, slot, 60.0)
        return JSONResponse({"id_slot": slot, "filename": name, "n_restored": len(toks),
                             "n_read": os.path.getsize(path), "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}})
    except PermissionError as e:
        raise APIError(501, str(e), code="not_supported", type="not_supported_error") from None
    except StateFileError as e:
        raise APIError(400, f"{body.get('filename')}: {e}", code="invalid_state_file") from None
    except (SlotBusy, TimeoutError) as e:
        raise APIError(409, str(e), code="slot_busy") from None
    except RuntimeError as e:
        raise APIError(400, str(e), code="slot_empty") from None
    except ValueError as e:
        raise bad("filename", str(e))


def routes():
    from starlette.routing import Route
    return [
        Route("/completion", completion, methods=["POST"]),
        Route("/completions", completion, methods=["POST"]),
        Route("/infill", infill, methods=["POST"]),
        Route("/apply-template", apply_template, methods=["POST"]),
        Route("/chat/completions/input_tokens", count_chat_tokens, methods=["POST"]),
        Route("/v1/chat/completions/input_tokens", count_chat_tokens, methods=["POST"]),
        Route("/props", props, methods=["GET", "POST"]),
        Route("/slots", slots, methods=["GET"]),
        Route("/slots/{id}", slot_action, methods=["POST"]),
    ]
