"""The order buckets are warmed in, and where a warmup time budget cuts it.

Without a budget and without traffic figures, the warmup keeps its historical order:
per phase, largest bucket first (an out-of-memory shows at once). With a bucket plan
each bucket has the share of its phase's trace passes it served; the warmup then
runs the buckets of both phases merged in order of that share, so that a warmup
cut short by `VLLM_WARMUP_BUDGET_S` has compiled the shapes that carry the most
traffic. With a budget and no plan, smaller buckets go first: short batches are
the common ones in chat traffic, and they are the cheapest to compile.
"""
from __future__ import annotations

from typing import Optional

from vllm.hpu.bucketing import Bucket
from vllm.hpu.padding_cost import prompt_cost

WarmupItem = tuple[bool, Bucket]
"""(is_prompt, bucket)."""


def bucket_size(is_prompt: bool, b: Bucket, block_size: int) -> int:
    return (prompt_cost(*b, block_size) if is_prompt else b.batch_size * b.num_blocks)


def largest_first(buckets: list[Bucket], is_prompt: bool, block_size: int) -> list[Bucket]:
    return sorted(buckets, reverse=True, key=lambda b: (bucket_size(is_prompt, b, block_size), b))


def traffic_order(prompt: list[Bucket], decode: list[Bucket], block_size: int,
                  prompt_traffic: Optional[dict[Bucket, int]] = None,
                  decode_traffic: Optional[dict[Bucket, int]] = None) -> list[WarmupItem]:
    """Both phases' buckets, most expected traffic first (share of the phase's passes),
    then smallest first."""
    def shares(traffic: Optional[dict[Bucket, int]]) -> dict[Bucket, float]:
        total = sum((traffic or {}).values())
        return {b: n / total for b, n in (traffic or {}).items()} if total else {}

    p_share, d_share = shares(prompt_traffic), shares(decode_traffic)
    items = [(True, b) for b in prompt] + [(False, b) for b in decode]

    def key(item: WarmupItem) -> tuple:
        is_prompt, b = item
        share = (p_share if is_prompt else d_share).get(b, 0.0)
        return (-share, bucket_size(is_prompt, b, block_size), not is_prompt, b)

    return sorted(items, key=key)
