"""What a platform decides: device, worker class, attention backend, memory, dtypes."""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class PlatformEnum(enum.Enum):
    CPU = enum.auto()
    HPU = enum.auto()
    CUDA = enum.auto()
    OOT = enum.auto()


class Platform:
    _enum: PlatformEnum = PlatformEnum.OOT
    device_name: str = "unknown"
    device_type: str = "cpu"
    dist_backend: str = "gloo"
    supported_dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)

    def is_cpu(self) -> bool:
        return self._enum == PlatformEnum.CPU

    def is_hpu(self) -> bool:
        return self._enum == PlatformEnum.HPU

    def is_cuda(self) -> bool:
        return self._enum == PlatformEnum.CUDA

    def is_out_of_tree(self) -> bool:
        return self._enum == PlatformEnum.OOT

    def default_block_size(self) -> int:
        return 16

    def bind_custom_ops(self) -> None:
        """Bind this platform's kernels to the custom ops and the kernel table
        (model_executor/kernels.py), idempotent. Called by the worker's device
        initialization and when a layer is built (CustomOp.dispatch_forward), never
        when the platform is built: constructing a platform imports no kernels and
        starts no thread, so a process that only reads the platform (a server's
        frontend, the config) stays light and safe to fork."""
        return None

    def prepare_kernels(self) -> None:
        """Bind the kernels and build what they need before the model loads (the
        CPU's native libraries); run by the worker's `init_device`."""
        self.bind_custom_ops()

    def lazy_graph_mode(self) -> bool:
        """Whether the device runs lazily recorded graphs (Gaudi's lazy mode)."""
        return False

    def get_worker_cls(self) -> str:
        """Qualified name of the Worker class the executor instantiates."""
        raise NotImplementedError

    captures_cuda_graphs: bool = False
    """Whether compilation_config's CUDA graphs are captured (the CUDA platform)."""
    attn_backends: dict[str, str] = {}
    """--attention-backend names this platform serves -> implementation class."""

    def default_attn_backend(self, vllm_config: "VllmConfig | None") -> str:
        """The backend name used when none is chosen."""
        return next(iter(self.attn_backends))

    def get_attn_backend_cls(self, selected: str | None = None,
                             vllm_config: "VllmConfig | None" = None) -> str:
        """Qualified name of the attention implementation class: `selected`'s (a
        vLLM backend name), or the platform's default; ValueError for a name this
        platform does not serve."""
        name = selected or self.default_attn_backend(vllm_config)
        if name not in self.attn_backends:
            raise ValueError(f"attention backend {name!r} is not available on "
                             f"{self.device_name}; choose one of "
                             f"{', '.join(self.attn_backends)}.")
        return self.attn_backends[name]

    def resolve_auto_dtype(self, config_dtype: torch.dtype) -> torch.dtype:
        """dtype='auto': the checkpoint's dtype, or a 16-bit one for fp32 checkpoints."""
        if config_dtype == torch.float32:
            return torch.bfloat16 if torch.bfloat16 in self.supported_dtypes else torch.float32
        if config_dtype not in self.supported_dtypes:
            return self.supported_dtypes[0]
        return config_dtype

    def check_and_update_config(self, vllm_config: "VllmConfig") -> None:
        dtype = vllm_config.model_config.torch_dtype
        if dtype not in self.supported_dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in self.supported_dtypes)
            raise ValueError(f"dtype {dtype} is not supported on {self.device_name}; "
                             f"supported: {names}.")

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) device memory in bytes."""
        raise NotImplementedError

    def synchronize(self) -> None:
        return None

    def seed_everything(self, seed: int) -> None:
        import random

        import numpy as np
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
