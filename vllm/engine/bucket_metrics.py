"""Prometheus metrics of HPU shape buckets, fed from the runner's bucket accounting.

The numbers are cumulative counts kept in the worker (`HPUModelRunner.get_bucket_stats`,
reported inside the compile stats the server polls at most once a second), so the
counters advance by their growth, like `vllm:hpu_graph_compilations_total`:

- `vllm:hpu_padded_tokens_total{phase}`, `vllm:hpu_real_tokens_total{phase}`: compute
  of the passes run, with and without bucket padding (units of `padding_cost.py`);
- `vllm:hpu_padding_waste_ratio{phase}`: 1 - real / padded since warmup;
- `vllm:hpu_bucket_hits_total{phase,bucket}`: passes per bucket ("bs,query,blocks");
- `vllm:hpu_fallback_bucket_passes_total`: passes in buckets made at serving time;
- `vllm:hpu_warmup_seconds`, `vllm:hpu_cold_buckets`: the warmup's time and the
  buckets it left uncompiled (budget or memory);
- `vllm:hpu_graph_memory_bytes{phase}`: device bytes held by the captured HPU graphs,
  each measured by the runner when it captured it (free device memory before minus
  after; on the fake HPU, its memory ledger).
"""
from __future__ import annotations

from typing import Any, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge

from vllm.metrics.multiprocess import GAUGE_MODE

PHASES = ("prompt", "decode")


class BucketMetrics:

    def __init__(self, registry: CollectorRegistry, labels: list[str],
                 values: tuple[str, ...]) -> None:
        self._values = values
        self.padded = Counter("vllm:hpu_padded_tokens", "Compute of the HPU passes run, "
                              "bucket padding included (token slots; decode: rows x row "
                              "weight + KV tokens read).", [*labels, "phase"],
                              registry=registry)
        self.real = Counter("vllm:hpu_real_tokens", "Compute the HPU passes needed without "
                            "bucket padding (same units as vllm:hpu_padded_tokens).",
                            [*labels, "phase"], registry=registry)
        self.waste = Gauge("vllm:hpu_padding_waste_ratio", "Share of HPU compute spent on "
                           "bucket padding since warmup (1 - real / padded).",
                           [*labels, "phase"], multiprocess_mode=GAUGE_MODE,
                           registry=registry)
        self.hits = Counter("vllm:hpu_bucket_hits", "HPU passes run per shape bucket "
                            "(batch size, query length, blocks).", [*labels, "phase", "bucket"],
                            registry=registry)
        self.fallbacks = Counter("vllm:hpu_fallback_bucket_passes", "HPU passes run in a "
                                 "bucket made at serving time (not warmed up).", labels,
                                 registry=registry).labels(*values)
        self.warmup_seconds = Gauge("vllm:hpu_warmup_seconds", "Seconds the HPU warmup took.",
                                    labels, multiprocess_mode=GAUGE_MODE,
                                    registry=registry).labels(*values)
        self.cold = Gauge("vllm:hpu_cold_buckets", "Buckets the HPU warmup left uncompiled "
                          "(VLLM_WARMUP_BUDGET_S, or graph memory).", labels,
                          multiprocess_mode=GAUGE_MODE, registry=registry).labels(*values)
        self.graph_memory = Gauge("vllm:hpu_graph_memory_bytes", "Device memory held by "
                                  "the captured HPU graphs, measured at each capture.",
                                  [*labels, "phase"], multiprocess_mode=GAUGE_MODE,
                                  registry=registry)
        self._last: dict[Any, int] = {}

    def _grow(self, key: Any, counter: Any, total: int) -> None:
        last = self._last.get(key, 0)
        if total > last:
            counter.inc(total - last)
            self._last[key] = total

    def update(self, stats: Optional[dict]) -> None:
        if not stats:
            return
        v = self._values
        for phase in PHASES:
            self._grow(("padded", phase), self.padded.labels(*v, phase),
                       stats["padded_tokens"].get(phase, 0))
            self._grow(("real", phase), self.real.labels(*v, phase),
                       stats["real_tokens"].get(phase, 0))
            self.waste.labels(*v, phase).set(stats["padding_waste"].get(phase, 0.0))
        for key, n in stats.get("bucket_hits", {}).items():
            phase, bucket = key.split(":", 1)
            self._grow(("hit", key), self.hits.labels(*v, phase, bucket), n)
        self._grow("fallbacks", self.fallbacks, stats.get("fallback_passes", 0))
        if stats.get("warmup_seconds") is not None:
            self.warmup_seconds.set(stats["warmup_seconds"])
        self.cold.set(len(stats.get("cold_buckets", [])))
        for phase, nbytes in stats.get("graph_memory_bytes", {}).items():
            self.graph_memory.labels(*v, phase).set(nbytes)
