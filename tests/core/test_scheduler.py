"""Scheduler unit tests on synthetic requests: budget, chunking, preemption, finished ids."""
from __future__ import annotations

from _core_helpers import fake_runner_output, make_request, make_scheduler, step

from vllm.request import RequestStatus


def test_token_budget_is_shared_and_waiting_prompts_chunk():
    sched = make_scheduler(max_num_batched_tokens=16)
    for i in range(3):
        sched.add_request(make_request(f"r{i}", prompt_len=10, first_token=100 * (i + 1)))
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"r0": 10, "r1": 6}
    assert so.total_num_scheduled_tokens == 16
    assert [r.req_id for r in so.scheduled_new_reqs] == ["r0", "r1"]
    sched.update_from_output(so, fake_runner_output(so, sched))
    # Running requests first: r0 decodes, r1 finishes its prompt, r2 gets the rest.
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"r0": 1, "r1": 4, "r2": 10}
    assert [c.req_id for c in so.scheduled_cached_reqs] == ["r0", "r1"]


def test_without_chunked_prefill_a_prompt_waits_for_budget():
    sched = make_scheduler(max_num_batched_tokens=16, enable_chunked_prefill=False)
    sched.add_request(make_request("a", prompt_len=10))
    sched.add_request(make_request("b", prompt_len=10, first_token=500))
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 10}
    assert [r.request_id for r in sched.waiting] == ["b"]


def test_max_num_seqs_caps_running_requests():
    sched = make_scheduler(max_num_seqs=2)
    for i in range(3):
        sched.add_request(make_request(f"r{i}", prompt_len=4, first_token=100 * (i + 1)))
    so = sched.schedule()
    assert list(so.num_scheduled_tokens) == ["r0", "r1"]


def _fill_pool():
    """4-token blocks, 7 blocks: three 8-token prompts take 6, decoding needs more."""
    sched = make_scheduler(num_blocks=7, block_size=4, enable_prefix_caching=False)
    for i in range(3):
        sched.add_request(make_request(f"r{i}", prompt_len=8, first_token=100 * (i + 1)))
    step(sched)  # three prefills, one token each: 9 tokens per request, 3 blocks needed
    return sched


def test_preemption_takes_the_latest_started_request_first():
    sched = _fill_pool()
    so = sched.schedule()
    # r0 takes the last free block; r1 then needs one more: r2 (started last) goes.
    assert sched.num_preemptions == 1
    assert list(so.num_scheduled_tokens) == ["r0", "r1"]
    victim = sched.waiting[0]
    assert victim.request_id == "r2" and victim.status == RequestStatus.PREEMPTED
    assert victim.num_computed_tokens == 0
    # Nobody new is admitted in a step that preempted.
    assert so.scheduled_new_reqs == []


def test_preempted_request_is_resumed_not_resent():
    """Workers keep a preempted request's state: it is not reported finished, and it
    comes back as a resumed cached request with its whole new block table."""
    sched = _fill_pool()
    so = sched.schedule()
    assert "r2" not in so.finished_req_ids
    sched.update_from_output(so, fake_runner_output(so, sched))
    sched.finish_requests(["r0"], RequestStatus.FINISHED_ABORTED)
    so = sched.schedule()
    assert so.finished_req_ids == {"r0"}
    resumed = [c for c in so.scheduled_cached_reqs if c.req_id == "r2"]
    assert len(resumed) == 1 and resumed[0].resumed_from_preemption
    assert resumed[0].new_block_ids == sched.kv_cache_manager.get_block_ids("r2")
    assert resumed[0].num_computed_tokens == 0
    assert all(r.req_id != "r2" for r in so.scheduled_new_reqs)
    # It recomputes prompt + output in one go.
    request = sched.requests["r2"]
    assert so.num_scheduled_tokens["r2"] == request.num_tokens


def test_finished_ids_are_reported_once():
    sched = make_scheduler()
    sched.add_request(make_request("done", prompt_len=4, max_tokens=1))
    sched.add_request(make_request("running-abort", prompt_len=4, first_token=500))
    so = step(sched)
    assert so.finished_req_ids == set()
    assert "done" not in sched.requests  # max_tokens=1: finished by that step
    sched.finish_requests(["running-abort"], RequestStatus.FINISHED_ABORTED)
    so = sched.schedule()
    assert so.finished_req_ids == {"done", "running-abort"}
    assert sched.schedule().finished_req_ids == set()
    sched.add_request(make_request("never-run", prompt_len=4, first_token=700))
    sched.finish_requests(["never-run"], RequestStatus.FINISHED_ABORTED)
    assert "never-run" in sched.schedule().finished_req_ids
