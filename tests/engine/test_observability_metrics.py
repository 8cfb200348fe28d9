"""The opt-in metric families (--kv-cache-metrics, --enable-mfu-metrics,
--show-hidden-metrics-for-version), the sleep-state gauge and the rope-scaled context."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest

from vllm.config import ObservabilityConfig
from vllm.core.block_pool import BlockPool
from vllm.core.kv_cache_metrics import KVCacheMetricsCollector
from vllm.core.scheduler import SchedulerStats
from vllm.engine.metrics import StatsTracker
from vllm.engine.perf_metrics import ModelShape, PerfModel


def text(tracker: StatsTracker) -> str:
    return generate_latest(tracker.registry).decode()


def test_block_pool_reports_sampled_evictions():
    pool = BlockPool(4, True, metrics_collector=KVCacheMetricsCollector(sample_rate=1.0))
    blocks = pool.get_new_blocks(4)
    pool.free_blocks(blocks)
    pool.touch(blocks[:1])  # a prefix hit: a second access
    pool.free_blocks(blocks[:1])
    pool.get_new_blocks(4)  # every block's content is overwritten: 4 evictions
    events = pool.metrics_collector.drain_events()
    assert len(events) == 4 and all(e.lifetime_seconds >= e.idle_seconds >= 0 for e in events)
    assert sorted(len(e.reuse_gaps_seconds) for e in events) == [0, 0, 0, 1]
    assert pool.metrics_collector.drain_events() == []


def test_kv_block_histograms_observe_each_batch_once():
    from vllm.core.kv_cache_metrics import KVCacheEvictionEvent
    tracker = StatsTracker("m", 64, log_stats=False,
                           observability_config=ObservabilityConfig(kv_cache_metrics=True))
    stats = SchedulerStats(kv_cache_eviction_events=[KVCacheEvictionEvent(2.0, 1.0, [0.5])])
    tracker.on_scheduler_stats(stats)
    tracker.on_scheduler_stats(stats)  # same message read again
    body = text(tracker)
    assert 'vllm:kv_block_lifetime_seconds_count{engine="0",model_name="m"} 1.0' in body
    assert 'vllm:kv_block_reuse_gap_seconds_sum{engine="0",model_name="m"} 0.5' in body


def test_mfu_counters_and_peak():
    hf = SimpleNamespace(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=100, intermediate_size=128)
    shape = ModelShape.from_hf_config(hf)
    tracker = StatsTracker("m", 64, log_stats=False, perf_model=PerfModel(shape),
                           device_model="Gaudi2",
                           observability_config=ObservabilityConfig(enable_mfu_metrics=True))
    tracker.on_request_added("r", SimpleNamespace(n=1))
    out = SimpleNamespace(request_id="r", prompt_token_ids=[1, 2, 3], num_cached_tokens=0,
                          finished=False, metrics=None, outputs=[SimpleNamespace(
                              index=0, token_ids=[7], finish_reason=None)])
    tracker.on_step([out])
    expected = (PerfModel(shape).tokens(3, 0).flops + PerfModel(shape).tokens(1, 3).flops)
    body = text(tracker)
    assert f'vllm:estimated_flops_per_gpu_total{{engine="0",model_name="m"}} {expected}' in body
    assert 'vllm:peak_flops_per_gpu{engine="0",model_name="m"} 4.32e+14' in body
    assert "vllm:estimated_read_bytes_per_gpu_total" in body


def test_hidden_metrics_only_for_the_previous_minor_version():
    shown = StatsTracker("m", 64, log_stats=False, observability_config=ObservabilityConfig(
        show_hidden_metrics_for_version="0.31"))
    shown.on_scheduler_stats(SchedulerStats(kv_cache_usage=0.5, prefix_cache_queries=10))
    assert 'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5' in text(shown)
    assert "vllm:gpu_prefix_cache_queries_total" in text(shown)
    hidden = StatsTracker("m", 64, log_stats=False, observability_config=ObservabilityConfig(
        show_hidden_metrics_for_version="0.20"))
    assert "gpu_cache_usage_perc" not in text(hidden)
    with pytest.raises(ValueError, match="0.31"):
        StatsTracker("m", 64, observability_config=ObservabilityConfig(
            show_hidden_metrics_for_version="latest"))


def test_sleep_state_gauge():
    tracker = StatsTracker("m", 64, log_stats=False)
    tracker.on_sleep_state(2)
    assert 'sleep_state="discard_all"} 1.0' in text(tracker)
    assert 'sleep_state="awake"} 0.0' in text(tracker)


def test_observability_config_validation():
    with pytest.raises(ValueError, match="otlp_traces_endpoint"):
        ObservabilityConfig(collect_detailed_traces=["model"])
    with pytest.raises(ValueError, match="unknown module"):
        ObservabilityConfig(collect_detailed_traces=["gpu"], otlp_traces_endpoint="x")
    with pytest.raises(ValueError, match="kv_cache_metrics_sample"):
        ObservabilityConfig(kv_cache_metrics_sample=0)


def test_rope_scaled_context_and_long_max_model_len(monkeypatch):
    from vllm.config import _scaled_by_rope
    yarn = SimpleNamespace(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                         "original_max_position_embeddings": 4096})
    assert _scaled_by_rope(yarn, 32768) == 16384
    assert _scaled_by_rope(SimpleNamespace(rope_scaling={"rope_type": "llama3",
                                                         "factor": 8.0}), 131072) == 131072
    assert _scaled_by_rope(SimpleNamespace(rope_scaling=None), 2048) == 2048
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import create_model_config
    with pytest.raises(ValueError, match="VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        create_model_config(model=DEFAULT_MODEL, max_model_len=10**7)
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    assert create_model_config(model=DEFAULT_MODEL, max_model_len=10**7).max_model_len == 10**7
