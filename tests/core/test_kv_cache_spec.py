"""The per-layer KV cache spec (vllm/kv_cache_spec.py): page sizes, grouping, sizing."""
import torch
from _core_helpers import make_request
from torch import nn

from vllm.attention.layer import Attention
from vllm.core.kv_cache_manager import KVCacheManager
from vllm.kv_cache_spec import (FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec,
                                get_kv_cache_config)
from vllm.worker.kv_cache_layout import collect_kv_cache_specs

FULL = FullAttentionSpec(16, 2, 8, torch.float32)
SLIDE = SlidingWindowSpec(16, 2, 8, torch.float32, sliding_window=32)


def test_page_sizes():
    assert FULL.page_size_bytes == 2 * 16 * 2 * 8 * 4
    assert SLIDE.page_size_bytes == FULL.page_size_bytes
    assert MLAAttentionSpec(16, 1, 40, torch.bfloat16).page_size_bytes == 16 * 40 * 2


def test_max_blocks_per_request():
    assert FULL.max_blocks_per_request(1000, 256) == 63
    # window 32 - 1 + 256 new tokens -> 18 blocks, + 1 for an unaligned window start
    assert SLIDE.max_blocks_per_request(1000, 256) == 19
    assert SLIDE.max_blocks_per_request(100, 256) == 7  # never more than the sequence


def test_one_group_without_hybrid():
    specs = {i: SLIDE if i % 2 == 0 else FULL for i in range(6)}
    cfg = get_kv_cache_config(specs, hybrid=False)
    assert len(cfg.kv_cache_groups) == 1 and not cfg.is_hybrid
    assert cfg.kv_cache_groups[0].kv_cache_spec == FULL
    assert [t.shared_by for t in cfg.kv_cache_tensors] == [[i] for i in range(6)]
    assert cfg.block_bytes() == 6 * FULL.page_size_bytes
    assert cfg.block_bytes([0, 1]) == 2 * FULL.page_size_bytes  # a pipeline stage


def test_hybrid_groups_share_tensors():
    specs = {i: FULL if i % 6 == 5 else SLIDE for i in range(12)}  # Gemma 3's 5:1
    cfg = get_kv_cache_config(specs)
    assert cfg.is_hybrid
    groups = [(g.kv_cache_spec.kind, g.layer_ids) for g in cfg.kv_cache_groups]
    assert groups == [("full_attention", [5, 11]), ("sliding_window", [0, 1]),
                      ("sliding_window", [2, 3]), ("sliding_window", [4, 6]),
                      ("sliding_window", [7, 8]), ("sliding_window", [9, 10])]
    assert [t.shared_by for t in cfg.kv_cache_tensors] == [[5, 0, 2, 4, 7, 9],
                                                           [11, 1, 3, 6, 8, 10]]
    assert cfg.block_bytes() == 2 * FULL.page_size_bytes
    assert cfg.max_blocks_per_request(1000, 256) == 63 + 5 * 19


def test_all_sliding_is_one_sliding_group():
    cfg = get_kv_cache_config({i: SLIDE for i in range(4)})
    assert len(cfg.kv_cache_groups) == 1 and cfg.is_hybrid
    assert len(cfg.kv_cache_tensors) == 4


def test_collected_from_attention_layers():
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(
                Attention(4, 8, 1.0, 2, prefix=f"model.layers.{i}.self_attn.attn",
                          per_layer_sliding_window=32 if i == 0 else None)
                for i in range(2))

    specs = collect_kv_cache_specs(Tiny(), 16, torch.float32)
    assert specs == {0: SLIDE, 1: FULL}


def test_sliding_group_frees_blocks_outside_its_window():
    """A hybrid manager: the full group keeps every block, the sliding group (window 8,
    blocks of 4) swaps the blocks wholly behind the window for the null block."""
    full = FullAttentionSpec(4, 2, 8, torch.float32)
    slide = SlidingWindowSpec(4, 2, 8, torch.float32, sliding_window=8)
    cfg = get_kv_cache_config({0: slide, 1: full})
    manager = KVCacheManager(num_blocks=20, block_size=4, kv_cache_config=cfg)
    assert not manager.enable_caching and manager.null_block.block_id == 0
    request = make_request("a", prompt_len=16)
    new = manager.allocate_slots(request, 16)
    assert len(new) == 4 and manager.get_group_block_ids("a") == [[5, 6, 7, 8]]
    assert manager.block_pool.get_num_free_blocks() == 20 - 1 - 8
    request.num_computed_tokens = 16  # a decode at position 16 sees 9..16
    manager.allocate_slots(request, 1)
    assert manager.get_group_block_ids("a") == [[0, 0, 7, 8, 10]]
    assert manager.new_group_block_ids["a"] == [[10]]
    assert manager.block_pool.get_num_free_blocks() == 20 - 1 - 10 + 2
    manager.free(request)
    assert manager.block_pool.get_num_free_blocks() == 19 and manager.usage == 0.0
