"""The engine core: scheduler + executor, stepping requests forward one batch at a time.

It knows nothing about text: requests come in as token ids, outputs leave as token
ids, logprobs and finish reasons. Detokenization and stop strings live in the
frontend (LLMEngine), which is what lets the core run in another process later.
"""
from __future__ import annotations

import logging
import time
from typing import Iterable, Optional

from vllm.config import VllmConfig
from vllm.core.scheduler import EngineCoreOutput, Scheduler, SchedulerStats
from vllm.executor.executor_base import ExecutorBase
from vllm.request import Request, RequestStatus

logger = logging.getLogger(__name__)

GRAMMAR_WAIT_S = 0.02
"""Longest an idle step waits for a grammar compile (new requests wait at most this)."""


class EngineCore:

    def __init__(self, vllm_config: VllmConfig,
                 executor_class: Optional[type[ExecutorBase]] = None) -> None:
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        start = time.perf_counter()
        self.vllm_config = vllm_config
        self.executor = (executor_class or ExecutorBase.get_class(vllm_config))(vllm_config)
        num_blocks = self._init_kv_cache()
        self.scheduler = Scheduler(vllm_config, num_blocks)
        logger.info("Engine core initialized in %.2f s", time.perf_counter() - start)

    def _init_kv_cache(self) -> int:
        cfg = self.vllm_config
        num_blocks = self.executor.determine_num_available_blocks()
        bs = cfg.cache_config.block_size
        max_len = cfg.model_config.max_model_len
        if num_blocks * bs < max_len:
            raise ValueError(
                f"The model's max seq len ({max_len}) is larger than the maximum number of "
                f"tokens that can be stored in KV cache ({num_blocks * bs}). Increase the KV "
                "cache size (VLLM_CPU_KVCACHE_SPACE / kv_cache_memory_bytes / "
                "gpu_memory_utilization) or decrease max_model_len.")
        cfg.cache_config.num_gpu_blocks = num_blocks
        self.executor.initialize_cache(num_blocks)
        # vLLM's wording ("# GPU blocks: N, # CPU blocks: M", the CPU backend's
        # "# CPU blocks: N"); no swap space here, so an accelerator has 0 CPU blocks.
        device = cfg.device_config.device.upper()
        tail = f" (block size {bs}, {num_blocks * bs} tokens)"
        if device == "CPU":
            logger.info("# CPU blocks: %d%s", num_blocks, tail)
        else:
            logger.info("# %s blocks: %d, # CPU blocks: 0%s", device, num_blocks, tail)
        logger.info("Maximum concurrency for %d tokens per request: %.2fx", max_len,
                    num_blocks * bs / max_len)
        return num_blocks

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: Iterable[str],
                       status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> None:
        self.scheduler.finish_requests(request_ids, status)
        self._flush_finished()

    def _flush_finished(self) -> None:
        """When no request is left to run, tell the workers at once which requests
        finished (an empty step): no later step may come to carry the ids, and the
        workers would keep those requests' states."""
        if (self.scheduler.has_finished_requests()
                and not self.scheduler.has_unfinished_requests()):
            self.executor.execute_model(self.scheduler.schedule())

    def step(self) -> list[EngineCoreOutput]:
        """Schedule and run one batch.

        A step that schedules no token still goes to the workers when requests
        finished since the last one: that is how the workers learn to drop their
        state for them (see also `_flush_finished`).
        """
        if not self.scheduler.has_requests():
            return []
        scheduler_output = self.scheduler.schedule()
        failed = self.scheduler.take_failed_outputs()
        if scheduler_output.is_empty:
            if scheduler_output.finished_req_ids:
                self.executor.execute_model(scheduler_output)  # workers drop their states
            elif not failed:
                # Only requests whose grammars are compiling: wait for one, not spin.
                self.scheduler.wait_for_grammars(GRAMMAR_WAIT_S)
            return failed
        runner_output = self.executor.execute_model(scheduler_output)
        outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        self._flush_finished()
        return failed + outputs

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def add_lora(self, lora_request) -> bool:
        return self.executor.add_lora(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        return self.executor.remove_lora(lora_id)

    def list_loras(self) -> set[int]:
        return self.executor.list_loras()

    def get_stats(self) -> SchedulerStats:
        return self.scheduler.get_stats()

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.kv_cache_manager.reset_prefix_cache()

    def get_compile_stats(self) -> Optional[dict]:
        return self.executor.get_compile_stats()

    def check_health(self) -> None:
        """Raise when the executor lost a worker (RuntimeError); cheap, callable anytime."""
        self.executor.check_health()

    def shutdown(self) -> None:
        self.scheduler.structured_output_manager.shutdown()
        self.executor.shutdown()
