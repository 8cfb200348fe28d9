"""One worker, in the engine's own process (world size 1; the default).

With async scheduling the worker is driven from one "step thread": a step runs there
while the engine schedules the next one on its own thread (torch releases the GIL in
its kernels, so the two overlap). Every other call on the worker (admin operations)
goes through the same thread, after the steps already submitted: the worker is never
used by two threads at once, and calls keep their order.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional

from vllm.executor.executor_base import ExecutorBase, WorkerMethod, resolve_worker_cls, \
    run_worker_method


class UniProcExecutor(ExecutorBase):

    def _init_executor(self) -> None:
        self.worker = resolve_worker_cls()(self.vllm_config, local_rank=0, rank=0)
        self.worker.init_device()
        self.worker.load_model()
        self._step_thread: Optional[ThreadPoolExecutor] = None
        if self.vllm_config.scheduler_config.async_scheduling:
            import torch
            self._step_thread = ThreadPoolExecutor(
                1, thread_name_prefix="vllm-step", initializer=torch.set_num_threads,
                initargs=(torch.get_num_threads(),))

    def collective_rpc(self, method: WorkerMethod, timeout: Optional[float] = None,
                       args: tuple = (), kwargs: Optional[dict[str, Any]] = None,
                       unique_reply_rank: Optional[int] = None) -> list[Any]:
        """A direct call on the one worker (`timeout` cannot interrupt it)."""
        if self._step_thread is not None:
            return [self._step_thread.submit(run_worker_method, self.worker, method, args,
                                             kwargs).result()]
        return [run_worker_method(self.worker, method, args, kwargs)]

    def execute_model(self, scheduler_output):
        # The step skips the list wrapping: it runs every few milliseconds.
        if self._step_thread is not None:
            return self.execute_model_async(scheduler_output).result()
        return self.worker.execute_model(scheduler_output)

    def execute_model_async(self, scheduler_output) -> Future:
        if self._step_thread is None:
            return super().execute_model_async(scheduler_output)
        return self._step_thread.submit(self.worker.execute_model, scheduler_output)

    def check_health(self) -> None:
        self.worker.check_health()

    def shutdown(self) -> None:
        if self._step_thread is not None:
            self._step_thread.shutdown(wait=True)
        self.worker.shutdown()
