"""Keeps used KV blocks packed at low ids, for contiguous paged attention.

With contiguous PA the decode step reads the KV slice `cache[:max_block_id + 1]`,
so the decode bucket follows the highest block id in use, not the number of blocks
in use. After many requests come and go, a few long-lived blocks at high ids would
keep every step in a large bucket. When `max_used - num_used` exceeds
`VLLM_DEFRAG_THRESHOLD`, the highest used blocks are swapped into the lowest free
ids.

The block manager keeps its own (logical) ids; this class owns the map from logical
to physical ids, and the runner translates block tables with `resolve_table`
before building attention metadata.
"""
from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Callable, ContextManager, Iterable, Optional, Sequence

import torch

from vllm.attention.fp8_kv import FP8_DTYPES

from vllm import envs

logger = logging.getLogger(__name__)


def plan_defrag(used_block_ids: Iterable[int], threshold: int,
                max_moves: Optional[int] = None) -> list[tuple[int, int]]:
    """Moves (src, dst) of the highest used ids into the lowest free ids.

    Empty unless `max_used - num_used > threshold`, where max_used is the highest
    used id + 1 (the contiguous slice length). At most `max_moves` moves, highest
    source first, so a partial plan still lowers the maximum.
    """
    used = sorted(set(used_block_ids))
    if not used:
        return []
    num_used, max_used = len(used), used[-1] + 1
    if max_used - num_used <= threshold:
        return []
    used_set = set(used)
    free_low = (b for b in range(num_used) if b not in used_set)
    high = (b for b in reversed(used) if b >= num_used)
    moves = list(zip(high, free_low))
    return moves if max_moves is None else moves[:max_moves]


def swap_bucket(num_moves: int) -> int:
    """Moves padded to a power of two, at least 8: one compiled swap shape per bucket."""
    return max(8, 1 << max(0, num_moves - 1).bit_length())


def swap_buckets(max_moves: int) -> list[int]:
    """Every bucket `swap_bucket` returns for 1..max_moves moves (what warmup runs)."""
    return sorted({swap_bucket(n) for n in range(1, max_moves + 1)})


def swap_blocks(caches: Sequence[torch.Tensor], moves: Sequence[tuple[int, int]],
                block_size: int, pad_block_id: Optional[int] = None,
                bucket: Optional[int] = None) -> None:
    """Swap the contents of blocks src <-> dst in every cache [num_slots, H, D].

    Each cache is a whole tensor (K and V are separate), and the swap reads and
    writes it by slot index (`index_select` / `index_copy_` on dim 0), never through
    a view, so it is safe inside a captured graph. With `pad_block_id` the move
    list is padded to `bucket` moves (default `swap_bucket(len(moves))`) with no-op
    self-swaps of the pad block, so Gaudi compiles one swap shape per bucket. The
    sources and destinations of a plan are disjoint, so the order does not matter.
    """
    if not moves and bucket is None:
        return
    src = [s for s, _ in moves]
    dst = [d for _, d in moves]
    if pad_block_id is not None:
        target = swap_bucket(len(moves)) if bucket is None else bucket
        if target < len(moves):
            raise ValueError(f"{len(moves)} moves do not fit a swap bucket of {target}.")
        src += [pad_block_id] * (target - len(moves))
        dst += [pad_block_id] * (target - len(moves))
    offsets = torch.arange(block_size)
    src_slots = (torch.tensor(src, dtype=torch.long)[:, None] * block_size + offsets).view(-1)
    dst_slots = (torch.tensor(dst, dtype=torch.long)[:, None] * block_size + offsets).view(-1)
    for cache in caches:
        if cache.dtype in FP8_DTYPES:  # a byte copy (CPU torch has no fp8 index_copy_)
            cache = cache.view(torch.uint8)
        src_t, dst_t = src_slots.to(cache.device), dst_slots.to(cache.device)
        src_data = cache.index_select(0, src_t)
        dst_data = cache.index_select(0, dst_t)
        cache.index_copy_(0, dst_t, src_data)
        cache.index_copy_(0, src_t, dst_data)


class HPUDefragmenter:
    """Logical -> physical block map plus the policy that compacts it."""

    def __init__(self, num_blocks: int, block_size: int, threshold: Optional[int] = None,
                 max_moves: Optional[int] = 64, pad_block_id: Optional[int] = None) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, "
                             f"{block_size}.")
        self.threshold = envs.VLLM_DEFRAG_THRESHOLD if threshold is None else threshold
        if self.threshold < 0:
            raise ValueError(f"VLLM_DEFRAG_THRESHOLD must be >= 0, got {self.threshold}.")
        self.block_size = block_size
        self.max_moves = max_moves
        self.pad_block_id = pad_block_id
        self.to_physical = list(range(num_blocks))
        self.to_logical = list(range(num_blocks))
        self.total_moves = 0

    def resolve(self, logical_id: int) -> int:
        return self.to_physical[logical_id]

    def resolve_table(self, block_table: Sequence[int]) -> list[int]:
        return [self.to_physical[b] for b in block_table]

    def defragment(self, used_logical_ids: Iterable[int], caches: Sequence[torch.Tensor],
                   track: Callable[[int], ContextManager] = lambda bucket: nullcontext()
                   ) -> int:
        """Compact if needed; returns the number of blocks moved.

        The swap runs inside `track(bucket)` (the runner's compile tracker), where
        `bucket` is the padded number of moves (the swap's shape)."""
        used = list(used_logical_ids)
        used_physical = [self.to_physical[b] for b in used]
        moves = plan_defrag(used_physical, self.threshold, self.max_moves)
        if not moves:
            return 0
        bucket = len(moves) if self.pad_block_id is None else swap_bucket(len(moves))
        with track(bucket):
            swap_blocks(caches, moves, self.block_size, self.pad_block_id, bucket=bucket
                        if self.pad_block_id is not None else None)
        for src, dst in moves:
            a, b = self.to_logical[src], self.to_logical[dst]
            self.to_physical[a], self.to_physical[b] = dst, src
            self.to_logical[src], self.to_logical[dst] = b, a
        self.total_moves += len(moves)
        logger.debug("Defragmented KV cache: moved %d blocks; highest used id now %d.",
                     len(moves), max(self.to_physical[b] for b in used))
        return len(moves)
