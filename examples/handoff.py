"""Disaggregated prefill and decode: one process prefills a prompt and hands its KV cache to
another, which decodes. The text equals one process doing both (tests/test_kvstate.py checks it).

    python examples/handoff.py prefill MODEL "PROMPT" STATE_FILE
    python examples/handoff.py decode  MODEL "PROMPT" STATE_FILE [N_TOKENS]

Each prints one JSON line saying what it computed. The state (tokens + K/V in the cache's own
format, checksummed) can also travel as bytes: LLM.export_state() / LLM.import_state(data).
The decode side computes the prompt's last position again: the state holds K/V, not logits."""
import json
import sys

import pydecode


def main(argv):
    role, model, prompt, state = argv[:4]
    with pydecode.load(model, n_ctx=512, n_threads=2) as llm:
        if role == "prefill":
            c = llm.generate(prompt, max_tokens=1)           # the prompt through the model, once
            saved = llm.save_state(state)
            print(json.dumps({"role": role, "prompt_tokens": c.stats.prompt_tokens,
                              "positions_computed": c.stats.positions_computed, "state_tokens": saved}))
        elif role == "decode":
            restored = llm.load_state(state)
            c = llm.generate(prompt, max_tokens=int(argv[4]) if len(argv) > 4 else 32)
            print(json.dumps({"role": role, "restored_tokens": len(restored), "text": c.text,
                              "tokens": list(c.tokens), "cached_tokens": c.stats.cached_tokens,
                              "positions_computed": c.stats.positions_computed}))
        else:
            raise SystemExit(f"unknown role {role!r}: prefill or decode")


if __name__ == "__main__":
    main(sys.argv[1:])
