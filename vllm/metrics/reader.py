"""A snapshot of the engine's Prometheus metrics as plain objects (`LLM.get_metrics()`),
with vLLM's classes: `Counter`, `Gauge`, `Histogram` (and `Vector`, the per-position
counter family of speculative decoding)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Metric:
    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    value: int


@dataclass
class Vector(Metric):
    values: list[int]


@dataclass
class Gauge(Metric):
    value: float


@dataclass
class Histogram(Metric):
    """Counts per bucket upper limit (the 'le' label; '+Inf' always present)."""
    count: int
    sum: float
    buckets: dict[str, int]


def get_metrics_snapshot(registry: Any) -> list[Metric]:
    """Every `vllm:` metric of a prometheus_client registry, one object per label set."""
    collected: list[Metric] = []
    for family in registry.collect():
        if not family.name.startswith("vllm:"):
            continue
        if family.type == "gauge":
            collected += [Gauge(family.name, dict(s.labels), s.value)
                          for s in _samples(family, "")]
        elif family.type == "counter":
            collected += [Counter(family.name, dict(s.labels), int(s.value))
                          for s in _samples(family, "_total")]
        elif family.type == "histogram":
            collected += _histograms(family)
    return collected


def _samples(family: Any, suffix: str) -> list[Any]:
    return [s for s in family.samples if s.name == family.name + suffix]


def _histograms(family: Any) -> list[Histogram]:
    by_labels: dict[frozenset, Histogram] = {}
    for s in _samples(family, "_bucket"):
        labels = {k: v for k, v in s.labels.items() if k != "le"}
        key = frozenset(labels.items())
        hist = by_labels.setdefault(key, Histogram(family.name, labels, 0, 0.0, {}))
        hist.buckets[s.labels["le"]] = int(s.value)
    for suffix, field in (("_count", "count"), ("_sum", "sum")):
        for s in _samples(family, suffix):
            hist = by_labels.get(frozenset(s.labels.items()))
            if hist is not None:
                setattr(hist, field, int(s.value) if field == "count" else float(s.value))
    return list(by_labels.values())
