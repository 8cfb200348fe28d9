"""KV cache manager and block pool on synthetic requests: hits, LRU, ref counts, hashes."""
from __future__ import annotations

import pytest
from _core_helpers import make_request

from vllm.core.block_pool import BlockPool
from vllm.core.kv_cache_manager import KVCacheManager, hash_block_tokens

BS = 4


def _admit(manager: KVCacheManager, request):
    """What the scheduler does for a waiting request: look up hits, allocate the rest."""
    hits, num_computed = manager.get_computed_blocks(request)
    new = manager.allocate_slots(request, request.num_tokens - num_computed, hits)
    assert new is not None
    request.num_computed_tokens = num_computed
    return hits, num_computed


def test_hit_is_capped_below_the_last_token():
    """A fully cached prompt still computes its last token (it is needed for logits)."""
    manager = KVCacheManager(num_blocks=16, block_size=BS)
    _admit(manager, make_request("a", prompt_len=2 * BS))
    hits, num_computed = _admit(manager, make_request("b", prompt_len=2 * BS))
    assert len(hits) == 1 and num_computed == BS  # not 2 * BS: capped at num_tokens - 1
    hits, num_computed = _admit(manager, make_request("c", prompt_len=2 * BS + 1))
    assert len(hits) == 2 and num_computed == 2 * BS


def test_hashes_chain_over_the_whole_prefix():
    """The same block of tokens after a different prefix is a different block."""
    manager = KVCacheManager(num_blocks=16, block_size=BS)
    a = make_request("a", prompt_len=3 * BS)
    _admit(manager, a)
    b = make_request("b", prompt_len=3 * BS)
    b.prompt_token_ids[0] = b.all_token_ids[0] = 9999  # first block differs, rest equal
    hits, _ = _admit(manager, b)
    assert hits == []
    assert a.block_hashes[1] != b.block_hashes[1]
    first = hash_block_tokens(None, tuple(a.all_token_ids[:BS]))
    assert a.block_hashes[0] == first
    assert a.block_hashes[1] == hash_block_tokens(first, tuple(a.all_token_ids[BS:2 * BS]))


def test_shared_prefix_ref_counts_and_free():
    manager = KVCacheManager(num_blocks=16, block_size=BS)
    a, b = make_request("a", prompt_len=2 * BS + 1), make_request("b", prompt_len=2 * BS + 1)
    _admit(manager, a)
    hits, _ = _admit(manager, b)
    shared = manager.req_to_blocks["a"][:2]
    assert hits == shared and [blk.ref_cnt for blk in shared] == [2, 2]
    pool = manager.block_pool
    manager.free(a)
    assert [blk.ref_cnt for blk in shared] == [1, 1]
    assert all(blk.block_id not in pool.free_queue for blk in shared)
    manager.free(b)
    assert [blk.ref_cnt for blk in shared] == [0, 0]
    # Free but still cached: a new request with the prefix revives them.
    assert all(blk.block_id in pool.free_queue and blk.block_hash is not None
               for blk in shared)
    hits, _ = _admit(manager, make_request("c", prompt_len=2 * BS + 1))
    assert hits == shared and all(blk.block_id not in pool.free_queue for blk in shared)


def test_lru_eviction_order():
    """Freed blocks are reused least recently freed first, a request's tail first."""
    manager = KVCacheManager(num_blocks=4, block_size=BS)
    a = make_request("a", prompt_len=2 * BS, first_token=100)
    b = make_request("b", prompt_len=2 * BS, first_token=200)
    _admit(manager, a)
    _admit(manager, b)
    a_blocks, b_blocks = list(manager.req_to_blocks["a"]), list(manager.req_to_blocks["b"])
    manager.free(a)
    manager.free(b)
    pool = manager.block_pool
    order = list(pool.free_queue)
    assert order == [a_blocks[1].block_id, a_blocks[0].block_id,
                     b_blocks[1].block_id, b_blocks[0].block_id]
    # Taking one block evicts a's tail block; a's head block (and b) stay cached.
    c = make_request("c", prompt_len=BS - 1, first_token=300)
    _admit(manager, c)
    assert manager.req_to_blocks["c"] == [a_blocks[1]]
    assert a_blocks[1].block_hash is None
    assert pool.get_cached_block(a.block_hashes[0]) is a_blocks[0]
    assert pool.get_cached_block(a.block_hashes[1]) is None
    hits, _ = _admit(manager, make_request("b2", prompt_len=2 * BS + 1, first_token=200))
    assert hits == b_blocks


def test_allocation_fails_cleanly_when_the_pool_is_short():
    manager = KVCacheManager(num_blocks=2, block_size=BS, enable_caching=False)
    request = make_request("a", prompt_len=3 * BS)
    assert manager.allocate_slots(request, request.num_tokens) is None
    assert "a" not in manager.req_to_blocks
    assert manager.block_pool.get_num_free_blocks() == 2


def test_block_pool_ref_counts_and_errors():
    pool = BlockPool(num_blocks=3, enable_caching=True)
    blocks = pool.get_new_blocks(2)
    assert [b.ref_cnt for b in blocks] == [1, 1] and pool.get_num_free_blocks() == 1
    pool.cache_full_block(blocks[0], 1234)
    pool.touch([blocks[0]])
    assert blocks[0].ref_cnt == 2
    pool.free_blocks(blocks)
    assert pool.get_num_free_blocks() == 2 and blocks[0].ref_cnt == 1
    with pytest.raises(ValueError):
        pool.get_new_blocks(3)
    assert pool.reset_prefix_cache() is False  # a block is still in use
    pool.free_blocks([blocks[0]])
    assert pool.reset_prefix_cache() is True and pool.get_cached_block(1234) is None
