"""The CUDA platform: used when a GPU is present."""
from __future__ import annotations

import torch

from vllm.platforms.interface import Platform, PlatformEnum


class CudaPlatform(Platform):
    _enum = PlatformEnum.CUDA
    device_name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"

    def get_worker_cls(self) -> str:
        return "vllm.worker.gpu_worker.GPUWorker"

    def get_attn_backend_cls(self) -> str:
        return "vllm.attention.backends.torch_sdpa.TorchSDPABackendImpl"

    def resolve_auto_dtype(self, config_dtype: torch.dtype) -> torch.dtype:
        if config_dtype == torch.float32:
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return config_dtype

    def mem_get_info(self) -> tuple[int, int]:
        return torch.cuda.mem_get_info()

    def synchronize(self) -> None:
        torch.cuda.synchronize()
