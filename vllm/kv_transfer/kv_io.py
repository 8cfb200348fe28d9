"""One layer's paged KV cache seen as token slots, whatever the platform's layout.

Connectors move KV as `[parts, tokens, kv_heads, head_size]` host tensors (parts: K and
V, or MLA's one latent); a `KVLayerView` reads and writes the cache slots of given
tokens (slot = block_id * block_size + offset) in the platform's own layout. The views
read the runner's current cache tensor at each call, so a cache allocated again
(wake-up from sleep) needs no new registration. On Gaudi every transfer goes through
host memory: reads end with a copy to the host, writes start from host tensors.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch


class KVLayerView:
    """Slot reads and writes of one layer's cache (subclasses: one per layout)."""

    def read(self, slots: np.ndarray) -> torch.Tensor:
        """[parts, len(slots), kv_heads, head_size] on the host."""
        raise NotImplementedError

    def write(self, slots: np.ndarray, data: torch.Tensor) -> None:
        """Store `data` ([parts, len(slots), kv_heads, head_size]) at `slots`."""
        raise NotImplementedError

    def shape_of(self, num_tokens: int) -> tuple[int, ...]:
        """The shape `read` returns for `num_tokens` slots (what `write` accepts)."""
        raise NotImplementedError

    @property
    def cache(self) -> torch.Tensor:
        """One of the layer's cache tensors (its device and dtype are the layer's)."""
        raise NotImplementedError


class FlatKVLayer(KVLayerView):
    """torch_sdpa's head-major cache `[parts, kv_heads, slots, head_size]` (CPU, CUDA)."""

    def __init__(self, get_cache: Callable[[], torch.Tensor]) -> None:
        self._get_cache = get_cache

    def _index(self, slots: np.ndarray, cache: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(slots, dtype=torch.long, device=cache.device)

    def read(self, slots: np.ndarray) -> torch.Tensor:
        cache = self._get_cache()
        part = cache.index_select(2, self._index(slots, cache))
        return part.permute(0, 2, 1, 3).contiguous().cpu()

    def write(self, slots: np.ndarray, data: torch.Tensor) -> None:
        cache = self._get_cache()
        src = data.to(device=cache.device, dtype=cache.dtype).permute(0, 2, 1, 3)
        cache.index_copy_(2, self._index(slots, cache), src)

    def shape_of(self, num_tokens: int) -> tuple[int, ...]:
        parts, heads, _, dim = self._get_cache().shape
        return (parts, num_tokens, heads, dim)

    @property
    def cache(self) -> torch.Tensor:
        return self._get_cache()


class SplitKVLayer(KVLayerView):
    """Separate K and V caches `[slots, kv_heads, head_size]` (HPU; MLA: V empty),
    whose logical blocks may sit elsewhere physically (`resolve`: the defragmenter)."""

    def __init__(self, get_caches: Callable[[], tuple[torch.Tensor, torch.Tensor]],
                 block_size: int,
                 resolve: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> None:
        self._get_caches = get_caches
        self._block_size = block_size
        self._resolve = resolve

    def _parts(self) -> list[torch.Tensor]:
        key, value = self._get_caches()
        return [key] if value.numel() == 0 else [key, value]

    def _index(self, slots: np.ndarray, device: torch.device) -> torch.Tensor:
        if self._resolve is not None:
            bs = self._block_size
            slots = self._resolve(slots // bs) * bs + slots % bs
        return torch.as_tensor(slots, dtype=torch.long, device=device)

    def read(self, slots: np.ndarray) -> torch.Tensor:
        parts = self._parts()
        index = self._index(slots, parts[0].device)
        return torch.stack([p.index_select(0, index) for p in parts]).cpu()

    def write(self, slots: np.ndarray, data: torch.Tensor) -> None:
        parts = self._parts()
        index = self._index(slots, parts[0].device)
        for i, part in enumerate(parts):
            part.index_copy_(0, index, data[i].to(device=part.device, dtype=part.dtype))

    def shape_of(self, num_tokens: int) -> tuple[int, ...]:
        parts = self._parts()
        return (len(parts), num_tokens, *parts[0].shape[1:])

    @property
    def cache(self) -> torch.Tensor:
        return self._get_caches()[0]
