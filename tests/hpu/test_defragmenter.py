"""KV block defragmentation for contiguous paged attention."""
from __future__ import annotations

import pytest
import torch

from vllm.hpu.defragmenter import HPUDefragmenter, plan_defrag, swap_blocks


def test_plan_only_above_threshold():
    assert plan_defrag([0, 1, 2, 40], threshold=40) == []
    assert plan_defrag([], threshold=0) == []
    moves = plan_defrag([0, 1, 2, 40, 41, 50], threshold=32)
    assert moves == [(50, 3), (41, 4), (40, 5)]
    assert plan_defrag([0, 1, 2, 40, 41, 50], threshold=32, max_moves=1) == [(50, 3)]


def test_swap_blocks_exchanges_contents():
    bs = 4
    cache = torch.arange(10 * bs, dtype=torch.float32).view(10 * bs, 1, 1).repeat(1, 2, 3)
    original = cache.clone()
    swap_blocks([cache], [(8, 1), (9, 2)], bs, pad_block_id=None)
    blocks, orig = cache.view(10, bs, 2, 3), original.view(10, bs, 2, 3)
    assert torch.equal(blocks[1], orig[8]) and torch.equal(blocks[8], orig[1])
    assert torch.equal(blocks[2], orig[9]) and torch.equal(blocks[9], orig[2])
    assert torch.equal(blocks[0], orig[0])


def test_swap_blocks_padding_is_a_no_op():
    bs = 2
    cache = torch.randn(12 * bs, 1, 4)
    original = cache.clone()
    swap_blocks([cache], [(10, 0)], bs, pad_block_id=11)
    blocks, orig = cache.view(12, bs, 1, 4), original.view(12, bs, 1, 4)
    assert torch.equal(blocks[0], orig[10]) and torch.equal(blocks[10], orig[0])
    assert torch.equal(blocks[1:10], orig[1:10]) and torch.equal(blocks[11], orig[11])


def test_defragmenter_keeps_data_reachable():
    bs, n = 4, 64
    k = torch.randn((n + 1) * bs, 2, 3)
    v = torch.randn((n + 1) * bs, 2, 3)
    used = [0, 5, 60, 61, 63]
    before = {b: (k.view(-1, bs, 2, 3)[b].clone(), v.view(-1, bs, 2, 3)[b].clone())
              for b in used}
    defrag = HPUDefragmenter(n, bs, threshold=8, pad_block_id=n)
    moved = defrag.defragment(used, [k, v])
    assert moved == 4  # 63, 61, 60 and 5 all lie above the packed range 0..4
    physical = defrag.resolve_table(used)
    assert max(physical) == len(used) - 1  # packed at the bottom
    for logical, phys in zip(used, physical):
        assert torch.equal(k.view(-1, bs, 2, 3)[phys], before[logical][0])
        assert torch.equal(v.view(-1, bs, 2, 3)[phys], before[logical][1])
    assert defrag.defragment(used, [k, v]) == 0  # nothing left to do
    assert sorted(defrag.to_physical) == list(range(n))


def test_threshold_from_env(monkeypatch):
    monkeypatch.setenv("VLLM_DEFRAG_THRESHOLD", "5")
    assert HPUDefragmenter(16, 4).threshold == 5
    monkeypatch.setenv("VLLM_DEFRAG_THRESHOLD", "-1")
    with pytest.raises(ValueError, match="VLLM_DEFRAG_THRESHOLD"):
        HPUDefragmenter(16, 4)


def test_swaps_run_in_buckets_inside_the_tracker():
    """4 moves run as one swap of the 8-pair bucket, inside `track(8)`; K and V are
    swapped as whole tensors; a bucket smaller than the plan is refused."""
    from vllm.hpu.defragmenter import swap_bucket, swap_buckets
    bs, n = 2, 40
    k, v = torch.randn((n + 1) * bs, 1, 2), torch.randn((n + 1) * bs, 1, 2)
    seen = []

    class Track:
        def __init__(self, bucket):
            seen.append(bucket)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    defrag = HPUDefragmenter(n, bs, threshold=2, pad_block_id=n)
    assert defrag.defragment([0, 30, 31, 35, 39], [k, v], track=Track) == 4
    assert seen == [8]
    assert [swap_bucket(m) for m in (1, 8, 9, 17, 64)] == [8, 8, 16, 32, 64]
    assert swap_buckets(64) == [8, 16, 32, 64]
    with pytest.raises(ValueError, match="do not fit"):
        swap_blocks([k], [(1, 2)] * 9, bs, pad_block_id=n, bucket=8)
