"""EngineCore with a recording executor: what reaches the workers, step by step."""
from __future__ import annotations

from _core_helpers import fake_runner_output, make_config, make_request

from vllm.core.sched_output import SchedulerOutput
from vllm.engine.core import EngineCore
from vllm.request import RequestStatus


class RecordingExecutor:
    """Stands for the workers: remembers every SchedulerOutput it is given."""

    def __init__(self, vllm_config) -> None:
        self.outputs: list[SchedulerOutput] = []
        self.core = None

    def determine_num_available_blocks(self) -> int:
        return 64

    def initialize_cache(self, num_blocks: int) -> None:
        pass

    def execute_model(self, so: SchedulerOutput):
        self.outputs.append(so)
        return fake_runner_output(so, self.core.scheduler)


def _core(**config) -> tuple[EngineCore, RecordingExecutor]:
    core = EngineCore(make_config(**config), executor_class=RecordingExecutor)
    core.executor.core = core
    return core, core.executor


def test_finished_ids_reach_workers_when_the_last_request_is_aborted():
    """Aborting the last request leaves nothing to schedule; its id must still reach
    the workers (their state for it would leak otherwise)."""
    core, executor = _core()
    core.add_request(make_request("a", prompt_len=4, max_tokens=8))
    core.step()
    core.abort_requests(["a"])  # no later step may come: the ids go at once
    assert executor.outputs[-1].finished_req_ids == {"a"}
    assert executor.outputs[-1].total_num_scheduled_tokens == 0
    before = len(executor.outputs)
    assert core.step() == []
    assert len(executor.outputs) == before  # nothing left to tell: no call


def test_finished_ids_of_the_last_requests_reach_workers_after_their_step():
    core, executor = _core()
    core.add_request(make_request("a", prompt_len=4, max_tokens=2))
    core.step()
    core.step()  # a finishes (max_tokens=2); nothing else to run
    assert not core.has_unfinished_requests()
    assert executor.outputs[-1].finished_req_ids == {"a"}
    assert executor.outputs[-1].total_num_scheduled_tokens == 0


def test_finished_ids_reach_workers_when_only_waiting_requests_remain():
    """A step that schedules nothing (the waiting request does not fit) still forwards
    the ids finished since the last step."""
    core, executor = _core(enable_chunked_prefill=False, max_num_batched_tokens=64)
    core.add_request(make_request("a", prompt_len=4, max_tokens=1))
    core.step()  # a finishes (max_tokens=1)
    core.add_request(make_request("huge", prompt_len=65, first_token=1000))  # over budget
    core.step()
    so = executor.outputs[-1]
    assert so.total_num_scheduled_tokens == 0 and so.finished_req_ids == {"a"}


def test_stop_after_output_is_forwarded():
    core, executor = _core()
    core.add_request(make_request("a", prompt_len=4, max_tokens=8))
    core.add_request(make_request("b", prompt_len=4, max_tokens=8, first_token=500))
    core.step()
    core.abort_requests(["b"], RequestStatus.FINISHED_STOPPED)
    core.step()
    assert executor.outputs[-1].finished_req_ids == {"b"}
    assert list(executor.outputs[-1].num_scheduled_tokens) == ["a"]
