"""The backend of `weight_transfer_config.backend`, by name."""
from __future__ import annotations

from typing import Any

from torch import nn

from vllm.distributed.weight_transfer.base import WeightTransferEngine


def create_weight_transfer_engine(config: Any, model: nn.Module) -> WeightTransferEngine:
    """The engine of `config` (a WeightTransferConfig) receiving into `model`."""
    from vllm.distributed.weight_transfer.disk_engine import DiskWeightTransferEngine
    from vllm.distributed.weight_transfer.shm_engine import ShmWeightTransferEngine
    engines: dict[str, type[WeightTransferEngine]] = {
        "shm": ShmWeightTransferEngine, "disk": DiskWeightTransferEngine}
    return engines[config.backend](model)
