"""Device memory accounting for the fake HPU.

The fake device has `VLLM_FAKE_HPU_MEMORY_GB` GiB (read on every call, so tests
can change it; a comma-separated list gives each device index its own size, so the
ranks of a test can see different memory). Its "allocator" is this ledger: the runner reports what it puts on
the device (weights, KV caches) with `track_alloc`, and `mem_get_info()` returns
`(total - tracked, total)`. Plain CPU tensors are not tracked automatically, which
keeps the numbers deterministic and independent of the host.

`track_alloc(tensor)` ties the entry to the tensor's lifetime (it is released when
the tensor is garbage collected, or earlier by `track_free(tensor)`);
`track_alloc(nbytes)` must be paired with `track_free(nbytes)`.
On real Gaudi the ledger is still kept but `mem_get_info` reports the device.
"""
from __future__ import annotations

import threading
import weakref
from typing import Union

import torch

from vllm import envs

_GIB = 1 << 30
_lock = threading.Lock()
_tracked_bytes = 0
_finalizers: dict[int, weakref.finalize] = {}


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _sub(nbytes: int) -> None:
    global _tracked_bytes
    with _lock:
        _tracked_bytes = max(0, _tracked_bytes - nbytes)


def track_alloc(obj: Union[int, torch.Tensor]) -> int:
    """Record `obj` (a byte count or a tensor) as resident on the device; returns bytes."""
    global _tracked_bytes
    if isinstance(obj, torch.Tensor):
        nbytes = _tensor_bytes(obj)
        key = id(obj)
        with _lock:
            if key in _finalizers and _finalizers[key].alive:
                return 0  # already tracked
            _finalizers[key] = weakref.finalize(obj, _release_tensor, key, nbytes)
            _tracked_bytes += nbytes
        return nbytes
    nbytes = int(obj)
    if nbytes < 0:
        raise ValueError(f"track_alloc: nbytes must be >= 0, got {nbytes}.")
    with _lock:
        _tracked_bytes += nbytes
    return nbytes


def _release_tensor(key: int, nbytes: int) -> None:
    with _lock:
        _finalizers.pop(key, None)
    _sub(nbytes)


def track_free(obj: Union[int, torch.Tensor]) -> int:
    """Undo a `track_alloc`; returns the bytes released."""
    if isinstance(obj, torch.Tensor):
        with _lock:
            fin = _finalizers.get(id(obj))
        if fin is None or not fin.alive:
            return 0
        _, _, (key, nbytes), _ = fin.detach()
        _release_tensor(key, nbytes)
        return nbytes
    nbytes = int(obj)
    if nbytes < 0:
        raise ValueError(f"track_free: nbytes must be >= 0, got {nbytes}.")
    _sub(nbytes)
    return nbytes


def tracked_bytes() -> int:
    with _lock:
        return _tracked_bytes


def fake_total_bytes(device_index: int = 0) -> int:
    """Total bytes of fake device `device_index` (see the module doc)."""
    text = envs.VLLM_FAKE_HPU_MEMORY_GB
    try:
        sizes = [float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError("VLLM_FAKE_HPU_MEMORY_GB must be a number of GiB or a comma-separated "
                         f"list of them, got {text!r}.") from None
    if len(sizes) > 1 and device_index >= len(sizes):
        raise ValueError(f"VLLM_FAKE_HPU_MEMORY_GB={text!r} lists {len(sizes)} devices; device "
                         f"index {device_index} has no size.")
    gb = sizes[device_index] if len(sizes) > 1 else sizes[0]
    if gb <= 0:
        raise ValueError(f"VLLM_FAKE_HPU_MEMORY_GB must be > 0, got {gb}.")
    return int(gb * _GIB)


def fake_mem_get_info(device_index: int = 0) -> tuple[int, int]:
    """(free, total) bytes of fake device `device_index`."""
    total = fake_total_bytes(device_index)
    return max(0, total - tracked_bytes()), total


def reset_tracked_memory() -> None:
    """Forget every entry (tests)."""
    global _tracked_bytes
    with _lock:
        for fin in list(_finalizers.values()):
            fin.detach()
        _finalizers.clear()
        _tracked_bytes = 0
