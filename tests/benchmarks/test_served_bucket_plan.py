"""The pure parts of benchmarks/served_bucket_plan.py (no server): the seeded workload,
reading a table row from the metrics text the server's own collectors write, and the
planner's replay of a trace."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from benchmarks.served_bucket_plan import (WORDS, make_prompts, metric, parse_metrics,
                                           phase_result, replay)
from vllm.engine.bucket_metrics import BucketMetrics


def test_prompts_are_seeded_and_within_bounds():
    a = make_prompts(3, 5, 4, 40, seed=1)
    assert a == make_prompts(3, 5, 4, 40, seed=1)
    assert a != make_prompts(3, 5, 4, 40, seed=2)
    assert [len(r) for r in a] == [5, 5, 5]
    counts = [len(p.split()) for r in a for p in r]
    assert min(counts) >= 4 and max(counts) <= 40 and len(set(counts)) > 1
    assert all(w in WORDS for r in a for p in r for w in p.split())


def _metrics_text() -> str:
    reg = CollectorRegistry()
    labels, values = ["model_name"], ("m",)
    buckets = BucketMetrics(reg, labels, values)
    compiles = Counter("vllm:hpu_graph_compilations", "", labels, registry=reg)
    compiles.labels(*values).inc(2)
    Gauge("vllm:other", "", ["phase"], registry=reg).labels("prompt").set(7)
    buckets.update({"padded_tokens": {"prompt": 400, "decode": 100},
                    "real_tokens": {"prompt": 300, "decode": 99},
                    "padding_waste": {"prompt": 0.25, "decode": 0.01},
                    "bucket_hits": {"prompt:1,256,0": 3}, "fallback_passes": 5,
                    "warmup_seconds": 12.5, "cold_buckets": []})
    return generate_latest(reg).decode()


def test_row_from_prometheus_text():
    samples = parse_metrics(_metrics_text())
    assert metric(samples, "vllm:hpu_padded_tokens_total", phase="prompt") == 400
    assert metric(samples, "vllm:hpu_bucket_hits_total", bucket="1,256,0") == 3
    with pytest.raises(KeyError, match="vllm:hpu_padding_waste_ratio"):
        metric(samples, "vllm:hpu_padding_waste_ratio", phase="encode")
    row = phase_result("default", samples, {"prompt": 0.2, "decode": 0.0},
                       {"prompt": 0.24, "decode": 0.01})
    assert row.measured_waste == {"prompt": 0.25, "decode": 0.01}
    assert (row.compiles_after_warmup, row.fallback_passes, row.warmup_s) == (2, 5, 12.5)
    assert row.row() == ("| default | 25.00% (20.00%; 24.00%) | 1.00% (0.00%; 1.00%) "
                         "| 2 | 5 | 12 s |")


def test_replay_matches_the_planner(tmp_path):
    """The script's replay of a trace is the planner's: with the default buckets a
    decode pass of 3 rows and 5 blocks runs in (4, 8); with a plan made from the
    trace, the replay is the prediction written into the plan."""
    from vllm.hpu.bucket_planner import make_plan
    from vllm.hpu.bucket_trace import EngineLimits, TracePass, TraceRecorder, read_trace
    from vllm.hpu.padding_cost import DECODE_ROW_WEIGHT, decode_cost

    limits = EngineLimits(128, 8, 1024, 1024, 8)
    path = str(tmp_path / "trace.jsonl")
    rec = TraceRecorder(path, limits)
    for lens in ([398], [158, 71, 87, 429], [312, 19, 56], [562, 34]):
        rec.record(TracePass.prompt_set(lens, [0] * len(lens), 128))
    rec.record(TracePass("decode", 3, 1, 5))
    rec.close()
    default = replay(path)
    expect = 1 - (decode_cost(3, 5, 128, DECODE_ROW_WEIGHT)
                  / decode_cost(4, 8, 128, DECODE_ROW_WEIGHT))
    assert default["decode"] == pytest.approx(expect)
    plan = make_plan(read_trace(path)[1], limits, 16, 26)
    plan.save(str(tmp_path / "plan.json"))
    planned = replay(path, str(tmp_path / "plan.json"))
    assert planned == pytest.approx(plan.predicted_waste)
    assert planned["prompt"] < default["prompt"]
