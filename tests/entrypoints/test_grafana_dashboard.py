"""Every metric the Grafana dashboard (examples/grafana/) queries exists in our /metrics:
the serving families from a tracker fed one request, the HPU ones from the metric
definitions fed the runner's compile stats (as a fake-HPU server feeds them), the HTTP
ones from an instrumented app."""
from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vllm.core.scheduler import SchedulerStats
from vllm.engine.metrics import StatsTracker

DASHBOARD = Path(__file__).resolve().parents[2] / "examples" / "grafana" / \
    "vllm_hpu_dashboard.json"
METRIC = re.compile(r"\b((?:vllm:|http_)[a-zA-Z0-9_:]+)")

HPU_COMPILE_STATS = {"num_compiles_after_warmup": 2, "buckets": {
    "padded_tokens": {"prompt": 128, "decode": 64}, "real_tokens": {"prompt": 100, "decode": 60},
    "padding_waste": {"prompt": 0.2, "decode": 0.06}, "bucket_hits": {"prompt:1,128,0": 3},
    "fallback_passes": 1, "warmup_seconds": 12.5, "cold_buckets": [[1, 256, 0]],
    "graph_memory_bytes": {"prompt": 3 << 20, "decode": 1 << 20}}}


def queried_metrics() -> set[str]:
    names = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            names |= set(METRIC.findall(target["expr"]))
    return names


def exported_samples() -> set[str]:
    tracker = StatsTracker("m", 256, log_stats=False)
    tracker.on_request_added("r", SimpleNamespace(n=1), max_tokens=2)
    out = SimpleNamespace(request_id="r", prompt_token_ids=[1, 2, 3], num_cached_tokens=0,
                          finished=True, metrics=None, outputs=[SimpleNamespace(
                              index=0, token_ids=[5, 6], finish_reason="length")])
    tracker.on_step([out])
    tracker.on_scheduler_stats(SchedulerStats(num_running_reqs=1, prefix_cache_queries=3))
    tracker.on_compile_stats(HPU_COMPILE_STATS)
    text = generate_latest(tracker.registry).decode()
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    return names | http_samples()


def http_samples() -> set[str]:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from vllm.entrypoints.openai.http_observability import instrument_http
    app = FastAPI()

    @app.get("/v1/models")
    def models() -> dict:
        return {}

    registry = instrument_http(app)
    TestClient(app).get("/v1/models")
    text = generate_latest(registry).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_every_queried_metric_is_exported():
    queried = queried_metrics()
    assert {"vllm:hpu_graph_compilations_total", "vllm:hpu_padding_waste_ratio",
            "vllm:hpu_bucket_hits_total", "vllm:time_to_first_token_seconds_bucket",
            "vllm:kv_cache_usage_perc"} <= queried
    missing = sorted(queried - exported_samples())
    assert not missing, missing


def test_panels_cover_serving_and_hpu():
    titles = " ".join(p["title"] for p in json.loads(DASHBOARD.read_text())["panels"])
    for word in ("throughput", "first token", "output token", "End-to-end", "Scheduler",
                 "KV cache", "Prefix cache", "compilations", "padding", "bucket hits",
                 "graph memory"):
        assert word.lower() in titles.lower(), word
