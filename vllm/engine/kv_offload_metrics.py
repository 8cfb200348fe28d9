"""Prometheus families of the KV connector's prefix-cache tier (vLLM's names).

- `vllm:external_prefix_cache_queries_total` / `vllm:external_prefix_cache_hits_total`
  (always, as vLLM): prompt tokens of admitted requests while a KV connector was asked,
  and those it supplied. With KV offloading the hits are the prefix-cache hits served
  from host memory; `vllm:prefix_cache_hits_total` stays the device's.
- With KV offloading (--kv-offloading-size): `vllm:kv_offload_store_bytes_total` and
  `vllm:kv_offload_load_bytes_total` (vLLM's), and, ours, the same in blocks,
  `vllm:kv_offload_stored_blocks_total` / `vllm:kv_offload_loaded_blocks_total`, and
  `vllm:kv_offload_host_blocks_used` (host blocks holding KV).

The scheduler reports cumulative counts (SchedulerStats); counters grow by the
difference to the last report.
"""
from __future__ import annotations

from typing import Any, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge

from vllm.metrics.multiprocess import GAUGE_MODE


class KVConnectorMetrics:

    def __init__(self, registry: CollectorRegistry, labels: list[str], values: tuple,
                 offloading: bool) -> None:
        self._reg, self._labels, self._values = registry, labels, values
        self.external_queries = self._counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector across all requests, in terms "
            "of number of queried tokens.")
        self.external_hits = self._counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector across all requests, in terms of "
            "number of cached tokens.")
        self._last: dict[str, int] = {}
        self.offload: Optional[dict[str, Any]] = None
        if offloading:
            self._register_offload()

    def _counter(self, name: str, doc: str) -> Any:
        return Counter(name, doc, self._labels, registry=self._reg).labels(*self._values)

    def _register_offload(self) -> None:
        c = self._counter
        self.offload = {
            "store_bytes": c("vllm:kv_offload_store_bytes",
                             "Bytes of KV blocks copied from device to host memory."),
            "load_bytes": c("vllm:kv_offload_load_bytes",
                            "Bytes of KV blocks copied from host memory back to the device."),
            "stored_blocks": c("vllm:kv_offload_stored_blocks",
                               "KV blocks copied from device to host memory."),
            "loaded_blocks": c("vllm:kv_offload_loaded_blocks",
                               "KV blocks copied from host memory back to the device "
                               "(prefix-cache hits served from host memory)."),
            "used_blocks": Gauge("vllm:kv_offload_host_blocks_used",
                                 "Host-memory blocks holding offloaded KV.", self._labels,
                                 multiprocess_mode=GAUGE_MODE,
                                 registry=self._reg).labels(*self._values),
        }

    def _grow(self, key: str, counter: Any, total: int) -> None:
        last = self._last.get(key, 0)
        if total > last:
            counter.inc(total - last)
        self._last[key] = total

    def observe(self, stats: Any) -> None:
        self._grow("q", self.external_queries,
                   getattr(stats, "external_prefix_cache_queries", 0))
        self._grow("h", self.external_hits, getattr(stats, "external_prefix_cache_hits", 0))
        kv = getattr(stats, "kv_offload", None)
        if not kv:
            return
        if self.offload is None:
            self._register_offload()
        o, size = self.offload, kv["block_bytes"]
        self._grow("stored", o["stored_blocks"], kv["stored_blocks"])
        self._grow("loaded", o["loaded_blocks"], kv["loaded_blocks"])
        self._grow("stored_bytes", o["store_bytes"], kv["stored_blocks"] * size)
        self._grow("loaded_bytes", o["load_bytes"], kv["loaded_blocks"] * size)
        o["used_blocks"].set(kv["used_blocks"])
