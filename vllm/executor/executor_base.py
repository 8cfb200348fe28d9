"""The executor interface: how the engine core reaches its workers.

Every executor implements one call, `collective_rpc` (vLLM's signature): run a
worker method, or any function of the worker, on every rank and return the
ranks' results. Everything the engine core asks of its workers is built on it:
the lifecycle here (KV cache sizing, the step) and every admin operation
(vllm/engine/utility.py), so no operation is plumbed through each executor.

UniProcExecutor keeps one worker in the engine's process; the multiprocess and
Ray executors (distributed_executor.py) reach ranks in other processes.
"""
from __future__ import annotations

import importlib
from concurrent.futures import Future
import logging
from typing import Any, Callable, Optional, Union

from vllm import envs
from vllm.config import VllmConfig
from vllm.core.sched_output import ModelRunnerOutput, SchedulerOutput

logger = logging.getLogger(__name__)

WorkerMethod = Union[str, Callable[..., Any]]
"""A worker method's name, or a function called with the worker as first argument."""


class ExecutorBase:

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        self._init_executor()

    def _init_executor(self) -> None:
        raise NotImplementedError

    def collective_rpc(self, method: WorkerMethod, timeout: Optional[float] = None,
                       args: tuple = (), kwargs: Optional[dict[str, Any]] = None,
                       unique_reply_rank: Optional[int] = None) -> list[Any]:
        """Call `method` on every rank's worker: `worker.<method>(*args, **kwargs)` for a
        name, `method(worker, *args, **kwargs)` for a callable.

        Returns every rank's result in rank order, or `[result]` of `unique_reply_rank`
        only. Raises RuntimeError when a rank fails, dies, or `timeout` seconds pass (a
        failed rank leaves the multi-rank executors unusable: its peers' state is lost).
        """
        raise NotImplementedError

    @property
    def world_size(self) -> int:
        return self.vllm_config.parallel_config.world_size

    @property
    def driver_rank(self) -> int:
        """Global rank of TP rank 0 in the last pipeline stage (rank = pp * tp_size + tp):
        the rank that samples, and the one whose answer stands for all."""
        pc = self.vllm_config.parallel_config
        return (pc.pipeline_parallel_size - 1) * pc.tensor_parallel_size

    def get_kv_cache_specs(self) -> dict:
        """Every layer's KV cache spec, merged over the pipeline stages' ranks."""
        specs: dict = {}
        for rank_specs in self.collective_rpc("get_kv_cache_spec"):
            specs.update(rank_specs)
        return specs

    def supports_hybrid_kv_cache(self) -> bool:
        """Whether every rank's runner builds one block table per KV cache group."""
        return all(self.collective_rpc("supports_hybrid_kv_cache"))

    def set_kv_cache_config(self, config: Any) -> None:
        self.collective_rpc("set_kv_cache_config", args=(config,))

    def determine_num_available_blocks(self) -> int:
        """KV blocks every rank can hold: all ranks must agree on one block table."""
        blocks = self.collective_rpc("determine_num_available_blocks")
        logger.debug("KV blocks per rank: %s", blocks)
        return min(blocks)

    def initialize_cache(self, num_blocks: int) -> None:
        self.collective_rpc("initialize_cache", args=(num_blocks,))

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Every rank runs the step; only the driver replies."""
        return self.collective_rpc("execute_model", args=(scheduler_output,),
                                   unique_reply_rank=self.driver_rank,
                                   timeout=envs.VLLM_ENGINE_ITERATION_TIMEOUT_S)[0]

    def execute_model_async(self, scheduler_output: SchedulerOutput
                            ) -> "Future[ModelRunnerOutput]":
        """The step as a future (async scheduling). Here it runs before returning: only
        an executor that can run a step in the background (UniProcExecutor) overlaps
        it with the engine's next schedule."""
        future: Future[ModelRunnerOutput] = Future()
        try:
            future.set_result(self.execute_model(scheduler_output))
        except BaseException as exc:  # noqa: BLE001 - raised by future.result()
            future.set_exception(exc)
        return future

    def check_health(self) -> None:
        """Raise RuntimeError when a rank died or failed. A flag read, no round trip: the
        server calls it from its own thread while a step may be running."""
        return None

    def shutdown(self) -> None:
        return None

    @staticmethod
    def get_class(vllm_config: VllmConfig) -> type["ExecutorBase"]:
        backend = vllm_config.parallel_config.distributed_executor_backend
        qualname = {
            "uni": "vllm.executor.uniproc_executor.UniProcExecutor",
            "mp": "vllm.executor.mp_executor.MultiprocExecutor",
            "ray": "vllm.executor.ray_executor.RayDistributedExecutor",
        }[backend]
        module, _, name = qualname.rpartition(".")
        try:
            return getattr(importlib.import_module(module), name)
        except ImportError as e:
            raise ValueError(f"distributed_executor_backend={backend!r} is not available: {e}"
                             ) from e


def resolve_worker_cls(vllm_config: Optional[VllmConfig] = None) -> type:
    from vllm.platforms import current_platform
    module, _, name = current_platform.get_worker_cls().rpartition(".")
    return getattr(importlib.import_module(module), name)


def run_worker_method(worker: Any, method: WorkerMethod, args: tuple = (),
                      kwargs: Optional[dict[str, Any]] = None) -> Any:
    """What one rank does for a collective_rpc (every executor's workers call this)."""
    kwargs = kwargs or {}
    if isinstance(method, str):
        return getattr(worker, method)(*args, **kwargs)
    return method(worker, *args, **kwargs)
