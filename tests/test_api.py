"""The README / issue API snippet runs as written, and the public names are documented."""
import inspect

import pydecode


def test_api_snippet_runs_as_written(smollm_path):
    llm = pydecode.load("smollm2-135m", n_threads=None, n_ctx=4096)   # name from the registry, or a path to any .gguf
    out = llm.generate("Once upon a time", max_tokens=64, temperature=0.7, top_p=0.9, seed=1, stop=["\n\n"])
    out.text, out.tokens, out.finish_reason, out.stats        # stats: TTFT, tokens/s, per-token latencies
    assert out.finish_reason in ("stop", "length") and out.tokens and "\n\n" not in out.text
    assert out.stats.ttft_s > 0 and out.stats.decode_tokens_per_s > 0 and out.stats.token_latencies_s
    pieces = []
    for piece in llm.stream("Once upon a time", max_tokens=64):
        print(piece.text, end="", flush=True)
        pieces.append(piece.text)
    assert "".join(pieces)
    reply = llm.chat([{"role": "user", "content": "Name three rivers."}], max_tokens=128)
    assert reply.text.strip()
    ids = llm.tokenize("text")
    assert llm.detokenize(ids) == "text" and isinstance(llm.detokenize([1, 2, 3]), str)


def test_public_names_have_docstrings():
    for name in pydecode.__all__:
        obj = getattr(pydecode, name)
        assert inspect.getdoc(obj), name
    for meth in ("generate", "stream", "chat", "stream_chat", "tokenize", "detokenize", "chat_prompt"):
        assert inspect.getdoc(getattr(pydecode.LLM, meth)), meth


def test_logprobs_in_completion(smollm_path):
    llm = pydecode.load(str(smollm_path), n_ctx=128)
    out = llm.generate("The capital of France is", max_tokens=4, logprobs=3)
    assert len(out.logprobs) == 4
    tok, lp, top = out.logprobs[0]
    assert tok == out.tokens[0] and lp <= 0 and len(top) == 3 and top[0][0] == tok  # greedy: the top one
