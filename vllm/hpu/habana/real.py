"""The real Gaudi modules, imported only on a Gaudi image (see `vllm.hpu`).

Importing `habana_frameworks.torch` registers the `hpu` device and `torch.hpu`.
"""
from __future__ import annotations

import habana_frameworks.torch as htorch  # noqa: F401  (registers torch.hpu)
import habana_frameworks.torch.core as htcore
import torch
from habana_frameworks.torch.hpex.kernels import (FusedSDPA, RotaryPosEmbeddingMode,
                                                   apply_rotary_pos_emb)
from habana_frameworks.torch.hpex.normalization import FusedRMSNorm
from habana_frameworks.torch.hpu.metrics import metric_localcontext
from habana_frameworks.torch.utils.internal import is_lazy

mark_step = htcore.mark_step
wrap_in_hpu_graph = htorch.hpu.wrap_in_hpu_graph


def synchronize() -> None:
    torch.hpu.synchronize()


def set_device(device: int = 0) -> None:
    torch.hpu.set_device(device)


def device_count() -> int:
    return torch.hpu.device_count()


def current_device() -> int:
    return torch.hpu.current_device()


def mem_get_info() -> tuple[int, int]:
    """(free, total) bytes of the current HPU."""
    free, total = torch.hpu.mem_get_info()
    return int(free), int(total)


__all__ = ["FusedRMSNorm", "FusedSDPA", "RotaryPosEmbeddingMode", "apply_rotary_pos_emb",
           "current_device", "device_count", "is_lazy", "mark_step", "mem_get_info", "metric_localcontext",
           "set_device", "synchronize", "wrap_in_hpu_graph"]
