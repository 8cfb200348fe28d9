"""--scheduling-policy priority in the scheduler: order by (priority, arrival), the
worst running request is the one preempted, and a better waiting request preempts it."""
from __future__ import annotations

from _core_helpers import fake_runner_output, make_request, make_scheduler, step

from vllm.request import RequestStatus


def _request(req_id: str, priority: int, arrival: float, **kw):
    request = make_request(req_id, first_token=1000 + 100 * int(req_id[1:]), **kw)
    request.priority = priority
    request.arrival_time = arrival
    return request


def test_waiting_requests_run_by_priority_then_arrival():
    sched = make_scheduler(max_num_seqs=2, policy="priority")
    for req_id, prio, arrival in (("r0", 5, 1.0), ("r1", 0, 3.0), ("r2", 0, 2.0),
                                  ("r3", -1, 4.0)):
        sched.add_request(_request(req_id, prio, arrival, prompt_len=4))
    assert [r.request_id for r in sched.waiting] == ["r3", "r2", "r1", "r0"]
    so = sched.schedule()
    assert [r.req_id for r in so.scheduled_new_reqs] == ["r3", "r2"]


def test_fcfs_ignores_priority_order():
    sched = make_scheduler(max_num_seqs=2)
    for req_id, prio, arrival in (("r0", 5, 1.0), ("r1", 0, 2.0), ("r2", -1, 3.0)):
        sched.add_request(_request(req_id, prio, arrival, prompt_len=4))
    so = sched.schedule()
    assert [r.req_id for r in so.scheduled_new_reqs] == ["r0", "r1"]


def test_better_waiting_request_preempts_the_worst_running_one_when_seqs_are_full():
    sched = make_scheduler(max_num_seqs=2, policy="priority")
    sched.add_request(_request("r0", 1, 1.0, prompt_len=4))
    sched.add_request(_request("r1", 2, 2.0, prompt_len=4))
    step(sched)
    sched.add_request(_request("r2", 0, 3.0, prompt_len=4))
    so = sched.schedule()
    # r1 (priority 2) is the worst: its decode step is withdrawn and r2 runs instead.
    assert [r.request_id for r in sched.running] == ["r2", "r0"]
    assert sorted(so.num_scheduled_tokens) == ["r0", "r2"]
    assert all(c.req_id != "r1" for c in so.scheduled_cached_reqs)
    victim = sched.requests["r1"]
    assert victim.status == RequestStatus.PREEMPTED and victim.num_computed_tokens == 0
    assert sched.kv_cache_manager.get_block_ids("r1") == []
    assert sched.num_preemptions == 1
    sched.update_from_output(so, fake_runner_output(so, sched))


def test_a_worse_or_equal_waiting_request_does_not_preempt():
    sched = make_scheduler(max_num_seqs=2, policy="priority")
    sched.add_request(_request("r0", 1, 1.0, prompt_len=4))
    sched.add_request(_request("r1", 1, 2.0, prompt_len=4))
    step(sched)
    sched.add_request(_request("r2", 1, 3.0, prompt_len=4))  # equal priority, later
    so = sched.schedule()
    assert sched.num_preemptions == 0 and "r2" not in so.num_scheduled_tokens


def test_better_waiting_request_preempts_when_the_kv_pool_is_full():
    # 4-token blocks, 6 blocks: two 8-token prompts (+1 token) hold 2-3 blocks each.
    sched = make_scheduler(num_blocks=6, block_size=4, enable_prefix_caching=False,
                           policy="priority")
    sched.add_request(_request("r0", 3, 1.0, prompt_len=8))
    sched.add_request(_request("r1", 1, 2.0, prompt_len=8))
    step(sched)
    step(sched)  # each now holds 3 blocks: the pool is full
    sched.add_request(_request("r2", 0, 3.0, prompt_len=8))
    so = sched.schedule()
    assert "r2" in so.num_scheduled_tokens and "r0" not in so.num_scheduled_tokens
    assert sched.requests["r0"].status == RequestStatus.PREEMPTED
    assert [r.request_id for r in sched.waiting] == ["r0"]
    sched.update_from_output(so, fake_runner_output(so, sched))


def test_running_request_short_of_blocks_preempts_the_worst_priority():
    """Under fcfs the latest started goes; under priority the worst ranked, even if it
    started first."""
    sched = make_scheduler(num_blocks=7, block_size=4, enable_prefix_caching=False,
                           policy="priority")
    sched.add_request(_request("r0", 9, 1.0, prompt_len=8))
    step(sched)
    sched.add_request(_request("r1", 0, 2.0, prompt_len=8))
    sched.add_request(_request("r2", 1, 3.0, prompt_len=8))
    step(sched)  # 3 requests x 3 blocks > 7: someone must go
    step(sched)
    assert sched.requests["r0"].status == RequestStatus.PREEMPTED
    assert {r.request_id for r in sched.running} == {"r1", "r2"}


def test_priority_requests_all_finish():
    sched = make_scheduler(num_blocks=8, block_size=4, max_num_seqs=2, policy="priority",
                           enable_prefix_caching=False)
    for i in range(6):
        sched.add_request(_request(f"r{i}", i % 3, float(i), prompt_len=6, max_tokens=5))
    for _ in range(200):
        if not sched.has_unfinished_requests():
            break
        step(sched)
    assert not sched.has_unfinished_requests()
