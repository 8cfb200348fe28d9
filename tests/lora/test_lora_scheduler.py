"""Scheduler: never more distinct adapters in a step than max_loras; prefix-cache hashes
include the adapter."""
from __future__ import annotations

from types import SimpleNamespace

from vllm.core.scheduler import Scheduler
from vllm.lora.request import LoRARequest
from vllm.request import Request
from vllm.sampling_params import SamplingParams


def _scheduler(max_loras: int, caching: bool = True) -> Scheduler:
    config = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=16, max_num_batched_tokens=512,
                                         enable_chunked_prefill=True, async_scheduling=False,
                                         policy="fcfs"),
        model_config=SimpleNamespace(max_model_len=256, vocab_size=64),
        structured_outputs_config=None,
        cache_config=SimpleNamespace(block_size=4, enable_prefix_caching=caching),
        lora_config=SimpleNamespace(max_loras=max_loras))
    return Scheduler(config, num_blocks=256)


def _request(rid: str, lora_id: int, tokens: list[int]) -> Request:
    lora = LoRARequest(f"a{lora_id}", lora_id, f"/adapters/{lora_id}") if lora_id else None
    return Request(rid, tokens, SamplingParams(max_tokens=4), eos_token_id=None,
                   lora_request=lora)


def test_step_holds_at_most_max_loras_adapters_and_others_go_ahead():
    sched = _scheduler(max_loras=2)
    for rid, lora_id in (("r1", 1), ("r2", 2), ("r3", 3), ("r4", 0), ("r5", 1)):
        sched.add_request(_request(rid, lora_id, [1, 2, 3, 4, 5]))
    out = sched.schedule()
    assert set(out.num_scheduled_tokens) == {"r1", "r2", "r4", "r5"}
    assert {r.lora_request.lora_int_id for r in out.scheduled_new_reqs
            if r.lora_request} == {1, 2}
    assert [r.request_id for r in sched.waiting] == ["r3"]  # kept its place
    stats = sched.get_stats()
    assert stats.running_lora_adapters == {"a1": 2, "a2": 1}
    assert stats.waiting_lora_adapters == {"a3": 1}
    # Once the adapters of the running requests leave, the waiting one is admitted.
    for rid in ("r1", "r2", "r5"):
        sched.finish_requests([rid], sched.requests[rid].status.FINISHED_ABORTED)
    out = sched.schedule()
    assert "r3" in out.num_scheduled_tokens


def test_block_hashes_depend_on_the_adapter():
    sched = _scheduler(max_loras=4)
    tokens = list(range(12))
    reqs = [_request("base", 0, tokens), _request("a", 1, tokens), _request("b", 2, tokens),
            _request("a2", 1, tokens)]
    hashes = [sched.kv_cache_manager._update_block_hashes(r) for r in reqs]
    assert len(hashes[0]) == 3
    assert len({tuple(h) for h in hashes}) == 3
    assert hashes[1] == hashes[3]
