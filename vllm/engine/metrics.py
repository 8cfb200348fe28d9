"""Serving metrics: Prometheus collectors under vLLM's names, and the periodic stats log line.

The async engine's loop thread feeds `StatsTracker` after every step (and after aborts);
the tracker turns per-step `RequestOutput`s (always DELTA inside the async engine) and the
scheduler's `SchedulerStats` into Prometheus observations. Each tracker owns its own
`CollectorRegistry`, so several servers can live in one process (tests do that).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

logger = logging.getLogger(__name__)

# Bucket edges as in vLLM, so dashboards built for vLLM read the same.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0]
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
FINISH_REASONS = ("stop", "length", "abort")


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value: token-count histogram edges."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


class PrometheusMetrics:
    """The collectors, registered in a dedicated registry and pre-labelled with the model.

    Counters are declared without the `_total` suffix: prometheus_client appends it, so the
    exposed names are exactly vLLM's (`vllm:prompt_tokens_total`, ...).
    """

    def __init__(self, model_name: str, max_model_len: int,
                 registry: Optional[CollectorRegistry] = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name"]
        reg = self.registry

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, registry=reg).labels(model_name)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=reg).labels(model_name)

        def histogram(name: str, doc: str, buckets: list) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=reg).labels(model_name)

        self.num_requests_running = gauge("vllm:num_requests_running",
                                          "Number of requests in model execution batches.")
        self.num_requests_waiting = gauge("vllm:num_requests_waiting",
                                          "Number of requests waiting to be processed.")
        self.kv_cache_usage = gauge("vllm:kv_cache_usage_perc",
                                    "KV-cache usage. 1 means 100 percent usage.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens",
                                         "Number of generation tokens processed.")
        self.num_preemptions = counter("vllm:num_preemptions",
                                       "Cumulative number of preemptions from the engine.")
        self.prefix_cache_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_cache_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          ["model_name", "finished_reason"], registry=reg)
        self.request_success = {reason: success.labels(model_name, reason)
                                for reason in FINISH_REASONS}
        self.time_to_first_token = histogram("vllm:time_to_first_token_seconds",
                                             "Histogram of time to first token in seconds.",
                                             TTFT_BUCKETS)
        self.time_per_output_token = histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token (inter-token latency) in seconds.", TPOT_BUCKETS)
        self.e2e_request_latency = histogram("vllm:e2e_request_latency_seconds",
                                             "Histogram of end to end request latency in seconds.",
                                             LATENCY_BUCKETS)
        self.request_queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in the WAITING phase for a request.", LATENCY_BUCKETS)
        self.hpu_graph_compilations = counter(
            "vllm:hpu_graph_compilations",
            "Graph compilations after warmup (HPU): new shapes compiled while serving.")
        token_buckets = build_1_2_5_buckets(max(1, max_model_len))
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens",
                                               "Number of prefill tokens processed.",
                                               token_buckets)
        self.request_generation_tokens = histogram("vllm:request_generation_tokens",
                                                   "Number of generation tokens processed.",
                                                   token_buckets)


@dataclass
class _RequestTimes:
    """What the tracker remembers about one in-flight request."""
    arrival: float
    prompt_len: int = 0
    generated: int = 0
    first_token: Optional[float] = None
    last_token: Optional[float] = None


@dataclass
class _Window:
    """Token counts since the last stats log line."""
    start: float = field(default_factory=time.monotonic)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    active: bool = False


class StatsTracker:
    """Feeds Prometheus and the periodic log from the engine loop thread.

    Times are taken with time.monotonic() here, on the loop thread, so they do not depend on
    the clock the engine uses for RequestMetrics; only the queue time (arrival -> first
    scheduled) comes from RequestMetrics, as a difference of two engine timestamps.
    """

    LOG_INTERVAL_S = 5.0

    def __init__(self, model_name: str, max_model_len: int, log_stats: bool = True,
                 max_loras: Optional[int] = None) -> None:
        self.metrics = PrometheusMetrics(model_name, max_model_len)
        self.log_stats = log_stats
        self.max_loras = max_loras
        # vLLM's LoRA info gauge (only with --enable-lora): one series per combination of
        # adapter names, its value the time it was last reported.
        self.lora_info = None if max_loras is None else Gauge(
            "vllm:lora_requests_info", "Running stats on lora requests.",
            ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
            registry=self.metrics.registry)
        self._requests: dict[str, _RequestTimes] = {}
        self._last_queries = 0
        self._last_hits = 0
        self._last_preemptions = 0
        self._window = _Window()
        self._last_scheduler_stats: Any = None

    @property
    def registry(self) -> CollectorRegistry:
        return self.metrics.registry

    # -------------------------------------------------------------- requests
    def on_request_added(self, request_id: str) -> None:
        self._requests[request_id] = _RequestTimes(arrival=time.monotonic())

    def on_request_aborted(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def on_output(self, output: Any, now: Optional[float] = None) -> None:
        """Record one DELTA RequestOutput (new tokens of this step only)."""
        now = time.monotonic() if now is None else now
        times = self._requests.get(output.request_id)
        if times is None:
            return
        m = self.metrics
        if not times.prompt_len:
            times.prompt_len = len(output.prompt_token_ids or [])
            m.prompt_tokens.inc(times.prompt_len)
            self._window.prompt_tokens += times.prompt_len
        new_tokens = sum(len(c.token_ids) for c in output.outputs)
        if new_tokens:
            m.generation_tokens.inc(new_tokens)
            self._window.generation_tokens += new_tokens
            if times.first_token is None:
                times.first_token = now
                m.time_to_first_token.observe(now - times.arrival)
            else:
                m.time_per_output_token.observe(now - times.last_token)
            times.last_token = now
            times.generated += new_tokens
        self._window.active = True
        if output.finished:
            self._on_finished(output, times, now)

    def _on_finished(self, output: Any, times: _RequestTimes, now: float) -> None:
        self._requests.pop(output.request_id, None)
        m = self.metrics
        m.e2e_request_latency.observe(now - times.arrival)
        m.request_prompt_tokens.observe(times.prompt_len)
        m.request_generation_tokens.observe(times.generated)
        queue_time = _queue_time(getattr(output, "metrics", None))
        if queue_time is not None:
            m.request_queue_time.observe(queue_time)
        reasons = [c.finish_reason for c in output.outputs if c.finish_reason]
        reason = reasons[0] if reasons else "stop"
        m.request_success.get(reason, m.request_success["stop"]).inc()

    # ------------------------------------------------------------- scheduler
    def on_scheduler_stats(self, stats: Any) -> None:
        """Update gauges and the cumulative-count counters from the engine's SchedulerStats."""
        if stats is None:
            return
        m = self.metrics
        m.num_requests_running.set(stats.num_running_reqs)
        m.num_requests_waiting.set(stats.num_waiting_reqs)
        m.kv_cache_usage.set(stats.kv_cache_usage)
        self._last_queries = _inc_by_growth(m.prefix_cache_queries, stats.prefix_cache_queries,
                                            self._last_queries)
        self._last_hits = _inc_by_growth(m.prefix_cache_hits, stats.prefix_cache_hits,
                                         self._last_hits)
        self._last_preemptions = _inc_by_growth(m.num_preemptions, stats.num_preemptions,
                                                self._last_preemptions)
        self._last_scheduler_stats = stats
        if self.lora_info is not None:
            self.lora_info.labels(
                max_lora=str(self.max_loras),
                waiting_lora_adapters=",".join(getattr(stats, "waiting_lora_adapters", {})),
                running_lora_adapters=",".join(getattr(stats, "running_lora_adapters", {})),
            ).set_to_current_time()
        self.maybe_log()

    def on_compile_stats(self, stats: Optional[dict]) -> None:
        """Advance vllm:hpu_graph_compilations_total from the worker's compile accounting."""
        if not stats:
            return
        self._last_compiles = _inc_by_growth(self.metrics.hpu_graph_compilations,
                                             stats.get("num_compiles_after_warmup", 0),
                                             getattr(self, "_last_compiles", 0))

    def maybe_log(self, force: bool = False) -> None:
        """Log throughput and cache usage every LOG_INTERVAL_S while there is activity."""
        now = time.monotonic()
        w = self._window
        elapsed = now - w.start
        if not self.log_stats or not w.active or (elapsed < self.LOG_INTERVAL_S and not force):
            return
        s = self._last_scheduler_stats
        hit_rate = (100.0 * s.prefix_cache_hits / s.prefix_cache_queries
                    if s is not None and s.prefix_cache_queries else 0.0)
        logger.info(
            "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
            "Running: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%, "
            "Prefix cache hit rate: %.1f%%",
            w.prompt_tokens / elapsed, w.generation_tokens / elapsed,
            getattr(s, "num_running_reqs", 0), getattr(s, "num_waiting_reqs", 0),
            100.0 * getattr(s, "kv_cache_usage", 0.0), hit_rate)
        self._window = _Window(start=now)


def _inc_by_growth(counter: Any, total: int, last: int) -> int:
    """Advance a Prometheus counter to match an engine-side cumulative count."""
    total = int(total or 0)
    if total > last:
        counter.inc(total - last)
    return max(total, last)


def _queue_time(metrics: Any) -> Optional[float]:
    if metrics is None:
        return None
    arrival = getattr(metrics, "arrival_time", None)
    scheduled = getattr(metrics, "first_scheduled_time", None)
    if arrival is None or scheduled is None:
        return None
    return max(0.0, scheduled - arrival)


def iter_metric_names(registry: CollectorRegistry) -> Iterable[str]:
    """Names of every exposed sample (used by tests and the startup self-check)."""
    for family in registry.collect():
        for sample in family.samples:
            yield sample.name
