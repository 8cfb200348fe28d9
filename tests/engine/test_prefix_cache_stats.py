"""Prefix-cache statistics count each admitted request's lookup once, not once per step
that a waiting request fails to get blocks."""
from __future__ import annotations

import pytest

from vllm.core.scheduler import Scheduler
from vllm.engine.arg_utils import EngineArgs
from vllm.request import Request, RequestStatus
from vllm.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine_config(tiny_model_factory):
    return EngineArgs(model=tiny_model_factory("llama"), max_model_len=64, block_size=4,
                      max_num_seqs=8, max_num_batched_tokens=64,
                      enable_chunked_prefill=False).create_engine_config()


@pytest.fixture
def make_scheduler(engine_config):
    return lambda num_blocks: Scheduler(engine_config, num_blocks)


def _request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4), eos_token_id=None)


def test_blocked_waiting_request_is_counted_once(make_scheduler):
    sched = make_scheduler(4)
    sched.add_request(_request("a", list(range(12))))
    sched.add_request(_request("b", list(range(100, 112))))
    out = sched.schedule()
    assert list(out.num_scheduled_tokens) == ["a"]
    for _ in range(5):  # "b" cannot get blocks while "a" holds 3 of 4
        sched.schedule()
        assert [r.request_id for r in sched.waiting] == ["b"]
    stats = sched.get_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (12, 0)
    sched.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    out = sched.schedule()
    assert list(out.num_scheduled_tokens) == ["b"]
    stats = sched.get_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (24, 0)


def test_hits_counted_at_admission(make_scheduler):
    sched = make_scheduler(16)
    kv = sched.kv_cache_manager
    first = _request("a", list(range(12)))
    sched.add_request(first)
    sched.schedule()
    first.num_computed_tokens = 12
    kv.allocate_slots(first, 0)  # caches its full blocks
    second = _request("b", list(range(12)) + [99])
    sched.add_request(second)
    sched.schedule()
    sched.schedule()
    stats = sched.get_stats()
    assert stats.prefix_cache_queries == 12 + 13
    assert stats.prefix_cache_hits == second.num_cached_tokens == 12
