"""The worker lifecycle every executor drives, whatever the device.

init_device -> load_model -> determine_num_available_blocks -> initialize_cache ->
execute_model (every step). One worker per rank; in a multiprocess executor only
the driver's output (rank 0 of the last pipeline stage's TP group) is returned.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from vllm.config import VllmConfig
from vllm.core.sched_output import ModelRunnerOutput, SchedulerOutput
from vllm.worker.torch_profiler import WorkerProfiler

logger = logging.getLogger(__name__)


class WorkerBase:

    def __init__(self, vllm_config: VllmConfig, local_rank: int = 0, rank: int = 0,
                 distributed_init_method: Optional[str] = None) -> None:
        self.vllm_config = vllm_config
        self.local_rank = local_rank
        self.rank = rank
        self.distributed_init_method = distributed_init_method
        self.model_runner = None
        self._profiler: Optional[WorkerProfiler] = None
        self._weight_transfer = None

    def init_device(self) -> None:
        raise NotImplementedError

    @property
    def device_index(self) -> int:
        """This rank's device on its node. A node's data-parallel replicas run side by
        side, so its replica r's ranks take the devices r * world_size onwards:
        index = data_parallel_rank_local * world_size + local_rank."""
        pc = self.vllm_config.parallel_config
        return pc.data_parallel_rank_local * pc.world_size + self.local_rank

    def get_device_index(self) -> int:
        """The device this worker runs on (an RPC: replicas and ranks can be checked)."""
        return self.device_index

    def init_distributed(self, backend: str,
                         before_collective: Optional[Callable[[], None]] = None) -> None:
        """Set up process groups when there is more than one rank (`before_collective`:
        see `initialize_model_parallel`)."""
        pc = self.vllm_config.parallel_config
        if pc.world_size == 1:
            return
        from vllm.distributed import init_distributed_environment, initialize_model_parallel
        init_distributed_environment(pc.world_size, self.rank, self.distributed_init_method,
                                     self.local_rank, backend)
        initialize_model_parallel(pc.tensor_parallel_size, pc.pipeline_parallel_size,
                                  before_collective)

    def load_model(self) -> None:
        self.model_runner.load_model()

    def get_kv_cache_spec(self) -> dict:
        """This rank's layers' KV cache specs (vllm/kv_cache_spec.py)."""
        return self.model_runner.get_kv_cache_spec()

    def supports_hybrid_kv_cache(self) -> bool:
        """Whether this rank's runner gives each KV cache group its own block tables."""
        return self.model_runner.supports_hybrid_kv_cache

    def set_kv_cache_config(self, config: Any) -> None:
        """The engine's layout of the whole model's KV cache, before sizing it."""
        self.model_runner.kv_cache_config = config

    def determine_num_available_blocks(self) -> int:
        raise NotImplementedError

    def initialize_cache(self, num_blocks: int) -> None:
        self.model_runner.initialize_kv_cache(num_blocks)
        self.model_runner.init_kv_connector()

    def execute_model(self, scheduler_output: SchedulerOutput) -> Optional[ModelRunnerOutput]:
        return self.model_runner.execute_model(scheduler_output)

    def apply_model(self, func: Any) -> Any:
        """`func(model)` on this rank's model (vLLM's LLM.apply_model)."""
        return func(self.model_runner.model)

    def check_health(self) -> None:
        return None

    def add_lora(self, lora_request) -> bool:
        return self._lora_manager().add_adapter(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        return self._lora_manager().remove_adapter(lora_id)

    def list_loras(self) -> set[int]:
        return self._lora_manager().list_adapters()

    def _lora_manager(self):
        manager = getattr(self.model_runner, "lora_manager", None)
        if manager is None:
            raise ValueError("LoRA is not enabled; start the engine with enable_lora=True.")
        return manager

    def get_compile_stats(self) -> Optional[dict]:
        """Graph-compile accounting of platforms that compile per shape (HPU); else None."""
        return None

    def get_bucket_stats(self) -> Optional[dict]:
        """Shape-bucket padding accounting of platforms that pad to buckets (HPU); else None."""
        return None

    def finalize_calibration(self) -> Optional[str]:
        """INC MEASURE: write this rank's statistics now (INC's finalize_calibration)."""
        runner = self.model_runner
        return runner.finalize_calibration() if runner is not None else None

    def reload_quant_scales(self, dump_stats_path: Optional[str] = None) -> int:
        return self.model_runner.reload_quant_scales(dump_stats_path)

    # ---------------------------------------------------------- profiling
    @property
    def profiler(self) -> WorkerProfiler:
        """This rank's torch profiler (torch_profiler.py), made on first use."""
        if self._profiler is None:
            pc = self.vllm_config.parallel_config
            name = f"rank{self.rank}" if pc.data_parallel_size == 1 else \
                f"dp{pc.data_parallel_rank}-rank{self.rank}"
            self._profiler = WorkerProfiler(
                name, self.vllm_config.device_config.device,
                getattr(self.vllm_config, "profiler_config", None))
        return self._profiler

    def start_profile(self) -> None:
        self.profiler.start()

    def stop_profile(self) -> None:
        self.profiler.stop()

    # ---------------------------------------------- in-place weight updates
    def init_weight_transfer_engine(self, init_info: Optional[dict] = None) -> None:
        """Open this rank's receiver of new weights (vllm/distributed/weight_transfer/)."""
        config = self.vllm_config.weight_transfer_config
        if config is None:
            raise ValueError("Weight transfer is not configured; start the engine with "
                             "weight_transfer_config={'backend': 'shm'} "
                             "(--weight-transfer-config '{\"backend\": \"shm\"}').")
        if getattr(self.vllm_config.model_config, "quant_config", None) is not None:
            raise ValueError("In-place weight updates of a quantized model are not "
                             "supported (its loaded weights are post-processed).")
        from vllm.distributed.weight_transfer import create_weight_transfer_engine
        engine = create_weight_transfer_engine(config, self.model_runner.model)
        engine.init_transfer_engine(init_info)
        self._weight_transfer = engine

    def start_weight_update(self) -> None:
        self._weight_transfer_engine().start_weight_update()

    def update_weights(self, update_info: dict) -> int:
        """Copy one batch of new weights into this rank's parameters, in place."""
        count = self._weight_transfer_engine().update_weights(update_info)
        self.model_runner.flush_weight_copies()
        return count

    def finish_weight_update(self) -> int:
        count = self._weight_transfer_engine().finish_weight_update()
        self.model_runner.weights_updated()
        return count

    def _weight_transfer_engine(self):
        if self._weight_transfer is None:
            raise ValueError("The weight transfer engine is not initialized; call "
                             "init_weight_transfer_engine first.")
        return self._weight_transfer

    # ---------------------------------------------------------- sleep mode
    def sleep(self, level: int = 1) -> None:
        """Free the KV cache and offload (1) or discard (2) the weights (sleep_mode.py)."""
        self.model_runner.sleep(level)

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """Restore the weights and the KV cache (or only the given tags)."""
        self.model_runner.wake_up(tags)

    def shutdown(self) -> None:
        """Shutdown ends an INC measurement run: its statistics are written here, and a
        running profile: its trace is written."""
        if self._profiler is not None and self._profiler.running:
            self._profiler.stop()
        self.finalize_calibration()
        if self.model_runner is not None:
            self.model_runner.shutdown_kv_connector()
