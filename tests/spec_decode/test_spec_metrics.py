"""vLLM's spec-decode counters and the logged acceptance rate, fed from SchedulerStats."""
from __future__ import annotations

import logging

from vllm.core.scheduler import SchedulerStats
from vllm.engine.metrics import StatsTracker, iter_metric_names
from vllm.spec_decode.metrics import SpecDecodingStats

LABELS = {"model_name": "m", "engine": "0"}


def test_counters_follow_the_cumulative_stats_and_the_rate_is_logged(caplog):
    tracker = StatsTracker("m", max_model_len=64, log_stats=True, num_spec_tokens=2)
    names = set(iter_metric_names(tracker.registry))
    assert {"vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_per_pos_total"} <= names
    spec = SpecDecodingStats(num_spec_tokens=2)
    spec.observe_draft(2, 2)
    spec.observe_draft(2, 1)
    tracker.on_scheduler_stats(SchedulerStats(spec_decoding_stats=spec.copy()))
    spec.observe_draft(2, 0)
    tracker.on_scheduler_stats(SchedulerStats(spec_decoding_stats=spec.copy()))
    value = tracker.registry.get_sample_value
    assert value("vllm:spec_decode_num_drafts_total", LABELS) == 3
    assert value("vllm:spec_decode_num_draft_tokens_total", LABELS) == 6
    assert value("vllm:spec_decode_num_accepted_tokens_total", LABELS) == 3
    assert value("vllm:spec_decode_num_accepted_tokens_per_pos_total",
                 {**LABELS, "position": "0"}) == 2
    assert value("vllm:spec_decode_num_accepted_tokens_per_pos_total",
                 {**LABELS, "position": "1"}) == 1
    tracker._window.active = True
    with caplog.at_level(logging.INFO, logger="vllm"):
        tracker.maybe_log(force=True)
    assert "Avg Draft acceptance rate: 50.0%" in caplog.text
    assert "Mean acceptance length: 2.00" in caplog.text


def test_no_spec_counters_without_speculation():
    tracker = StatsTracker("m", max_model_len=64, log_stats=False)
    assert not any(n.startswith("vllm:spec_decode") for n in iter_metric_names(tracker.registry))


def test_served_engine_exports_the_counters(tiny_model_factory):
    """The async engine (what the server serves) advances the counters after steps."""
    import asyncio

    from tests.spec_decode.test_spec_decode_e2e import COMMON, NGRAM, PROMPTS
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.engine.async_llm_engine import AsyncLLMEngine
    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(
        model=tiny_model_factory("llama"), speculative_config=NGRAM, **COMMON))
    try:
        params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)

        async def run():
            return [o async for o in engine.generate(PROMPTS[0], params, "r0")]

        outs = asyncio.run(run())
        assert len(outs[-1].outputs[0].token_ids) == 24
        value = engine.stats.registry.get_sample_value
        assert value("vllm:spec_decode_num_drafts_total", {**LABELS, "model_name":
                     engine.model_config.served_model_name[0]}) > 0
        accepted = value("vllm:spec_decode_num_accepted_tokens_total",
                         {**LABELS, "model_name": engine.model_config.served_model_name[0]})
        assert accepted > 0
    finally:
        engine.shutdown()
