"""The scheduler's side of speculative decoding on synthetic requests: draft budgeting,
KV slots for drafts, rollback of rejected drafts, no overshoot past stops."""
from __future__ import annotations

from types import SimpleNamespace

from tests.core._core_helpers import make_config, make_request

from vllm.core.sched_output import ModelRunnerOutput
from vllm.core.scheduler import Scheduler
from vllm.request import RequestStatus


def _scheduler(k: int = 3, **config) -> Scheduler:
    cfg = make_config(**config)
    cfg.speculative_config = SimpleNamespace(num_speculative_tokens=k)
    return Scheduler(cfg, 64)


def _output(so, tokens: dict[str, list[int]], drafts: dict[str, list[int]] = {}):
    req_ids = list(so.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids=req_ids,
                             sampled_token_ids=[tokens.get(r, []) for r in req_ids],
                             spec_token_ids=drafts)


def _prefill(sched, request, drafts):
    sched.add_request(request)
    so = sched.schedule()
    sched.update_from_output(so, _output(so, {request.request_id: [50]},
                                         {request.request_id: drafts}))


def test_drafts_are_scheduled_with_slots_and_rejected_ones_rolled_back():
    sched = _scheduler(block_size=4)
    req = make_request("a", prompt_len=8, max_tokens=20)
    _prefill(sched, req, [60, 61, 62])
    so = sched.schedule()
    # The new token + 3 drafts, KV slots for positions 8..11 (one more block).
    assert so.num_scheduled_tokens == {"a": 4}
    assert so.scheduled_spec_decode_tokens == {"a": [60, 61, 62]}
    assert len(sched.kv_cache_manager.get_block_ids("a")) == 3
    # Drafts 60 accepted, 61 rejected: tokens 60 and the recovered 70.
    sched.update_from_output(so, _output(so, {"a": [60, 70]}, {"a": [80]}))
    assert req.output_token_ids == [50, 60, 70]
    assert req.num_computed_tokens == 10  # prompt + 50 + 60 (70's KV is next step's)
    stats = sched.get_stats().spec_decoding_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 3, 1)
    assert stats.num_accepted_tokens_per_pos == [1, 0, 0]
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 2}
    # Ranks that did not sample learn up to 1 + k tokens from the message.
    assert so.scheduled_cached_reqs[0].new_token_ids == [50, 60, 70]


def test_drafts_never_overshoot_max_tokens_budget_or_model_len():
    sched = _scheduler(max_num_batched_tokens=64)
    req = make_request("a", prompt_len=8, max_tokens=3)
    _prefill(sched, req, [1, 2, 3])
    so = sched.schedule()
    assert so.scheduled_spec_decode_tokens == {"a": [1]}  # 1 output + 1 draft + 1 = 3
    sched.update_from_output(so, _output(so, {"a": [1, 9]}))
    assert req.output_token_ids == [50, 1, 9]
    assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED
    tight = _scheduler(max_num_batched_tokens=3)
    req = make_request("b", prompt_len=2, max_tokens=20)
    _prefill(tight, req, [1, 2, 3])
    assert tight.schedule().scheduled_spec_decode_tokens == {"b": [1, 2]}
    short = _scheduler(max_model_len=12)
    req = make_request("c", prompt_len=8, max_tokens=20)
    _prefill(short, req, [1, 2, 3])
    assert short.schedule().scheduled_spec_decode_tokens == {"c": [1, 2]}


def test_tokens_after_a_stop_token_are_dropped():
    sched = _scheduler()
    req = make_request("a", prompt_len=8, max_tokens=20, stop_token_ids=[61])
    _prefill(sched, req, [60, 61, 62])
    so = sched.schedule()
    outs = sched.update_from_output(so, _output(so, {"a": [60, 61, 62, 63]}))
    assert req.output_token_ids == [50, 60, 61]
    assert outs[0].new_token_ids == [60, 61] and outs[0].finish_reason == "stop"
    assert "a" not in sched.requests


def test_preemption_and_chunked_prefill_schedule_no_drafts():
    sched = _scheduler(max_num_batched_tokens=6)
    req = make_request("a", prompt_len=10, max_tokens=20)
    sched.add_request(req)
    req.spec_token_ids = [1, 2]  # a stale proposal must not ride along a prefill chunk
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 6} and not so.scheduled_spec_decode_tokens
    sched._preempt(sched.running.pop())
    assert req.spec_token_ids == []
