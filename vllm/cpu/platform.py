"""The CPU platform: the embedded default wherever no accelerator is present."""
from __future__ import annotations

from typing import TYPE_CHECKING

import psutil
import torch

from vllm.platforms.interface import Platform, PlatformEnum

if TYPE_CHECKING:
    from vllm.config import VllmConfig


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.split(":", 1)[-1].split())


def cpu_supports_bf16() -> bool:
    """True when bf16 weights run fast here: native bf16 dot products (AVX512_BF16 /
    AMX), or AVX2 + FMA with the native kernels on, whose packed GEMM widens bf16
    weights to float32 in registers (vllm/cpu/cpu_ops.cpp). Without either, torch's
    bf16 matmul is a scalar loop and float32 is the fast dtype."""
    from vllm import envs
    flags = _cpu_flags()
    if "avx512_bf16" in flags or "amx_bf16" in flags:
        return True
    return {"avx2", "fma"} <= flags and envs.VLLM_CPU_NATIVE_OPS


class CpuPlatform(Platform):
    _enum = PlatformEnum.CPU
    device_name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"

    def __init__(self) -> None:
        self._ops_bound = False
        self.supported_dtypes = ((torch.bfloat16, torch.float32, torch.float16)
                                 if cpu_supports_bf16() else
                                 (torch.float32, torch.bfloat16, torch.float16))

    def bind_custom_ops(self) -> None:
        """The native kernels of the custom ops and the kernel table (vllm/cpu/ops.py),
        bound by the worker's device initialization or when the first layer is built (a
        layer picks its forward once, at construction). Not at construction of the
        platform: importing them imports torch._dynamo (custom-op registration), most of
        a second that a server's frontend does not need."""
        if not self._ops_bound:
            from vllm.cpu.ops import register_cpu_ops
            register_cpu_ops()
            self._ops_bound = True

    def check_and_update_config(self, vllm_config: "VllmConfig") -> None:
        super().check_and_update_config(vllm_config)
        offload = vllm_config.cache_config.cpu_offload_gb
        if offload > 0:
            raise ValueError(f"cpu_offload_gb={offload} is not supported on CPU: the weights "
                             "already live in host memory. Leave --cpu-offload-gb at 0.")

    def prepare_kernels(self) -> None:
        """Bind the kernels, and build the native libraries now if this machine has no
        cached build yet (a first start), before the runner's first native call."""
        self.bind_custom_ops()
        from vllm.cpu.loader import prebuild
        prebuild()

    def resolve_auto_dtype(self, config_dtype: torch.dtype) -> torch.dtype:
        if config_dtype == torch.float16:
            return torch.bfloat16  # fp16 matmuls are slow on CPU, as in vLLM
        if config_dtype == torch.float32:
            return torch.bfloat16 if cpu_supports_bf16() else torch.float32
        return config_dtype

    attn_backends = {"CPU_ATTN": "vllm.cpu.attention.CpuAttentionImpl",
                     "TORCH_SDPA": "vllm.cpu.attention.CpuAttentionImpl"}
    """One backend under vLLM's two CPU names: torch ops plus the native kernels."""

    def get_worker_cls(self) -> str:
        return "vllm.cpu.worker.CPUWorker"


    def mem_get_info(self) -> tuple[int, int]:
        vm = psutil.virtual_memory()
        return vm.available, vm.total
