"""`pydecode serve`'s /metrics, in Prometheus' text format (prometheus-client), one registry per
server: requests by route and status, tokens in and out, what the Engine holds now (queue,
active sequences, KV bytes), and latency histograms (time to first token, inter-token latency,
request duration)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST, disable_created_metrics

disable_created_metrics()   # the *_created series say nothing useful here

ROUTES = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/tokenize",
          "/detokenize"}
# Decode steps of a small model take a few ms; a long prompt's first token some seconds.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, state):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("pydecode_requests", "HTTP requests answered, by route and status",
                                ["route", "status"], registry=r)
        self.prompt_tokens = Counter("pydecode_prompt_tokens", "Prompt tokens of finished generations",
                                     registry=r)
        self.cached_tokens = Counter("pydecode_prompt_cached_tokens",
                                     "Prompt tokens whose KV cache was reused, not recomputed", registry=r)
        self.generated_tokens = Counter("pydecode_generated_tokens", "Tokens generated", registry=r)
        self.drafted = Counter("pydecode_draft_tokens", "Tokens a drafter proposed (speculative decoding)",
                               registry=r)
        self.accepted = Counter("pydecode_draft_accepted_tokens", "Of those, the ones the model agreed with",
                                registry=r)
        self.finished = Counter("pydecode_generations", "Generations ended, by finish reason",
                                ["finish_reason"], registry=r)
        self.ttft = Histogram("pydecode_time_to_first_token_seconds",
                              "From a request's arrival to its first token", buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("pydecode_inter_token_latency_seconds",
                             "Between one token of a stream and the next", buckets=ITL_BUCKETS, registry=r)
        self.duration = Histogram("pydecode_request_duration_seconds", "From arrival to the last token",
                                  buckets=TTFT_BUCKETS, registry=r)

        def engine(read):
            def f():
                llm = state.llm
                return 0 if llm is None or llm.closed else read(llm.engine)
            return f

        for name, doc, read in (
                ("pydecode_queue_depth", "Requests waiting for a sequence slot", lambda e: e.n_queued),
                ("pydecode_active_sequences", "Sequences generating now", lambda e: e.n_active),
                ("pydecode_sequence_slots", "Sequences the Engine runs at once", lambda e: e.max_seqs),
                ("pydecode_kv_bytes_in_use", "KV cache bytes the active sequences fill",
                 lambda e: e.kv_bytes_in_use),
                ("pydecode_kv_bytes_reserved", "KV cache bytes allocated", lambda e: e.kv_bytes_reserved)):
            Gauge(name, doc, registry=r).set_function(engine(read))
        Gauge("pydecode_model_ready", "1 once the model has loaded", registry=r).set_function(
            lambda: int(state.llm is not None))

        # llama-server's own series (its clients and dashboards read these names), kept apart:
        # prometheus-client cannot spell a counter "llamacpp:x_total" under the TYPE name
        # llama-server gives it, so they are written by hand (text()).
        self.state = state
        self.ll = dict(prompt=0, cached=0, prompt_s=0.0, predicted=0, predicted_s=0.0, n_tokens_max=0, drafted=0, accepted=0)
        self._last_scrape = dict(prompt=0, prompt_s=0.0, predicted=0, predicted_s=0.0)

    def count_request(self, path: str, status: int) -> None:
        route = path if path in ROUTES else "/v1/models/{id}" if path.startswith("/v1/models/") else "other"
        self.requests.labels(route, str(status)).inc()

    def observe(self, completion) -> None:
        """A generation has ended: its tokens and latencies."""
        s = completion.stats
        ll = self.ll
        ll["prompt"] += s.prompt_tokens - s.cached_tokens
        ll["cached"] += s.cached_tokens
        ll["prompt_s"] += s.prefill_s
        ll["predicted"] += s.generated_tokens
        ll["predicted_s"] += s.decode_s
        ll["drafted"] += s.draft_tokens
        ll["accepted"] += s.accepted_tokens
        ll["n_tokens_max"] = max(ll["n_tokens_max"], s.prompt_tokens + s.generated_tokens)
        self.prompt_tokens.inc(s.prompt_tokens)
        self.cached_tokens.inc(s.cached_tokens)
        self.generated_tokens.inc(s.generated_tokens)
        self.drafted.inc(s.draft_tokens)
        self.accepted.inc(s.accepted_tokens)
        self.finished.labels(completion.finish_reason).inc()
        if s.generated_tokens:
            self.ttft.observe(s.ttft_s)
            self.duration.observe(s.ttft_s + s.decode_s)
        for dt in s.token_latencies_s:
            self.itl.observe(dt)

    def text(self) -> bytes:
        return generate_latest(self.registry) + self.llamacpp()

    def llamacpp(self) -> bytes:
        """llama-server's llamacpp:* series. The two throughput gauges cover the time since the
        last scrape (0 when nothing ran), as llama-server's do."""
        ll, last = self.ll, self._last_scrape
        llm = self.state.llm
        e = llm.engine if llm is not None and not llm.closed else None

        def rate(n, s):
            dn, ds = ll[n] - last[n], ll[s] - last[s]
            return dn / ds if ds > 0 else 0.0

        prompt_rate, predicted_rate = rate("prompt", "prompt_s"), rate("predicted", "predicted_s")
        self._last_scrape = {k: ll[k] for k in last}
        drafted, accepted = ll["drafted"], ll["accepted"]
        series = [
            ("prompt_tokens_total", "counter", "Prompt tokens processed (not counting those taken from the cache)", ll["prompt"]),
            ("prompt_tokens_cached_total", "counter", "Prompt tokens whose KV cache was reused", ll["cached"]),
            ("prompt_seconds_total", "counter", "Prompt processing time", ll["prompt_s"]),
            ("tokens_predicted_total", "counter", "Tokens generated", ll["predicted"]),
            ("tokens_predicted_seconds_total", "counter", "Generation time", ll["predicted_s"]),
            ("n_decode_total", "counter", "Model calls (steps of the batch)", e.n_steps if e else 0),
            ("n_tokens_max", "counter", "Largest number of tokens a sequence held", ll["n_tokens_max"]),
            ("spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed", drafted),
            ("spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted", accepted),
            ("spec_decode_num_drafts_total", "counter", "Draft tokens proposed (one count per token)", drafted),
            ("prompt_tokens_seconds", "gauge", "Prompt throughput since the last scrape, tokens/s", prompt_rate),
            ("predicted_tokens_seconds", "gauge", "Generation throughput since the last scrape, tokens/s", predicted_rate),
            ("requests_processing", "gauge", "Requests generating now", e.n_active if e else 0),
            ("requests_deferred", "gauge", "Requests waiting for a slot", e.n_queued if e else 0),
            ("n_busy_slots_per_decode", "gauge", "Average sequences per model call",
             e.busy_in_steps / e.n_steps if e and e.n_steps else 0.0),
        ]
        out = []
        for name, kind, doc, v in series:
            out += [f"# HELP llamacpp:{name} {doc}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {float(v)!r}"]
        return ("\n".join(out) + "\n").encode()
