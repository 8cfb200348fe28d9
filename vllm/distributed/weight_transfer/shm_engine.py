"""Backend "shm": tensors packed back to back in a POSIX shared-memory segment.

The trainer (any process on the host) packs its tensors with
`pack_into_shared_memory` and sends the returned update_info (vLLM's fields:
names, dtype_names, shapes, plus the segment's name); every rank maps the segment
and copies its shards out. No pickling, no socket. Each tensor is copied out of the
mapping before the loader sees it (the mapping cannot be closed while a view of it
lives, and the loader may keep the last one).
"""
from __future__ import annotations

import dataclasses
import math
import mmap
import os
from multiprocessing import shared_memory
from typing import Iterable

import torch

from vllm.distributed.weight_transfer.base import (NamedTensors, WeightTransferEngine,
                                                   parse_dtype)


@dataclasses.dataclass
class ShmUpdateInfo:
    shm_name: str
    """The segment holding the tensors, packed in order without gaps."""
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        n = len(self.names)
        if len(self.dtype_names) != n or len(self.shapes) != n:
            raise ValueError(f"update_info: names ({n}), dtype_names "
                             f"({len(self.dtype_names)}) and shapes ({len(self.shapes)}) "
                             "must have the same length.")
        self.dtypes = [parse_dtype(d) for d in self.dtype_names]
        for name, shape in zip(self.names, self.shapes):
            if not all(isinstance(d, int) and d >= 0 for d in shape):
                raise ValueError(f"update_info: shape of {name!r} must be a list of "
                                 f"non-negative ints, got {shape!r}.")

    def nbytes(self) -> list[int]:
        return [math.prod(s) * torch.empty((), dtype=d).element_size()
                for s, d in zip(self.shapes, self.dtypes)]


def _attach(name: str) -> mmap.mmap:
    """Map an existing segment. Not through `SharedMemory(name)`: before Python 3.13
    that registers the segment with this process's resource tracker, which then
    unlinks it (or complains) when the process exits; the trainer owns the segment."""
    import _posixshmem
    try:
        fd = _posixshmem.shm_open("/" + name.lstrip("/"), os.O_RDWR, mode=0o600)
    except FileNotFoundError:
        raise ValueError(f"update_info: no shared-memory segment named {name!r}.") from None
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


class ShmWeightTransferEngine(WeightTransferEngine):
    update_info_cls = ShmUpdateInfo

    def receive_weights(self, update_info: ShmUpdateInfo) -> NamedTensors:
        sizes = update_info.nbytes()
        shm = _attach(update_info.shm_name)
        try:
            if sum(sizes) > len(shm):
                raise ValueError(f"update_info: the tensors need {sum(sizes)} bytes, the "
                                 f"segment {update_info.shm_name!r} has {len(shm)}.")
            offset = 0
            for name, dtype, shape, size in zip(update_info.names, update_info.dtypes,
                                                update_info.shapes, sizes):
                if size:
                    view = torch.frombuffer(shm, dtype=dtype, count=math.prod(shape),
                                            offset=offset)
                    tensor = view.clone().view(shape)
                    del view
                else:
                    tensor = torch.empty(shape, dtype=dtype)
                offset += size
                yield name, tensor
        finally:
            shm.close()


def pack_into_shared_memory(weights: Iterable[tuple[str, torch.Tensor]]
                            ) -> tuple[shared_memory.SharedMemory, dict]:
    """The trainer side: copy `weights` into a new segment; returns it (the caller
    `close()`s and `unlink()`s it once `update_weights` returned) and the update_info
    to send."""
    items = [(name, t.detach().to("cpu").contiguous()) for name, t in weights]
    total = sum(t.numel() * t.element_size() for _, t in items)
    shm = shared_memory.SharedMemory(create=True, size=max(total, 1))
    offset = 0
    for _, t in items:
        n = t.numel() * t.element_size()
        if n:
            shm.buf[offset:offset + n] = t.view(-1).view(torch.uint8).numpy().tobytes()
        offset += n
    info = {"shm_name": shm.name, "names": [n for n, _ in items],
            "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in items],
            "shapes": [list(t.shape) for _, t in items]}
    return shm, info
