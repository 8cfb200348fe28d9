"""Compile accounting reaches the metrics (HPU); the CPU engine reports none."""
from vllm.engine.metrics import StatsTracker


def test_cpu_engine_reports_no_compile_stats(default_llm):
    assert default_llm.llm_engine.get_compile_stats() is None


def test_compile_counter_follows_worker_count():
    tracker = StatsTracker("m", max_model_len=64, log_stats=False)
    tracker.on_compile_stats(None)
    tracker.on_compile_stats({"num_compiles_after_warmup": 2})
    tracker.on_compile_stats({"num_compiles_after_warmup": 3})
    value = tracker.registry.get_sample_value("vllm:hpu_graph_compilations_total",
                                              {"model_name": "m", "engine": "0"})
    assert value == 3.0
