"""Per-request block tables over the BlockPool, with prefix caching.

Prefix caching identifies a full block by a hash chained over every token before
it: hash(parent_hash, block_tokens, extra_keys), where the extra keys name the LoRA
adapter the KV was computed with (none for the base model) and the content hashes of
the images whose placeholder tokens the block covers (placeholders are the same token
ids for every image, so without them a different image would hit the same blocks). Only full blocks are
cached, and a hit never covers the last prompt token (it must be computed to get
logits), so the hit is capped at num_tokens - 1 tokens.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Optional

from vllm.core.block_pool import BlockPool, KVCacheBlock
from vllm.request import Request

logger = logging.getLogger(__name__)

_ROOT_HASH = hash("vllm-prefix-cache-root")


def hash_block_tokens(parent_hash: Optional[int], token_ids: tuple[int, ...],
                      extra_keys: Optional[tuple] = None) -> int:
    return hash((_ROOT_HASH if parent_hash is None else parent_hash, token_ids, extra_keys))


def _extra_keys(lora_key: Optional[object], mm_features: Optional[list], start: int,
                end: int) -> Optional[tuple]:
    """What besides its tokens tells a block's KV apart: the adapter and the images
    with placeholder tokens in positions [start, end) (None when neither)."""
    images = tuple(f.identifier for f in mm_features or () if f.overlaps(start, end))
    if not images:
        return lora_key
    return (lora_key, images)


@dataclass
class PrefixCacheStats:
    queries: int = 0
    """Prompt tokens looked up in the prefix cache (cumulative)."""
    hits: int = 0
    """Prompt tokens found in the prefix cache (cumulative)."""


class KVCacheManager:

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()
        self.root_hash = _ROOT_HASH
        """The parent of every request's first block: a new one after a weight update
        starts a hash lineage that no block computed with the old weights is in."""

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def _update_block_hashes(self, request: Request) -> list[int]:
        """Extend request.block_hashes to cover every full block of its known tokens."""
        bs = self.block_size
        hashes = request.block_hashes
        tokens = request.all_token_ids
        lora = request.lora_request.cache_key if request.lora_request else None
        for i in range(len(hashes), len(tokens) // bs):
            parent = hashes[-1] if hashes else self.root_hash
            extra = _extra_keys(lora, request.mm_features, i * bs, (i + 1) * bs)
            if i == 0 and request.cache_salt is not None:  # later blocks chain from it
                extra = (extra, "cache_salt", request.cache_salt)
            hashes.append(hash_block_tokens(parent, tuple(tokens[i * bs:(i + 1) * bs]), extra))
        return hashes

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of the request: (blocks, number of tokens)."""
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            # Prompt logprobs need every prompt position computed (as in vLLM).
            return [], 0
        hashes = self._update_block_hashes(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        for block_hash in hashes[:max_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_prefix_cache_lookup(self, request: Request, num_computed_tokens: int) -> None:
        """Count one admitted request's lookup in the statistics.

        A waiting request that cannot get blocks is looked up again on every step; only
        the lookup of the step that admits it counts (as in vLLM), so a full pool does not
        inflate queries and hits.
        """
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return
        self.prefix_cache_stats.queries += request.num_tokens
        self.prefix_cache_stats.hits += num_computed_tokens

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: Optional[list[KVCacheBlock]] = None,
                       num_lookahead_tokens: int = 0) -> Optional[list[KVCacheBlock]]:
        """Make room for `num_new_tokens` more tokens; None if the pool is too small.

        `new_computed_blocks` are prefix-cache hits for a request being scheduled from
        the waiting queue; their tokens are already counted in num_computed_tokens.
        `num_lookahead_tokens` more slots are reserved past them (a draft model writes
        its drafts' KV there); they are never hashed for the prefix cache.
        """
        new_computed_blocks = new_computed_blocks or []
        req_blocks = self.req_to_blocks.setdefault(request.request_id, [])
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_required = -(-(num_computed + num_new_tokens + num_lookahead_tokens)
                         // self.block_size)
        num_new_blocks = num_required - len(req_blocks) - len(new_computed_blocks)
        # Hits sitting in the free queue stop being free once touched.
        num_revived = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_new_blocks > self.block_pool.get_num_free_blocks() - num_revived:
            if not req_blocks:
                del self.req_to_blocks[request.request_id]
            return None
        if new_computed_blocks:
            self.block_pool.touch(new_computed_blocks)
            req_blocks.extend(new_computed_blocks)
            self.num_cached_blocks[request.request_id] = len(req_blocks)
        new_blocks = self.block_pool.get_new_blocks(max(num_new_blocks, 0))
        req_blocks.extend(new_blocks)
        if self.enable_caching:
            self._cache_full_blocks(request, num_computed + num_new_tokens)
        return new_blocks

    def _cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Hash blocks that become full once this step's tokens are written."""
        num_full = min(num_tokens, request.num_tokens) // self.block_size
        start = self.num_cached_blocks.get(request.request_id, 0)
        if num_full <= start:
            return
        hashes = self._update_block_hashes(request)
        blocks = self.req_to_blocks[request.request_id]
        for i in range(start, num_full):
            self.block_pool.cache_full_block(blocks[i], hashes[i])
        self.num_cached_blocks[request.request_id] = num_full

    def free(self, request: Request) -> None:
        """Release the request's blocks; its tail blocks are evicted first."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        self.block_pool.free_blocks(reversed(blocks))

    def forget_blocks(self, request: Request, start_token: int, end_token: int) -> None:
        """Take the blocks holding the request's tokens [start_token, end_token) out of
        the prefix cache: their contents are not what their hashes say (a KV load into
        them failed). Call before `free`."""
        bs = self.block_size
        blocks = self.req_to_blocks.get(request.request_id, [])
        for block in blocks[start_token // bs:-(-end_token // bs)]:
            self.block_pool.uncache(block)

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def invalidate_prefix_cache(self, waiting: Iterable[Request]) -> bool:
        """The weights changed: no KV computed before may serve a request after.

        Forgets the cache (possible only when no request holds blocks, as
        `reset_prefix_cache`), and in any case starts a new hash lineage, so blocks
        still held by running requests never match a later lookup; waiting requests
        hash their prompts again under it. Returns whether the cache was emptied."""
        self.root_hash = hash((_ROOT_HASH, self.root_hash))
        for request in waiting:
            request.block_hashes.clear()
        return self.reset_prefix_cache()
