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
from vllm.kv_cache_spec import KVCacheConfig, KVCacheSpec, SlidingWindowSpec
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
    """Block tables per request over one BlockPool.

    With a hybrid KV cache config (vllm/kv_cache_spec.py: several groups, or a
    sliding-window group) each request has one table per group, all drawn from the one
    pool; `req_to_blocks` is group 0's (full attention when the model has any) and
    `group_tables` holds every group's. A sliding-window group frees the blocks that fell
    out of its window before each allocation: their entries become the null block
    (block 0, reserved, never written; the runner's tables keep the old ids, which
    its attention masks by position). Prefix caching is off for a hybrid config: a
    hit would need each sliding group's window blocks to be cached too.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 kv_cache_config: Optional[KVCacheConfig] = None) -> None:
        self.block_size = block_size
        hybrid = kv_cache_config is not None and kv_cache_config.is_hybrid
        if hybrid and enable_caching:
            logger.info("Prefix caching is disabled: the KV cache has sliding-window "
                        "groups (%s), whose reuse is not implemented; "
                        "--disable-hybrid-kv-cache-manager keeps it on instead.",
                        kv_cache_config.describe())
            enable_caching = False
        if enable_caching and kv_cache_config is not None and kv_cache_config.state_specs:
            logger.info("Prefix caching is disabled: the model has state-space layers "
                        "(%d), whose per-request state is not snapshotted at block "
                        "boundaries, so a prefix-cache hit could not resume them.",
                        len(kv_cache_config.state_specs))
            enable_caching = False
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.group_specs: list[KVCacheSpec] = (
            [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups] if hybrid else [])
        """Each group's spec (hybrid configs only; empty: one plain group)."""
        self.null_block: Optional[KVCacheBlock] = (
            self.block_pool.get_new_blocks(1)[0] if hybrid else None)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.group_tables: list[dict[str, list[KVCacheBlock]]] = (
            [self.req_to_blocks] + [{} for _ in self.group_specs[1:]])
        """Per group: request -> its block table (index 0 is `req_to_blocks`)."""
        self.new_group_block_ids: dict[str, list[list[int]]] = {}
        """Groups 1..: the block ids the last allocation appended, per request (what the
        scheduler sends the workers beside group 0's new blocks)."""
        self.num_cached_blocks: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()
        self.root_hash = _ROOT_HASH
        """The parent of every request's first block: a new one after a weight update
        starts a hash lineage that no block computed with the old weights is in."""

    @property
    def usage(self) -> float:
        if self.null_block is None:
            return self.block_pool.get_usage()
        pool = self.block_pool  # the null block is not the requests'
        return 1.0 - pool.get_num_free_blocks() / max(1, pool.num_blocks - 1)

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
        if self.group_specs:
            return self._allocate_groups(request, num_new_tokens + num_lookahead_tokens)
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

    def _allocate_groups(self, request: Request, num_new_tokens: int
                         ) -> Optional[list[KVCacheBlock]]:
        """allocate_slots for a hybrid config (no prefix-cache hits): every group's
        table grows to cover the new tokens, after sliding groups free what fell out of
        their window. Returns group 0's new blocks; the other groups' are in
        `new_group_block_ids`."""
        req_id = request.request_id
        num_computed = request.num_computed_tokens
        tables = [t.setdefault(req_id, []) for t in self.group_tables]
        for spec, table in zip(self.group_specs, tables):
            if isinstance(spec, SlidingWindowSpec):
                self._free_outside_window(table, num_computed - spec.sliding_window + 1)
        num_required = -(-(num_computed + num_new_tokens) // self.block_size)
        wanted = [max(0, num_required - len(t)) for t in tables]
        if sum(wanted) > self.block_pool.get_num_free_blocks():
            if not tables[0]:
                for t in self.group_tables:
                    t.pop(req_id, None)
            return None
        new = [self.block_pool.get_new_blocks(n) for n in wanted]
        for table, blocks in zip(tables, new):
            table.extend(blocks)
        self.new_group_block_ids[req_id] = [[b.block_id for b in blocks] for blocks in new[1:]]
        return new[0]

    def _free_outside_window(self, table: list[KVCacheBlock], first_needed: int) -> None:
        """Free the table's blocks wholly before token `first_needed` (the first one
        the step's first query still sees): they become the null block."""
        null = self.null_block
        dead = [b for b in table[:max(0, first_needed) // self.block_size] if b is not null]
        for i in range(max(0, first_needed) // self.block_size):
            table[i] = null
        self.block_pool.free_blocks(dead)

    def get_group_block_ids(self, request_id: str) -> list[list[int]]:
        """The block tables of groups 1.. of the request (null block ids included)."""
        return [[b.block_id for b in t.get(request_id, [])] for t in self.group_tables[1:]]

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
        self.num_cached_blocks.pop(request.request_id, None)
        self.new_group_block_ids.pop(request.request_id, None)
        for table in self.group_tables:
            blocks = table.pop(request.request_id, [])
            self.block_pool.free_blocks(b for b in reversed(blocks) if b is not self.null_block)

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
        if self.null_block is not None:  # no prefix cache: only whether all is free
            return self.block_pool.get_num_free_blocks() == self.block_pool.num_blocks - 1
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
