"""Backend "disk": a safetensors checkpoint (one file or a directory) on a local disk.

What a trainer that saves checkpoints anyway sends: the path. Every rank reads the
tensors through mmap (the page cache serves the other ranks of the host).
"""
from __future__ import annotations

import dataclasses
import os

from vllm.distributed.weight_transfer.base import NamedTensors, WeightTransferEngine


@dataclasses.dataclass
class DiskUpdateInfo:
    path: str
    """A .safetensors file, or a directory of them (with or without an index)."""

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ValueError("update_info: path must be a non-empty string.")
        if not os.path.exists(self.path):
            raise ValueError(f"update_info: path {self.path!r} does not exist.")
        if os.path.isfile(self.path) and not self.path.endswith(".safetensors"):
            raise ValueError(f"update_info: {self.path!r} is not a .safetensors file.")


class DiskWeightTransferEngine(WeightTransferEngine):
    update_info_cls = DiskUpdateInfo

    def receive_weights(self, update_info: DiskUpdateInfo) -> NamedTensors:
        path = update_info.path
        if os.path.isdir(path):
            from vllm.model_executor.model_loader import iterate_weights
            yield from iterate_weights(path, "safetensors")
            return
        from safetensors import safe_open
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
