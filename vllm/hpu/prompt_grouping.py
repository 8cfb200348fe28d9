"""How the HPU runner splits one step's prompts into padded passes.

A step's prompts (one dependency level, `input_prep.dependency_levels`) run as one or
more prompt passes, each padded to a warmed bucket (B, Q, C): B rows of Q query tokens
and C context blocks. One pass for all of them pads every short prompt to the longest;
one pass per prompt pads nothing beyond its bucket but pays the fixed cost of a pass
(graph replay, reading every weight once) per prompt. `group_prompts` finds the exact
cheapest split, with the cost model of `padding_cost.py`:

    cost(partition) = sum over passes of [prompt_cost(covering bucket) + overhead]

where `overhead` is the fixed cost of one pass in token slots
(`VLLM_PROMPT_PASS_OVERHEAD_TOKENS`, default `PROMPT_PASS_OVERHEAD_TOKENS`). The
prompts are sorted by (context blocks, query length), longest first, and the split
is the least-cost partition into contiguous runs of that order (a dynamic programme,
O(n^2) bucket lookups for n prompts, n <= max_num_prefill_seqs). A run must fit a
warmed bucket (`covering`); a lone prompt always forms a pass (the runner falls back
to a new bucket for it if none covers it).

The bucket planner replays the trace through this same function, so its predicted
waste is the waste the runner measures.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, NamedTuple, Optional, Protocol, TypeVar

from vllm import envs
from vllm.hpu.bucketing import Bucket
from vllm.hpu.padding_cost import prompt_cost

if TYPE_CHECKING:
    from vllm.hpu.bucket_planner import BucketPlan

logger = logging.getLogger(__name__)

PROMPT_PASS_OVERHEAD_TOKENS = 128
"""Fixed cost of one prompt pass, in token slots of padded compute.

Gaudi's matrix engine is under-used below ~128 rows (HPU.md: the recommended block
size is 128 for that reason), so a pass costs at least about what 128 token rows
cost whatever it carries; the graph replay and the one read of every weight per pass
come on top (on Gaudi 2, reading the weights once takes about as long as the matrix
math of ~175 tokens: 2.45 TB/s HBM against ~430 dense bf16 TFLOPS). 128 is the
conservative end: splitting a batch must save at least a block's worth of padding.
Set `VLLM_PROMPT_PASS_OVERHEAD_TOKENS` for another device or model.
"""

Covering = Callable[[int, int, int], Optional[Bucket]]
"""(batch size, longest query, most context blocks) -> least-cost warmed bucket or None."""


class PromptLike(Protocol):
    @property
    def query_len(self) -> int: ...

    @property
    def num_context_blocks(self) -> int: ...


P = TypeVar("P", bound=PromptLike)


class PromptShape(NamedTuple):
    """A prompt reduced to what grouping looks at (the planner's replay of a trace)."""
    query_len: int
    num_context_blocks: int


def resolve_pass_overhead(plan: Optional["BucketPlan"] = None) -> int:
    """The per-pass overhead in use: the env knob, else the plan's, else the default.

    A plan records the overhead its predictions assumed; overriding it is allowed
    but makes the measured waste differ from the predicted, so it is logged.
    """
    plan_value = plan.prompt_pass_overhead if plan is not None else None
    env = envs.VLLM_PROMPT_PASS_OVERHEAD_TOKENS
    if env is not None:
        if env < 0:
            raise ValueError(f"VLLM_PROMPT_PASS_OVERHEAD_TOKENS must be >= 0, got {env}.")
        if plan_value is not None and env != plan_value:
            logger.warning("VLLM_PROMPT_PASS_OVERHEAD_TOKENS=%d overrides the bucket plan's "
                           "%d: the plan's predicted padding waste assumed %d.", env,
                           plan_value, plan_value)
        return env
    return PROMPT_PASS_OVERHEAD_TOKENS if plan_value is None else plan_value


def _ordered(seqs: list[P]) -> list[P]:
    return sorted(seqs, key=lambda s: (s.num_context_blocks, s.query_len), reverse=True)


def group_prompts(seqs: list[P], covering: Covering, block_size: int,
                  overhead: int = PROMPT_PASS_OVERHEAD_TOKENS) -> list[list[P]]:
    """The least-cost split of `seqs` into passes that each fit a warmed bucket.

    best[j] is the least cost of passing the first j prompts of the order; a pass
    [i, j) costs its covering bucket plus `overhead`. Growing a run only grows its
    shape, so once no bucket covers [i, j) none covers [i, j') for j' > j.
    """
    ordered = _ordered(seqs)
    n = len(ordered)
    best = [0.0] + [float("inf")] * n
    start = [0] * (n + 1)
    for i in range(n):
        query = 0
        ctx = ordered[i].num_context_blocks  # the largest of any run starting at i
        for j in range(i + 1, n + 1):
            query = max(query, ordered[j - 1].query_len)
            bucket = covering(j - i, query, ctx)
            if bucket is None:
                if j > i + 1:
                    break
                cost = prompt_cost(1, query, ctx, block_size)  # lone prompt: fallback
            else:
                cost = prompt_cost(*bucket, block_size)
            total = best[i] + cost + overhead
            if total < best[j]:
                best[j], start[j] = total, i
            if bucket is None:
                break
    groups: list[list[P]] = []
    j = n
    while j > 0:
        groups.append(ordered[start[j]:j])
        j = start[j]
    return groups[::-1]


def greedy_group_prompts(seqs: list[P], covering: Covering, block_size: int = 0,
                         overhead: int = 0) -> list[list[P]]:
    """The runner's former split, kept as the benchmarks' baseline: in the same order,
    a pass grows while a bucket covers it (padding and pass count ignored)."""
    groups: list[list[P]] = []
    current: list[P] = []
    query = 0
    for seq in _ordered(seqs):
        q = max(query, seq.query_len)
        ctx = current[0].num_context_blocks if current else seq.num_context_blocks
        if current and covering(len(current) + 1, q, ctx) is None:
            groups.append(current)
            current, q = [], seq.query_len
        current.append(seq)
        query = q
    if current:
        groups.append(current)
    return groups


Grouping = Callable[[list, Covering, int, int], list[list]]
"""`group_prompts` or `greedy_group_prompts`: (prompts, covering, block_size, overhead)."""
