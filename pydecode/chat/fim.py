"""Fill-in-the-middle: the vocabulary's FIM tokens, and the prompt of a code completion between a
prefix and a suffix (what /infill and Llama.create_completion(suffix=...) send)."""
from __future__ import annotations

FIM = {"pre": ("tokenizer.ggml.fim_pre_token_id", ("<|fim_prefix|>", "<fim_prefix>", "<fim-prefix>", "<PRE>", "▁<PRE>")),
       "suf": ("tokenizer.ggml.fim_suf_token_id", ("<|fim_suffix|>", "<fim_suffix>", "<fim-suffix>", "<SUF>", "▁<SUF>")),
       "mid": ("tokenizer.ggml.fim_mid_token_id", ("<|fim_middle|>", "<fim_middle>", "<fim-middle>", "<MID>", "▁<MID>")),
       "sep": ("tokenizer.ggml.fim_sep_token_id", ("<|file_sep|>", "<file_sep>")),
       "rep": ("tokenizer.ggml.fim_rep_token_id", ("<|repo_name|>", "<repo_name>", "<reponame>"))}


def fim_ids(llm) -> dict[str, int]:
    """The vocabulary's fill-in-the-middle tokens (GGUF keys, else the usual spellings)."""
    meta, tok, out = llm.model.gguf.metadata, llm.tokenizer, {}
    for name, (key, texts) in FIM.items():
        t = meta.get(key)
        if t is None:
            for text in texts:
                ids = tok.encode(text, add_special=False, parse_special=True)
                if len(ids) == 1 and tok.is_special(ids[0]):
                    t = ids[0]
                    break
        if t is not None:
            out[name] = int(t)
    return out


def fim_prompt(llm, prefix: str, suffix: str, spm: bool = False) -> list[int]:
    """[bos] <fim_prefix> prefix <fim_suffix> suffix <fim_middle> (PSM order, as Qwen2.5-Coder,
    StarCoder and CodeLlama were trained), or with spm the suffix block first (SPM order,
    llama-cpp-python's spm_infill). ValueError when the vocabulary has no FIM tokens."""
    fim = fim_ids(llm)
    if not {"pre", "suf", "mid"} <= fim.keys():
        raise ValueError("this model's vocabulary has no fill-in-the-middle tokens (<fim_prefix>, <fim_suffix>, "
                         "<fim_middle>): a suffix needs a code model trained for it")
    tok = llm.tokenizer
    ids = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    pre = [fim["pre"]] + llm.tokenize(prefix, False, False)
    suf = [fim["suf"]] + llm.tokenize(suffix, False, False)
    return ids + (suf + pre if spm else pre + suf) + [fim["mid"]]
