"""One worker, in the engine's own process (world size 1; the default)."""
from __future__ import annotations

from typing import Any, Optional

from vllm.executor.executor_base import ExecutorBase, WorkerMethod, resolve_worker_cls, \
    run_worker_method


class UniProcExecutor(ExecutorBase):

    def _init_executor(self) -> None:
        self.worker = resolve_worker_cls()(self.vllm_config, local_rank=0, rank=0)
        self.worker.init_device()
        self.worker.load_model()

    def collective_rpc(self, method: WorkerMethod, timeout: Optional[float] = None,
                       args: tuple = (), kwargs: Optional[dict[str, Any]] = None,
                       unique_reply_rank: Optional[int] = None) -> list[Any]:
        """A direct call on the one worker (`timeout` cannot interrupt it)."""
        return [run_worker_method(self.worker, method, args, kwargs)]

    def execute_model(self, scheduler_output):
        # The step skips the list wrapping: it runs every few milliseconds.
        return self.worker.execute_model(scheduler_output)

    def check_health(self) -> None:
        self.worker.check_health()

    def shutdown(self) -> None:
        self.worker.shutdown()
