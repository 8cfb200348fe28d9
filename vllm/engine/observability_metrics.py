"""The metric families beside the per-request ones: sleep state, and the opt-in ones
(--kv-cache-metrics, --enable-mfu-metrics, --show-hidden-metrics-for-version).

Each class registers its collectors in the engine's registry under vLLM's names and
labels (`model_name`, `engine`); `StatsTracker` feeds them. The opt-in ones exist only
when their flag is set, so /metrics stays vLLM's default set otherwise.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from vllm.engine.perf_metrics import PEAK_FLOPS, PerfEstimate
from vllm.metrics.multiprocess import GAUGE_MODE

logger = logging.getLogger(__name__)

SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
"""vLLM's sleep_state label values: awake, level 1 (weights offloaded), level 2."""
KV_BLOCK_BUCKETS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10,
                    20, 30, 60, 120, 300, 600, 1200, 1800]
COMPAT_VLLM_VERSION = (0, 32)
"""The vLLM release whose /metrics names this server exports."""


class SleepStateMetric:
    """vllm:engine_sleep_state{sleep_state}: 1 on the engine's current state, else 0."""

    def __init__(self, registry: CollectorRegistry, labels: list[str],
                 values: tuple[str, ...]) -> None:
        gauge = Gauge("vllm:engine_sleep_state", "Engine sleep state; awake = 0 means "
                      "engine is sleeping; awake = 1 means engine is awake; "
                      "weights_offloaded = 1 means sleep level 1; discard_all = 1 means "
                      "sleep level 2.", [*labels, "sleep_state"],
                      multiprocess_mode=GAUGE_MODE, registry=registry)
        self._states = {s: gauge.labels(*values, s) for s in SLEEP_STATES}
        self.set(0)

    def set(self, level: int) -> None:
        """0: awake; 1 or 2: the sleep level."""
        current = SLEEP_STATES[level] if 0 <= level < len(SLEEP_STATES) else "discard_all"
        for state, child in self._states.items():
            child.set(1 if state == current else 0)


class KVBlockMetrics:
    """--kv-cache-metrics: residency of sampled KV blocks, from eviction events."""

    def __init__(self, registry: CollectorRegistry, labels: list[str],
                 values: tuple[str, ...]) -> None:
        def hist(name: str, doc: str) -> Any:
            return Histogram(name, doc, labels, buckets=KV_BLOCK_BUCKETS,
                             registry=registry).labels(*values)

        self.lifetime = hist("vllm:kv_block_lifetime_seconds", "Histogram of KV cache "
                             "block lifetime from allocation to eviction. Sampled metrics "
                             "(controlled by --kv-cache-metrics-sample).")
        self.idle = hist("vllm:kv_block_idle_before_evict_seconds", "Histogram of idle "
                         "time before KV cache block eviction. Sampled metrics (controlled "
                         "by --kv-cache-metrics-sample).")
        self.reuse_gap = hist("vllm:kv_block_reuse_gap_seconds", "Histogram of time gaps "
                              "between consecutive KV cache block accesses. Only the most "
                              "recent accesses are recorded (ring buffer). Sampled metrics "
                              "(controlled by --kv-cache-metrics-sample).")
        self._last_batch: Any = None

    def observe(self, events: Optional[list]) -> None:
        # The same stats object may be read twice (no new message from the core since):
        # each batch of events is observed once.
        if not events or events is self._last_batch:
            return
        self._last_batch = events
        for e in events:
            self.lifetime.observe(e.lifetime_seconds)
            self.idle.observe(e.idle_seconds)
            for gap in e.reuse_gaps_seconds:
                self.reuse_gap.observe(gap)


class MfuMetrics:
    """--enable-mfu-metrics: vLLM's estimated FLOPs/bytes counters, and the peak."""

    def __init__(self, registry: CollectorRegistry, labels: list[str],
                 values: tuple[str, ...], device_model: Optional[str]) -> None:
        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=registry).labels(*values)

        self.flops = counter("vllm:estimated_flops_per_gpu", "Estimated number of floating "
                             "point operations per GPU (for Model Flops Utilization "
                             "calculations).")
        self.read_bytes = counter("vllm:estimated_read_bytes_per_gpu", "Estimated number "
                                  "of bytes read from memory per GPU (for Model Flops "
                                  "Utilization calculations).")
        self.write_bytes = counter("vllm:estimated_write_bytes_per_gpu", "Estimated number "
                                   "of bytes written to memory per GPU (for Model Flops "
                                   "Utilization calculations).")
        self.peak_flops = PEAK_FLOPS.get(device_model) if device_model else None
        if self.peak_flops is not None:
            Gauge("vllm:peak_flops_per_gpu", "Dense bf16 peak FLOP/s of one device "
                  f"({device_model}): model FLOPs utilization is "
                  "rate(vllm:estimated_flops_per_gpu_total) / this.", labels,
                  multiprocess_mode=GAUGE_MODE,
                  registry=registry).labels(*values).set(self.peak_flops)

    def add(self, estimate: PerfEstimate) -> None:
        if estimate.flops:
            self.flops.inc(estimate.flops)
        if estimate.read_bytes:
            self.read_bytes.inc(estimate.read_bytes)
        if estimate.write_bytes:
            self.write_bytes.inc(estimate.write_bytes)


class HiddenMetrics:
    """Deprecated names vLLM hid, shown with --show-hidden-metrics-for-version: the
    old spellings of kv_cache_usage_perc, prefix_cache_* and inter_token_latency."""

    def __init__(self, registry: CollectorRegistry, labels: list[str],
                 values: tuple[str, ...], ttft_like_buckets: list[float]) -> None:
        self.gpu_cache_usage = Gauge(
            "vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage. "
            "DEPRECATED: use vllm:kv_cache_usage_perc.", labels,
            multiprocess_mode=GAUGE_MODE, registry=registry).labels(*values)
        self.gpu_prefix_cache_queries = Counter(
            "vllm:gpu_prefix_cache_queries", "GPU prefix cache queries, in terms of number "
            "of queried tokens. DEPRECATED: use vllm:prefix_cache_queries.", labels,
            registry=registry).labels(*values)
        self.gpu_prefix_cache_hits = Counter(
            "vllm:gpu_prefix_cache_hits", "GPU prefix cache hits, in terms of number of "
            "cached tokens. DEPRECATED: use vllm:prefix_cache_hits.", labels,
            registry=registry).labels(*values)
        self.time_per_output_token = Histogram(
            "vllm:time_per_output_token_seconds", "Histogram of time per output token in "
            "seconds. DEPRECATED: use vllm:inter_token_latency_seconds.", labels,
            buckets=ttft_like_buckets, registry=registry).labels(*values)


def show_hidden_metrics(version: Optional[str]) -> bool:
    """vLLM's rule: hidden metrics come back only for the previous minor release (a
    metric hidden in N is removed in N+1). Versions are vLLM's: see COMPAT_VLLM_VERSION."""
    if not version:
        return False
    try:
        major, minor = (int(p) for p in version.split(".")[:2])
    except ValueError:
        raise ValueError(f"--show-hidden-metrics-for-version {version!r}: expected a "
                         "version such as 0.31.") from None
    major_now, minor_now = COMPAT_VLLM_VERSION
    if (major, minor) == (major_now, minor_now - 1):
        return True
    logger.warning("--show-hidden-metrics-for-version %s: only the previous minor version "
                   "(%d.%d) shows hidden metrics (this server exports vLLM %d.%d's); none "
                   "are shown.", version, major_now, minor_now - 1, major_now, minor_now)
    return False
