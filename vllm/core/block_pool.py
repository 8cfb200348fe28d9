"""A pool of fixed-size KV cache blocks with an LRU cache of freed, hashed blocks.

A block whose ref count drops to 0 goes to the tail of the free queue but keeps its
hash, so a later request with the same prefix can take it back ("touch"). Blocks are
handed out from the head of the queue, which is where their cached content is
finally evicted. The free queue is an OrderedDict keyed by block id: O(1) pop from
the head, append at the tail and removal from the middle.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Optional

from vllm.core.kv_cache_metrics import KVCacheMetricsCollector


@dataclass(eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: Optional[int] = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


class BlockPool:

    def __init__(self, num_blocks: int, enable_caching: bool,
                 metrics_collector: Optional[KVCacheMetricsCollector] = None) -> None:
        """`metrics_collector`: block residency for --kv-cache-metrics (None: off)."""
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, KVCacheBlock] = OrderedDict(
            (b.block_id, b) for b in self.blocks)
        self.cached_block_hash_to_block: dict[int, KVCacheBlock] = {}
        self.metrics_collector = metrics_collector

    # ------------------------------------------------------------- queries
    def get_num_free_blocks(self) -> int:
        return len(self.free_queue)

    def get_usage(self) -> float:
        """Share of blocks held by running requests (cached free blocks count as free)."""
        return 1.0 - len(self.free_queue) / self.num_blocks

    def get_cached_block(self, block_hash: int) -> Optional[KVCacheBlock]:
        return self.cached_block_hash_to_block.get(block_hash)

    # ---------------------------------------------------------- allocation
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > len(self.free_queue):
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool "
                             f"({len(self.free_queue)} free)")
        out = []
        for _ in range(num_blocks):
            _, block = self.free_queue.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            if self.metrics_collector is not None:
                # The block's previous content is overwritten: that life ends here.
                self.metrics_collector.on_block_evicted(block.block_id)
                self.metrics_collector.on_block_allocated(block.block_id)
            out.append(block)
        return out

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is None:
            return
        if self.cached_block_hash_to_block.get(block.block_hash) is block:
            del self.cached_block_hash_to_block[block.block_hash]
        block.block_hash = None

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits, reviving them from the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self.free_queue[block.block_id]
            block.ref_cnt += 1
            if self.metrics_collector is not None:
                self.metrics_collector.on_block_accessed(block.block_id)

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference each; blocks given first are evicted first."""
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue[block.block_id] = block

    def cache_full_block(self, block: KVCacheBlock, block_hash: int) -> None:
        """Record that `block` holds the tokens identified by `block_hash`."""
        if not self.enable_caching or block.block_hash is not None:
            return
        block.block_hash = block_hash
        self.cached_block_hash_to_block.setdefault(block_hash, block)

    def uncache(self, block: KVCacheBlock) -> None:
        """Forget the block's cached content (it stays allocated)."""
        self._evict(block)

    def reset_prefix_cache(self) -> bool:
        if len(self.free_queue) != self.num_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached_block_hash_to_block.clear()
        return True
