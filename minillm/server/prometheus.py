"""``/metrics``: the server's numbers in the Prometheus text format, under vLLM's names.

A Prometheus server (or ``curl``) scrapes ``GET /metrics`` every few seconds; Grafana draws the
series. The names are vLLM V1's with ``minillm:`` for ``vllm:``, so a dashboard built for vLLM
reads minillm too:

  gauges      minillm:num_requests_running, minillm:num_requests_waiting,
              minillm:kv_cache_usage_perc (0-1; vLLM V0 called it gpu_cache_usage_perc)
  counters    minillm:num_preemptions_total, minillm:prompt_tokens_total,
              minillm:generation_tokens_total, minillm:request_success_total{finished_reason},
              minillm:prefix_cache_queries_total, minillm:prefix_cache_hits_total (tokens looked up
              in the prefix cache and found there; the hit rate is their ratio, e.g. over a rate())
  histograms  minillm:time_to_first_token_seconds, minillm:inter_token_latency_seconds (V1's name;
              V0's time_per_output_token_seconds), minillm:e2e_request_latency_seconds,
              minillm:request_queue_time_seconds

Every series carries ``model_name`` as vLLM's do. The latencies come from each request's
``RequestMetrics`` (the engine clock), the very numbers ``minillm.metrics.summarize`` uses offline.
Each app has its own ``CollectorRegistry``, so several servers in one process (tests, a notebook)
keep separate counts.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

PREFIX = "minillm:"

# vLLM's buckets, with finer ones below them: a tiny model on a laptop CPU answers in milliseconds.
TTFT_BUCKETS = [
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
ITL_BUCKETS = [
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
REQUEST_LATENCY_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]


class ServerMetrics:
    """The Prometheus metrics of one server. The engine thread calls ``on_step`` after every step
    and ``on_request_finished`` when a request ends (finished or aborted); ``/metrics`` calls
    ``render``. ``prometheus_client`` metrics are thread-safe."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()  # not the global one: one registry per server
        labels, r = ["model_name"], self.registry

        def gauge(name, doc):
            return Gauge(PREFIX + name, doc, labels, registry=r).labels(model_name)

        def counter(name, doc):
            return Counter(PREFIX + name, doc, labels, registry=r).labels(model_name)  # exposed as NAME_total

        def histogram(name, doc, buckets):
            return Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=r).labels(model_name)

        self.num_requests_running = gauge("num_requests_running", "Requests in the running batch (holding a slot).")
        self.num_requests_waiting = gauge(
            "num_requests_waiting", "Requests waiting to run: never started, or preempted."
        )
        self.kv_cache_usage_perc = gauge(
            "kv_cache_usage_perc",
            "KV cache usage, 0-1: blocks in use (paged engines), "
            "else reserved tokens over the capacity (0 when unlimited).",
        )
        self.num_preemptions = counter("num_preemptions", "Preemptions (a running request put back to wait).")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of requests that got their first token.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        self.prefix_cache_queries = counter("prefix_cache_queries", "Tokens looked up in the prefix cache.")
        self.prefix_cache_hits = counter("prefix_cache_hits", "Tokens found in the prefix cache.")
        self.prefix_cache_seen = {"prefix_cache_queries": 0, "prefix_cache_hits": 0}  # the scheduler's counts so far
        self._success = Counter(
            PREFIX + "request_success", "Finished requests, by finish reason.", labels + ["finished_reason"], registry=r
        )
        self.model_name = model_name
        self.time_to_first_token = histogram("time_to_first_token_seconds", "Arrival to first token.", TTFT_BUCKETS)
        self.inter_token_latency = histogram(
            "inter_token_latency_seconds", "Gap between two tokens of a request.", ITL_BUCKETS
        )
        self.e2e_request_latency = histogram(
            "e2e_request_latency_seconds", "Arrival to last token.", REQUEST_LATENCY_BUCKETS
        )
        self.request_queue_time = histogram(
            "request_queue_time_seconds", "Arrival to first scheduled.", REQUEST_LATENCY_BUCKETS
        )

    def on_step(self, engine, record, delivered) -> None:
        """After a step: the queue and KV gauges, preemptions, and each new token's latency.
        ``record`` is the step's trace row (None when the engine only waited); ``delivered`` the
        step's ``(TokenEvent, Request)`` pairs."""
        self.update_gauges(engine)
        if record is not None and record.preempted_ids:
            self.num_preemptions.inc(len(record.preempted_ids))
        for event, request in delivered:
            m = request.metrics
            self.generation_tokens.inc()
            if event.index == 0:
                self.prompt_tokens.inc(request.num_prompt_tokens)
                self.time_to_first_token.observe(m.ttft)
            elif len(m.token_times) >= 2:
                self.inter_token_latency.observe(m.token_times[-1] - m.token_times[-2])

    def update_gauges(self, engine) -> None:
        """Running and waiting requests (swapped-out ones count as waiting) and KV cache use, now:
        the scheduler's ``stats()``, as ``llm.stats()`` reports them."""
        stats = engine.scheduler.stats()
        self.num_requests_running.set(stats["num_running"])
        self.num_requests_waiting.set(stats["num_waiting"])
        self.kv_cache_usage_perc.set(stats["kv_cache_usage"])
        # The scheduler counts since it was built; the counters move by what is new since the last step.
        for key, counter in (
            ("prefix_cache_queries", self.prefix_cache_queries),
            ("prefix_cache_hits", self.prefix_cache_hits),
        ):
            counter.inc(stats.get(key, 0) - self.prefix_cache_seen[key])
            self.prefix_cache_seen[key] = stats.get(key, 0)

    def on_request_finished(self, request) -> None:
        m = request.metrics
        self._success.labels(self.model_name, request.finish_reason or "abort").inc()
        if m.finished_time is not None:
            self.e2e_request_latency.observe(m.finished_time - m.arrival_time)
        if m.first_scheduled_time is not None:
            self.request_queue_time.observe(m.queue_time)

    def render(self) -> bytes:
        return generate_latest(self.registry)
