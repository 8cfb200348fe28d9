"""The CUDA platform: used when a GPU is present."""
from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import torch

from vllm.platforms.interface import Platform, PlatformEnum

if TYPE_CHECKING:
    from vllm.config import VllmConfig

TRITON_ATTN = "vllm.attention.backends.triton_attn.TritonAttentionBackendImpl"
TORCH_SDPA = "vllm.attention.backends.torch_sdpa.TorchSDPABackendImpl"


def has_triton() -> bool:
    """Whether the triton package is installed (checked without importing it)."""
    return importlib.util.find_spec("triton") is not None


class CudaPlatform(Platform):
    _enum = PlatformEnum.CUDA
    device_name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"
    captures_cuda_graphs = True
    attn_backends = {"TRITON_ATTN": TRITON_ATTN, "TORCH_SDPA": TORCH_SDPA}
    """TRITON_ATTN: the paged kernels of vllm/attention/ops (one call per layer for
    decodes and prefills, CUDA-graph capturable); TORCH_SDPA: torch ops, the fallback."""

    _ops_bound = False

    def get_worker_cls(self) -> str:
        return "vllm.worker.gpu_worker.GPUWorker"

    def bind_custom_ops(self) -> None:
        """The Triton kernels of RMSNorm, SiLU-and-mul and the rotary embedding, and
        of the state-space mixers' conv and step ops (vllm/cuda/ops.py), bound when
        the first layer is built, where triton is installed (else the torch ops run)."""
        if not self._ops_bound and has_triton():
            from vllm.cuda.ops import register_cuda_ops
            register_cuda_ops()
            self._ops_bound = True

    def default_attn_backend(self, vllm_config: "VllmConfig | None") -> str:
        """TRITON_ATTN where triton is installed and the model has no MLA layers (they
        attend in their own layer, over torch_sdpa's metadata)."""
        if not has_triton() or _uses_mla(vllm_config):
            return "TORCH_SDPA"
        return "TRITON_ATTN"

    def get_attn_backend_cls(self, selected: str | None = None,
                             vllm_config: "VllmConfig | None" = None) -> str:
        if selected == "TRITON_ATTN":
            if not has_triton():
                raise ValueError("attention backend TRITON_ATTN needs the triton package; "
                                 "install it or choose TORCH_SDPA.")
            if _uses_mla(vllm_config):
                raise ValueError("attention backend TRITON_ATTN does not serve MLA models "
                                 "(DeepSeek-V2/V3); choose TORCH_SDPA.")
        return super().get_attn_backend_cls(selected, vllm_config)

    def resolve_auto_dtype(self, config_dtype: torch.dtype) -> torch.dtype:
        if config_dtype == torch.float32:
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return config_dtype

    def mem_get_info(self) -> tuple[int, int]:
        return torch.cuda.mem_get_info()

    def synchronize(self) -> None:
        torch.cuda.synchronize()


def _uses_mla(vllm_config: "VllmConfig | None") -> bool:
    return vllm_config is not None and bool(getattr(vllm_config.model_config, "use_mla",
                                                    False))
