"""Collectives over the tensor-parallel group, as the model layers call them."""
from __future__ import annotations

import torch

from vllm.distributed.parallel_state import get_tp_group


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum `x` over the TP ranks (in place when TP > 1); identity for TP = 1."""
    return get_tp_group().all_reduce(x)


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate the TP ranks' `x` along `dim` in rank order; identity for TP = 1."""
    return get_tp_group().all_gather(x, dim)
