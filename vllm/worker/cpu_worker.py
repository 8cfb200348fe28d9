"""The CPU worker: threads, KV cache sized from VLLM_CPU_KVCACHE_SPACE, the CPU runner."""
from __future__ import annotations

import logging
import os

import torch

from vllm import envs
from vllm.worker.cpu_model_runner import CPUModelRunner
from vllm.worker.worker_base import WorkerBase

logger = logging.getLogger(__name__)

_GiB = 1 << 30
_DEFAULT_KV_SPACE_GiB = 4.0


class CPUWorker(WorkerBase):

    def init_device(self) -> None:
        self._set_threads()
        self.init_distributed("gloo")
        from vllm.platforms import current_platform
        current_platform.seed_everything(self.vllm_config.model_config.seed)
        self.model_runner = CPUModelRunner(self.vllm_config, device="cpu")

    def _set_threads(self) -> None:
        """Split the cores between the ranks on this machine (all of them for one rank).

        Data-parallel replicas run on the same machine too, so they share the cores.
        """
        pc = self.vllm_config.parallel_config
        world = pc.world_size * pc.data_parallel_size
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        torch.set_num_threads(max(1, cores // world))

    def determine_num_available_blocks(self) -> int:
        cc = self.vllm_config.cache_config
        block_bytes = self.model_runner.get_kv_cache_block_bytes()
        if cc.num_gpu_blocks_override is not None:
            return cc.num_gpu_blocks_override
        return max(1, self._kv_cache_bytes(block_bytes) // block_bytes)

    def _kv_cache_bytes(self, block_bytes: int) -> int:
        """kv_cache_memory_bytes, else VLLM_CPU_KVCACHE_SPACE GiB, else an automatic size.

        Automatic: 4 GiB (vLLM's historical CPU default), but never more than what
        max_num_seqs full-length sequences could use, nor half the available memory.
        """
        cc = self.vllm_config.cache_config
        if cc.kv_cache_memory_bytes is not None:
            return cc.kv_cache_memory_bytes
        space = envs.VLLM_CPU_KVCACHE_SPACE
        if space > 0:
            return int(space * _GiB)
        from vllm.platforms import current_platform
        available, _ = current_platform.mem_get_info()
        sc = self.vllm_config.scheduler_config
        bs = cc.block_size
        pc = self.vllm_config.parallel_config
        world = pc.world_size * pc.data_parallel_size
        needed = sc.max_num_seqs * -(-sc.max_model_len // bs) * block_bytes
        return int(min(_DEFAULT_KV_SPACE_GiB * _GiB, needed, available / 2 / world))
