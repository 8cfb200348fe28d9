"""The CUDA worker: the GPU model runner, KV cache sized by gpu_memory_utilization
after the activation peak and the CUDA graphs' memory."""
from __future__ import annotations

import logging

import torch

from vllm.worker.gpu_model_runner import GPUModelRunner
from vllm.worker.worker_base import WorkerBase

logger = logging.getLogger(__name__)


class GPUWorker(WorkerBase):

    def init_device(self) -> None:
        self.device = torch.device(f"cuda:{self.device_index}")
        torch.cuda.set_device(self.device)
        self.init_distributed("nccl")
        from vllm.platforms import current_platform
        current_platform.seed_everything(self.vllm_config.model_config.seed)
        current_platform.prepare_kernels()  # bind (and build) the kernels
        self.model_runner = GPUModelRunner(self.vllm_config, device=self.device)

    def determine_num_available_blocks(self) -> int:
        """Blocks that fit in gpu_memory_utilization of the GPU after weights and activations.

        A forward pass at the full token budget (no KV cache) measures peak activation
        memory, as vLLM's profile run does.
        """
        cc = self.vllm_config.cache_config
        block_bytes = self.model_runner.get_kv_cache_block_bytes()
        if cc.num_gpu_blocks_override is not None:
            return cc.num_gpu_blocks_override
        if cc.kv_cache_memory_bytes is not None:
            return max(1, cc.kv_cache_memory_bytes // block_bytes)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        self.model_runner.profile_run()
        free, total = torch.cuda.mem_get_info()
        peak = torch.cuda.max_memory_allocated()
        graphs = self.model_runner.estimate_cudagraph_memory()
        budget = total * cc.gpu_memory_utilization - (total - free) - \
            (peak - torch.cuda.memory_allocated()) - graphs
        logger.info("GPU memory: total %.2f GiB, in use %.2f GiB, activation peak %.2f GiB, "
                    "CUDA graphs %.2f GiB", total / 2**30, (total - free) / 2**30,
                    peak / 2**30, graphs / 2**30)
        return max(1, int(budget // block_bytes))

    def initialize_cache(self, num_blocks: int) -> None:
        """The KV cache, then the CUDA graphs that read it (they hold its address)."""
        super().initialize_cache(num_blocks)
        self.model_runner.capture_cudagraphs()
