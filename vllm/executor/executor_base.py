"""The executor interface: how the engine core reaches its workers.

UniProcExecutor keeps one worker in the engine's process; a multiprocess or Ray
executor implements the same four calls over its ranks.
"""
from __future__ import annotations

import importlib
from typing import Optional

from vllm.config import VllmConfig
from vllm.core.sched_output import ModelRunnerOutput, SchedulerOutput


class ExecutorBase:

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        self._init_executor()

    def _init_executor(self) -> None:
        raise NotImplementedError

    def determine_num_available_blocks(self) -> int:
        raise NotImplementedError

    def initialize_cache(self, num_blocks: int) -> None:
        raise NotImplementedError

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        raise NotImplementedError

    def check_health(self) -> None:
        return None

    # LoRA adapters (the workers load and check them; see vllm/lora/models.py).
    def add_lora(self, lora_request) -> bool:
        raise NotImplementedError

    def remove_lora(self, lora_id: int) -> bool:
        raise NotImplementedError

    def list_loras(self) -> set[int]:
        raise NotImplementedError

    def get_compile_stats(self) -> Optional[dict]:
        """The driver worker's compile accounting (see WorkerBase.get_compile_stats)."""
        return None

    def finalize_calibration(self) -> list[Optional[str]]:
        """INC MEASURE: every rank writes its statistics now; their json paths."""
        raise NotImplementedError

    def reload_quant_scales(self, dump_stats_path: Optional[str] = None) -> int:
        """INC QUANTIZE: every rank loads new input scales; layers changed per rank."""
        raise NotImplementedError

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
