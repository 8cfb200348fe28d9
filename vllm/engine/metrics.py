"""Serving metrics: Prometheus collectors under vLLM's names, and the periodic stats log line.

The async engine's loop thread feeds `StatsTracker` after every step (and after aborts);
the tracker turns per-step `RequestOutput`s (always DELTA inside the async engine) and the
scheduler's `SchedulerStats` into Prometheus observations. Each tracker owns its own
`CollectorRegistry`, so several servers can live in one process (tests do that).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from vllm.engine.bucket_metrics import BucketMetrics
from vllm.engine.observability_metrics import (HiddenMetrics, KVBlockMetrics, MfuMetrics,
                                               SleepStateMetric, show_hidden_metrics)
from prometheus_client import (CollectorRegistry, Counter, Gauge, GCCollector, Histogram,
                               PlatformCollector, ProcessCollector, generate_latest)

from vllm.metrics.multiprocess import GAUGE_MODE
from vllm.engine.kv_offload_metrics import KVConnectorMetrics
from vllm.spec_decode.metrics import SpecDecodingProm

logger = logging.getLogger(__name__)

# Bucket edges as in vLLM, so dashboards built for vLLM read the same.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0]
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
FINISH_REASONS = ("stop", "length", "abort", "error")
WAITING_REASONS = ("capacity", "deferred")


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
    """The collectors, registered in a dedicated registry and labelled as vLLM's:
    `model_name` and `engine` (the engine's index; data-parallel replicas differ in it).

    Counters are declared without the `_total` suffix: prometheus_client appends it, so the
    exposed names are exactly vLLM's (`vllm:prompt_tokens_total`, ...).
    """

    def __init__(self, model_name: str, max_model_len: int,
                 registry: Optional[CollectorRegistry] = None, engine_index: int = 0) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name", "engine"]
        values = (model_name, str(engine_index))
        self.labels, self.label_values = labels, values
        reg = self.registry

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, multiprocess_mode=GAUGE_MODE,
                         registry=reg).labels(*values)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=reg).labels(*values)

        def histogram(name: str, doc: str, buckets: list) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=reg).labels(*values)

        self.num_requests_running = gauge("vllm:num_requests_running",
                                          "Number of requests in model execution batches.")
        self.num_requests_waiting = gauge("vllm:num_requests_waiting",
                                          "Number of requests waiting to be processed.")
        by_reason = Gauge("vllm:num_requests_waiting_by_reason",
                          "Number of requests waiting, by reason: capacity (KV cache or batch "
                          "slots) or deferred (grammar compiling, LoRA slot).",
                          [*labels, "reason"], multiprocess_mode=GAUGE_MODE, registry=reg)
        self.num_requests_waiting_by_reason = {r: by_reason.labels(*values, r)
                                               for r in WAITING_REASONS}
        self.kv_cache_usage = gauge("vllm:kv_cache_usage_perc",
                                    "KV-cache usage. 1 means 100 percent usage.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_tokens_cached = counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local prefix cache + external KV transfer).")
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
                          [*labels, "finished_reason"], registry=reg)
        self.request_success = {reason: success.labels(*values, reason)
                                for reason in FINISH_REASONS}
        self.iteration_tokens = histogram("vllm:iteration_tokens_total",
                                          "Histogram of number of tokens per engine_step.",
                                          ITERATION_TOKEN_BUCKETS)
        self.time_to_first_token = histogram("vllm:time_to_first_token_seconds",
                                             "Histogram of time to first token in seconds.",
                                             TTFT_BUCKETS)
        self.inter_token_latency = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.", TPOT_BUCKETS)
        self.request_time_per_output_token = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request (decode time divided "
            "by generated tokens - 1).", TPOT_BUCKETS)
        self.e2e_request_latency = histogram("vllm:e2e_request_latency_seconds",
                                             "Histogram of end to end request latency in seconds.",
                                             LATENCY_BUCKETS)
        self.request_queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in the WAITING phase for a request.", LATENCY_BUCKETS)
        self.request_inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in the RUNNING phase for a request.", LATENCY_BUCKETS)
        self.request_prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in the PREFILL phase for a request.", LATENCY_BUCKETS)
        self.request_decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in the DECODE phase for a request.", LATENCY_BUCKETS)
        self.hpu_graph_compilations = counter(
            "vllm:hpu_graph_compilations",
            "Graph compilations after warmup (HPU): new shapes compiled while serving.")
        self.hpu_buckets = BucketMetrics(reg, labels, values)
        token_buckets = build_1_2_5_buckets(max(1, max_model_len))
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens",
                                               "Number of prefill tokens processed.",
                                               token_buckets)
        self.request_generation_tokens = histogram("vllm:request_generation_tokens",
                                                   "Number of generation tokens processed.",
                                                   token_buckets)
        self.request_max_num_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.", token_buckets)
        self.request_params_n = histogram("vllm:request_params_n",
                                          "Histogram of the n request parameter.",
                                          [1, 2, 5, 10, 20])
        self.request_params_max_tokens = histogram(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
            token_buckets)
        self.request_num_preemptions = histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            list(REQUEST_NUM_PREEMPTIONS_BUCKETS))
        self.request_prefill_kv_computed_tokens = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            token_buckets)
        by_source = Counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                            [*labels, "source"], registry=reg)
        self.prompt_tokens_by_source = {s: by_source.labels(*values, s)
                                        for s in PROMPT_TOKEN_SOURCES}
        self._labels = dict(zip(labels, values))

    def set_cache_config_info(self, cache_config: Any) -> None:
        """vllm:cache_config_info: a gauge at 1 whose labels are the cache config's fields
        (vLLM's emulation of a Prometheus info metric)."""
        info = {f.name: str(getattr(cache_config, f.name))
                for f in dataclasses.fields(cache_config)}
        info["engine"] = self._labels["engine"]
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
              list(info), multiprocess_mode=GAUGE_MODE,
              registry=self.registry).labels(**info).set(1)


REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
"""vLLM's buckets: never- and once-preempted requests share the first."""
PROMPT_TOKEN_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
"""Where a prompt token's KV came from (no KV transfer here: that one stays 0)."""


@dataclass
class _ChoiceTimes:
    """One of a request's n completions: vLLM counts each as a request of its own."""
    generated: int = 0
    first_token: Optional[float] = None
    last_token: Optional[float] = None
    finished: Optional[float] = None
    finish_reason: Optional[str] = None


@dataclass
class _RequestTimes:
    """What the tracker remembers about one in-flight request (its n completions)."""
    arrival: float
    prompt_len: int = 0
    cached: int = 0
    """Prompt tokens not computed: prefix-cache hits plus `external`."""
    external: int = 0
    """Of those, the tokens whose KV was loaded from another engine (KV transfer)."""
    n: int = 1
    max_tokens: Optional[int] = None
    choices: dict[int, _ChoiceTimes] = field(default_factory=dict)

    def choice(self, index: int) -> _ChoiceTimes:
        return self.choices.setdefault(index, _ChoiceTimes())


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
                 max_loras: Optional[int] = None, engine_index: int = 0,
                 cache_config: Any = None, num_spec_tokens: int = 0,
                 observability_config: Any = None, perf_model: Any = None,
                 device_model: Optional[str] = None) -> None:
        """`perf_model`: a `PerfModel` for --enable-mfu-metrics (with `device_model`,
        the PEAK_FLOPS key of the device)."""
        self.metrics = PrometheusMetrics(model_name, max_model_len, engine_index=engine_index)
        m = self.metrics
        obs = observability_config
        self.sleep_state = SleepStateMetric(m.registry, m.labels, m.label_values)
        self.kv_blocks = (KVBlockMetrics(m.registry, m.labels, m.label_values)
                          if obs is not None and obs.kv_cache_metrics else None)
        self.perf_model = perf_model if obs is not None and obs.enable_mfu_metrics else None
        self.mfu = (MfuMetrics(m.registry, m.labels, m.label_values, device_model)
                    if self.perf_model is not None else None)
        self.hidden = (HiddenMetrics(m.registry, m.labels, m.label_values, TPOT_BUCKETS)
                       if obs is not None
                       and show_hidden_metrics(obs.show_hidden_metrics_for_version) else None)
        if cache_config is not None:
            self.metrics.set_cache_config_info(cache_config)
        self.kv_connector = KVConnectorMetrics(
            m.registry, m.labels, m.label_values,
            offloading=getattr(cache_config, "kv_offloading_size", None) is not None)
        m = self.metrics
        # vLLM's spec-decode counters, only with speculative decoding (num_spec_tokens: k).
        self.spec_decoding = (SpecDecodingProm(m.registry, m.labels, m.label_values,
                                               num_spec_tokens)
                              if num_spec_tokens else None)
        self.log_stats = log_stats
        self.max_loras = max_loras
        # vLLM's LoRA info gauge (only with --enable-lora): one series per combination of
        # adapter names, its value the time it was last reported.
        self.lora_info = None if max_loras is None else Gauge(
            "vllm:lora_requests_info", "Running stats on lora requests.",
            ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
            multiprocess_mode=GAUGE_MODE, registry=self.metrics.registry)
        self._requests: dict[str, _RequestTimes] = {}
        self._last_queries = 0
        self._last_hits = 0
        self._last_preemptions = 0
        self._window = _Window()
        self._last_scheduler_stats: Any = None
        self.records_core_stats = True
        """False in an API server that is not its shared core's primary frontend."""
        self._step_tokens = 0

    @property
    def registry(self) -> CollectorRegistry:
        return self.metrics.registry

    @property
    def last_scheduler_stats(self) -> Any:
        """The engine core's latest SchedulerStats (None before the first)."""
        return self._last_scheduler_stats

    # -------------------------------------------------------------- requests
    def on_request_added(self, request_id: str, params: Any = None,
                         max_tokens: Optional[int] = None) -> None:
        """`max_tokens`: the resolved one (`Request.max_tokens`), not the params' ask."""
        self._requests[request_id] = _RequestTimes(
            arrival=time.monotonic(), n=getattr(params, "n", 1) or 1, max_tokens=max_tokens)

    def on_request_aborted(self, request_id: str) -> None:
        """Each of its completions not finished yet counts as an aborted request."""
        self._end_unfinished(request_id, "abort")

    def on_request_failed(self, request_id: str) -> None:
        """The engine failed under an in-flight request (finished_reason "error")."""
        self._end_unfinished(request_id, "error")

    def _end_unfinished(self, request_id: str, reason: str) -> None:
        times = self._requests.pop(request_id, None)
        if times is not None:
            done = sum(1 for c in times.choices.values() if c.finished is not None)
            self.metrics.request_success[reason].inc(max(times.n - done, 0))

    def on_step(self, outputs: Iterable[Any], now: Optional[float] = None) -> None:
        """Record one engine step's DELTA outputs, and its token count."""
        now = time.monotonic() if now is None else now
        self._step_tokens = 0
        for output in outputs:
            self.on_output(output, now)
        if self._step_tokens:
            self.metrics.iteration_tokens.observe(self._step_tokens)
            if self.mfu is not None:
                self.mfu.add(self.perf_model.step())

    def on_output(self, output: Any, now: Optional[float] = None) -> None:
        """Record one DELTA RequestOutput (new tokens of this step only)."""
        now = time.monotonic() if now is None else now
        times = self._requests.get(output.request_id)
        if times is None:
            return
        m = self.metrics
        if not times.prompt_len:
            # Each of the n completions is a request of its own in vLLM's counts (its
            # engine runs them as n child requests over the same prompt).
            n = times.n
            times.prompt_len = len(output.prompt_token_ids or [])
            times.cached = min(getattr(output, "num_cached_tokens", 0) or 0, times.prompt_len)
            m.prompt_tokens.inc(n * times.prompt_len)
            m.prompt_tokens_cached.inc(n * times.cached)
            times.external = min(getattr(output, "num_external_computed_tokens", 0) or 0,
                                 times.cached)
            m.prompt_tokens_by_source["local_compute"].inc(
                n * (times.prompt_len - times.cached))
            m.prompt_tokens_by_source["local_cache_hit"].inc(
                n * (times.cached - times.external))
            m.prompt_tokens_by_source["external_kv_transfer"].inc(n * times.external)
            self._window.prompt_tokens += n * times.prompt_len
            self._step_tokens += n * times.prompt_len
            if self.mfu is not None:
                self.mfu.add(self.perf_model.tokens(times.prompt_len - times.cached,
                                                    times.cached))
        for c in _completions(output):
            choice = times.choice(c.index)
            if self.mfu is not None and c.token_ids:
                self.mfu.add(self.perf_model.tokens(len(c.token_ids),
                                                    times.prompt_len + choice.generated))
            self._on_choice_tokens(times.arrival, choice, len(c.token_ids), now)
            if c.finish_reason and choice.finished is None:
                choice.finished, choice.finish_reason = now, c.finish_reason
        self._window.active = True
        if output.finished:
            self._on_finished(output, times, now)

    def _on_choice_tokens(self, arrival: float, choice: _ChoiceTimes, new_tokens: int,
                          now: float) -> None:
        if not new_tokens:
            return
        m = self.metrics
        m.generation_tokens.inc(new_tokens)
        self._window.generation_tokens += new_tokens
        self._step_tokens += new_tokens
        if choice.first_token is None:
            choice.first_token = now
            m.time_to_first_token.observe(now - arrival)
        else:
            m.inter_token_latency.observe(now - choice.last_token)
            if self.hidden is not None:
                self.hidden.time_per_output_token.observe(now - choice.last_token)
        choice.last_token = now
        choice.generated += new_tokens

    def _on_finished(self, output: Any, times: _RequestTimes, now: float) -> None:
        """Per completion, as vLLM counts its n child requests: latency, token counts,
        phases, finish reason; per request: n and the longest completion."""
        self._requests.pop(output.request_id, None)
        m = self.metrics
        phases = request_phases(getattr(output, "metrics", None))
        preemptions = getattr(getattr(output, "metrics", None), "num_preemptions", 0) or 0
        for index in range(times.n):
            choice = times.choice(index)
            m.e2e_request_latency.observe((choice.finished or now) - times.arrival)
            m.request_prompt_tokens.observe(times.prompt_len)
            m.request_generation_tokens.observe(choice.generated)
            m.request_prefill_kv_computed_tokens.observe(times.prompt_len - times.cached)
            m.request_num_preemptions.observe(preemptions)
            if times.max_tokens is not None:
                m.request_params_max_tokens.observe(times.max_tokens)
            for name, hist in (("queue", m.request_queue_time),
                               ("prefill", m.request_prefill_time),
                               ("decode", m.request_decode_time),
                               ("inference", m.request_inference_time)):
                if phases.get(name) is not None:
                    hist.observe(phases[name])
            if choice.generated > 1 and choice.first_token is not None:
                m.request_time_per_output_token.observe(
                    (choice.last_token - choice.first_token) / (choice.generated - 1))
            reason = choice.finish_reason or "stop"
            m.request_success.get(reason, m.request_success["stop"]).inc()
        longest = max((c.generated for c in times.choices.values()), default=0)
        m.request_max_num_generation_tokens.observe(longest)
        m.request_params_n.observe(times.n)

    # ------------------------------------------------------------- scheduler
    def on_scheduler_stats(self, stats: Any) -> None:
        """Update gauges and the cumulative-count counters from the engine's SchedulerStats.
        A frontend that is not its core's primary (several API servers share the core)
        only keeps them: the primary records the core's series, once."""
        if stats is None:
            return
        if not self.records_core_stats:
            self._last_scheduler_stats = stats
            return
        m = self.metrics
        m.num_requests_running.set(stats.num_running_reqs)
        m.num_requests_waiting.set(stats.num_waiting_reqs)
        m.kv_cache_usage.set(stats.kv_cache_usage)
        deferred = getattr(stats, "num_deferred_reqs", 0)
        m.num_requests_waiting_by_reason["deferred"].set(deferred)
        m.num_requests_waiting_by_reason["capacity"].set(stats.num_waiting_reqs - deferred)
        self._last_queries = _inc_by_growth(m.prefix_cache_queries, stats.prefix_cache_queries,
                                            self._last_queries)
        self._last_hits = _inc_by_growth(m.prefix_cache_hits, stats.prefix_cache_hits,
                                         self._last_hits)
        self._last_preemptions = _inc_by_growth(m.num_preemptions, stats.num_preemptions,
                                                self._last_preemptions)
        self._last_scheduler_stats = stats
        self._on_optional_stats(stats)
        spec_stats = getattr(stats, "spec_decoding_stats", None)
        if self.spec_decoding is not None and spec_stats is not None:
            self.spec_decoding.observe(spec_stats)
        if self.lora_info is not None:
            self.lora_info.labels(
                max_lora=str(self.max_loras),
                waiting_lora_adapters=",".join(getattr(stats, "waiting_lora_adapters", {})),
                running_lora_adapters=",".join(getattr(stats, "running_lora_adapters", {})),
            ).set_to_current_time()
        self.maybe_log()

    def _on_optional_stats(self, stats: Any) -> None:
        self.kv_connector.observe(stats)
        if self.kv_blocks is not None:
            self.kv_blocks.observe(getattr(stats, "kv_cache_eviction_events", None))
        if self.hidden is not None:
            h = self.hidden
            h.gpu_cache_usage.set(stats.kv_cache_usage)
            self._last_hidden_queries = _inc_by_growth(
                h.gpu_prefix_cache_queries, stats.prefix_cache_queries,
                getattr(self, "_last_hidden_queries", 0))
            self._last_hidden_hits = _inc_by_growth(
                h.gpu_prefix_cache_hits, stats.prefix_cache_hits,
                getattr(self, "_last_hidden_hits", 0))

    def on_sleep_state(self, level: int) -> None:
        """vllm:engine_sleep_state: 0 awake, else the sleep level."""
        self.sleep_state.set(level)

    def on_compile_stats(self, stats: Optional[dict]) -> None:
        """Advance vllm:hpu_graph_compilations_total from the worker's compile accounting."""
        if not stats:
            return
        self._last_compiles = _inc_by_growth(self.metrics.hpu_graph_compilations,
                                             stats.get("num_compiles_after_warmup", 0),
                                             getattr(self, "_last_compiles", 0))
        self.metrics.hpu_buckets.update(stats.get("buckets"))

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
        if self.spec_decoding is not None:
            self.spec_decoding.log()
        self._window = _Window(start=now)


def _inc_by_growth(counter: Any, total: int, last: int) -> int:
    """Advance a Prometheus counter to match an engine-side cumulative count."""
    total = int(total or 0)
    if total > last:
        counter.inc(total - last)
    return max(total, last)


def request_phases(metrics: Any) -> dict[str, Optional[float]]:
    """A finished request's phases in seconds, from the engine's RequestMetrics (one clock):
    queue (arrival -> first scheduled), prefill (scheduled -> first token), decode (first
    -> last token) and inference (scheduled -> last token), as vLLM defines them."""
    def span(start: str, end: str) -> Optional[float]:
        a, b = getattr(metrics, start, None), getattr(metrics, end, None)
        return None if a is None or b is None else max(0.0, b - a)

    return {"queue": span("arrival_time", "first_scheduled_time"),
            "prefill": span("first_scheduled_time", "first_token_time"),
            "decode": span("first_token_time", "last_token_time"),
            "inference": span("first_scheduled_time", "last_token_time")}


def iter_metric_names(registry: CollectorRegistry) -> Iterable[str]:
    """Names of every exposed sample (used by tests and the startup self-check)."""
    for family in registry.collect():
        for sample in family.samples:
            yield sample.name


_process_registry: Optional[CollectorRegistry] = None


def process_registry() -> CollectorRegistry:
    """The process_* and python_* collectors that every vLLM /metrics also shows (there:
    prometheus_client's default registry). One per process, apart from the engine
    registries, so data-parallel merging never labels them with an engine."""
    global _process_registry
    if _process_registry is None:
        registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        _process_registry = registry
    return _process_registry


def render_metrics(engine_registry: CollectorRegistry,
                   http_registry: Optional[CollectorRegistry] = None) -> bytes:
    """The /metrics body: the engine's metrics, the server's HTTP metrics, then the
    process collectors."""
    http = generate_latest(http_registry) if http_registry is not None else b""
    return generate_latest(engine_registry) + http + generate_latest(process_registry())


def _completions(output: Any) -> list:
    """The completions of a RequestOutput; none for a pooling output (one vector)."""
    outputs = getattr(output, "outputs", None)
    return outputs if isinstance(outputs, list) else []
