"""One worker, in the engine's own process (world size 1; the default)."""
from __future__ import annotations

from vllm.core.sched_output import ModelRunnerOutput, SchedulerOutput
from vllm.executor.executor_base import ExecutorBase, resolve_worker_cls


class UniProcExecutor(ExecutorBase):

    def _init_executor(self) -> None:
        self.worker = resolve_worker_cls()(self.vllm_config, local_rank=0, rank=0)
        self.worker.init_device()
        self.worker.load_model()

    def determine_num_available_blocks(self) -> int:
        return self.worker.determine_num_available_blocks()

    def initialize_cache(self, num_blocks: int) -> None:
        self.worker.initialize_cache(num_blocks)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.worker.execute_model(scheduler_output)

    def add_lora(self, lora_request) -> bool:
        return self.worker.add_lora(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        return self.worker.remove_lora(lora_id)

    def list_loras(self) -> set[int]:
        return self.worker.list_loras()

    def get_compile_stats(self):
        return self.worker.get_compile_stats()

    def check_health(self) -> None:
        self.worker.check_health()

    def finalize_calibration(self) -> list:
        return [self.worker.finalize_calibration()]

    def reload_quant_scales(self, dump_stats_path=None) -> int:
        return self.worker.reload_quant_scales(dump_stats_path)

    def shutdown(self) -> None:
        self.worker.shutdown()
