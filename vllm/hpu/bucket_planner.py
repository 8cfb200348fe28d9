"""Bucket planner: the prompt and decode buckets that minimise padded compute for a trace.

    python -m vllm.hpu.bucket_planner --trace TRACE --max-buckets N \\
        [--warmup-budget-s S] --output plan.json

reads a traffic trace (`bucket_trace.py`: recorded by a server with
`VLLM_BUCKET_TRACE=path`, or a ShareGPT-like JSON), chooses at most N prompt and N
decode buckets, prints the expected padding waste of the traced server's own buckets
(the trace's header records them; today's default exponential buckets for a trace
without them) and of the plan at the same bucket count, and writes the plan; a
server takes it with `VLLM_BUCKET_PLAN=plan.json` (strategy `plan`) and warms
exactly the buckets printed.

Prefix caching (on by default) gives a prompt context blocks: its cached prefix,
read by attention but not computed again. The trace records each prompt's query
(the tokens computed) and context; a replay pads both as the server does, and where
the server's prompts have context the plan's prompt buckets have that dimension too
(`plan_prompt_phase`), within the same bucket budget.

Cost model (`padding_cost.py`): a prompt pass in bucket (B, Q) computes B * Q token
slots; a decode pass in bucket (B, N) costs B * row_weight + N * block_size.

The plan's shape: batch-size buckets B_1 < ... < B_g, each with its own ladder of
length buckets (query length for prompts, KV blocks for decodes); a grid is the
special case where every ladder is the same. A pass (b, v) runs in the smallest
batch-size bucket >= b and that ladder's smallest value >= v. The planner finds the
exact minimum of the trace's total padded cost over all such plans with at most N
buckets, by two nested dynamic programs over sorted values:

- inner, per batch-size group (the passes with b in (B_{i-1}, B_i]): the optimal
  ladder of k values for every k. With the group's distinct lengths v_1 < ... < v_n
  and pass counts c, an optimal ladder's values are data values, and a ladder value
  v_j serves a contiguous run of lengths, so F_k(j) = min_{i<j} F_{k-1}(i) +
  v_j * (c_{i+1} + ... + c_j), F_0(0) = 0 (O(k n^2)).
- outer, over the sorted distinct batch sizes: G(j, u) = min over i < j and k of
  G(i, u - k) + cost of the group (b_i, b_j] with bucket b_j and its best k-ladder;
  prompts: b_j * F_k, decodes: row_weight * b_j * count + block_size * F_k.

With more than `max_candidates` distinct values in a dimension, bucket values are
restricted to a geometric set of the data values with ratio r = 1 + eps (every value
rounds up to a candidate at most r times larger): rounding any plan's values up to
candidates multiplies each pass's cost by at most r per dimension, so the result is
within r^2 of the optimum (the bound is printed and written into the plan).

The server picks, for a batch, the covering bucket of least cost among all of them
(`HPUBucketingContext`), which is never worse than the plan's own assignment; the
waste printed is the server's lookup replayed over the trace.

Prompt passes are not given by the trace: the runner splits each step's prompts into
passes by the buckets it has (`prompt_grouping.group_prompts`: least padded compute
plus a fixed cost per pass), and the buckets are planned for the passes. The planner
alternates the two: split every prompt set of the trace (first against every shape
the token budget allows, then against the last plan's buckets), plan buckets for
the passes of that split, and keep the plan whose replay (split included) costs
least, stopping when a round does not improve it. Every replay calls the runner's
own split function, so the waste printed is what a server running the plan measures.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import numpy as np

from vllm.hpu.bucket_trace import EngineLimits, TracePass, read_trace
from vllm.hpu.bucketing import Bucket, HPUBucketingContext
from vllm.hpu.padding_cost import DECODE_ROW_WEIGHT, decode_cost, prompt_cost, waste
from vllm.hpu.prompt_grouping import (Covering, Grouping, PromptShape, group_prompts,
                                      resolve_pass_overhead)

logger = logging.getLogger(__name__)

PLAN_FORMAT = "vllm-hpu-bucket-plan"
MAX_CANDIDATES = 128
MAX_PLAN_ROUNDS = 4
"""Split-and-plan rounds of the prompt phase (it usually settles in two or three)."""
INF = float("inf")


# ---------------------------------------------------------------- the two DPs

def ladder_costs(values: np.ndarray, counts: np.ndarray, max_k: int
                 ) -> tuple[np.ndarray, list[np.ndarray]]:
    """Least `sum(count * ladder value)` with k = 1..max_k ladder values (index k-1).

    `values` ascending; returns the costs and, per k, the argmin table for
    `ladder_values`. A value of the ladder always closes a run of data values.
    """
    n = len(values)
    cum = np.concatenate([[0.0], np.cumsum(counts, dtype=np.float64)])
    # cost[i, j] = values[j-1] * (cum[j] - cum[i]) for i < j: points i..j-1 in bucket j-1.
    cost = values[None, :].astype(np.float64) * (cum[None, 1:] - cum[:, None])
    cost = np.where(np.arange(n + 1)[:, None] < np.arange(1, n + 1)[None, :], cost, INF)
    prev = np.full(n + 1, INF)
    prev[0] = 0.0
    out = np.full(max_k, INF)
    choices = []
    for k in range(min(max_k, n)):
        total = prev[:, None] + cost  # [i, j-1]
        arg = total.argmin(axis=0)
        best = total[arg, np.arange(n)]
        prev = np.concatenate([[INF], best])
        out[k] = prev[n]
        choices.append(arg)
    for k in range(n, max_k):  # more values than data points buys nothing
        out[k] = out[n - 1]
    return out, choices


def ladder_values(values: np.ndarray, choices: list[np.ndarray], k: int) -> list[int]:
    """Backtrack the k-value ladder of `ladder_costs`."""
    k = min(k, len(choices))
    ladder, j = [], len(values)
    for level in range(k - 1, -1, -1):
        ladder.append(int(values[j - 1]))
        j = int(choices[level][j - 1])
        if j == 0:
            break
    return sorted(ladder)


def geometric_candidates(values: list[int], limit: int) -> tuple[list[int], float]:
    """At most ~`limit` of the sorted distinct `values`, each value within ratio r of
    the next candidate at or above it; returns (candidates, r). All values: r = 1."""
    if len(values) <= limit:
        return list(values), 1.0
    ratio = (values[-1] / max(values[0], 1)) ** (1.0 / max(1, limit - 1))
    ratio = max(ratio, 1.0 + 1e-9)
    keep, c = [], values[-1]
    for v in reversed(values):
        if v * ratio < c:  # v is too far below the last candidate: it becomes one
            c = v
        if not keep or keep[-1] != c:
            keep.append(c)
    return sorted(set(keep)), ratio


def _round_up(value: int, candidates: list[int]) -> int:
    return candidates[int(np.searchsorted(candidates, value))]


GroupCost = Callable[[int, float, np.ndarray], np.ndarray]
"""(group batch-size bucket, passes in the group, ladder costs by k) -> group cost by k."""


@dataclass
class PhasePlan:
    buckets: list[tuple[int, int]]
    cost: float
    ratio_bound: float


@dataclass
class _PhaseTable:
    """The outer DP of `plan_phase`: best[j, u] is the least cost of the batch sizes
    below candidate j with exactly u buckets; `back` its choices."""
    best: np.ndarray
    back: dict[tuple[int, int], tuple[int, int]]
    bs_cand: list[int]
    vals: np.ndarray
    counts: np.ndarray
    present: np.ndarray
    ratio_bound: float

    def cost_by_count(self) -> np.ndarray:
        """Least cost with at most k buckets, k = 0..K (inf where none fits)."""
        return np.minimum.accumulate(self.best[len(self.bs_cand)])


def _phase_table(points: dict[tuple[int, int], int], max_buckets: int,
                 group_cost: GroupCost, max_candidates: int) -> _PhaseTable:
    if max_buckets < 1:
        raise ValueError(f"max_buckets must be >= 1, got {max_buckets}.")
    bs_cand, r_b = geometric_candidates(sorted({b for b, _ in points}), max_candidates)
    len_cand, r_v = geometric_candidates(sorted({v for _, v in points}), max_candidates)
    m, n, K = len(bs_cand), len(len_cand), max_buckets
    counts = np.zeros((m, n))
    present = np.zeros((m, n), dtype=bool)
    for (b, v), c in points.items():
        i, j = bs_cand.index(_round_up(b, bs_cand)), len_cand.index(_round_up(v, len_cand))
        counts[i, j] += c
        present[i, j] = True
    vals = np.asarray(len_cand, dtype=np.float64)
    best = np.full((m + 1, K + 1), INF)
    best[0, 0] = 0.0
    back: dict[tuple[int, int], tuple[int, int]] = {}
    for i in range(m):
        if not np.isfinite(best[i]).any():
            continue
        group_counts = np.zeros(n)
        group_present = np.zeros(n, dtype=bool)
        for j in range(i + 1, m + 1):  # group = batch sizes i..j-1, bucket bs_cand[j-1]
            group_counts += counts[j - 1]
            group_present |= present[j - 1]
            if not present[j - 1].any():
                continue  # a group ends at a batch size the trace has
            sel = np.flatnonzero(group_present)
            f, _ = ladder_costs(vals[sel], group_counts[sel], K)
            g = group_cost(bs_cand[j - 1], float(group_counts.sum()), f)  # by k-1
            ks = np.arange(1, K + 1)
            us = np.arange(K + 1)
            src = us[:, None] - ks[None, :]
            total = np.where(src >= 0, best[i][np.clip(src, 0, K)], INF) + g[None, :]
            arg = total.argmin(axis=1)
            cand = total[us, arg]
            better = cand < best[j]
            for u in np.flatnonzero(better):
                best[j, u] = cand[u]
                back[(j, int(u))] = (i, int(arg[u]) + 1)
    return _PhaseTable(best, back, bs_cand, vals, counts, present, r_b * r_v)


def plan_phase(points: dict[tuple[int, int], int], max_buckets: int, group_cost: GroupCost,
               max_candidates: int = MAX_CANDIDATES) -> PhasePlan:
    """Exact least-cost (batch size, length) buckets for `points` ((b, v) -> passes;
    a point with 0 passes must still be covered), at most `max_buckets` of them."""
    t = _phase_table(points, max_buckets, group_cost, max_candidates)
    m = len(t.bs_cand)
    u = int(np.argmin(t.best[m]))
    if not np.isfinite(t.best[m, u]):
        raise ValueError("no plan fits: more batch sizes than buckets; raise --max-buckets.")
    total_cost, buckets, j = float(t.best[m, u]), [], m
    while j > 0:
        i, k = t.back[(j, u)]
        sel_rows = slice(i, j)
        gp = t.present[sel_rows].any(axis=0)
        gc = t.counts[sel_rows].sum(axis=0)
        sel = np.flatnonzero(gp)
        _, choices = ladder_costs(t.vals[sel], gc[sel], k)
        buckets += [(t.bs_cand[j - 1], v) for v in ladder_values(t.vals[sel], choices, k)]
        j, u = i, u - k
    return PhasePlan(sorted(buckets), total_cost, t.ratio_bound)


MAX_CTX_CANDIDATES = 6
"""Context values a prompt plan considers (geometric over the trace's, like the other
dimensions' candidates): each range of them is planned as one class."""


def plan_prompt_phase(points: dict[tuple[int, int, int], int], max_buckets: int,
                      block_size: int, max_candidates: int = MAX_CANDIDATES,
                      max_ctx_candidates: int = MAX_CTX_CANDIDATES) -> tuple[list[Bucket],
                                                                               float, float]:
    """Least-cost prompt buckets (b, query, context blocks) for `points`, at most
    `max_buckets` in all; returns (buckets, cost, optimality bound).

    With prefix caching a prompt pass has context blocks (its cached prefix, read,
    not computed again); the server's buckets have that dimension, so the plan has
    it too. The passes are split into classes by context (contiguous ranges of the
    candidate context values; a class's buckets all have its highest value C), each
    class is planned in (b, query) by `plan_phase` with cost b * (query + C *
    block_size) per pass, and the bucket budget is shared out between the classes by
    a DP over the sorted context values (each class costs its plan's cost for every
    bucket count). Without context this is `plan_phase` itself.
    """
    ctx_values = sorted({c for _, _, c in points})
    if ctx_values == [0]:
        p = plan_phase({(b, q): n for (b, q, _), n in points.items()}, max_buckets,
                       prompt_group_cost, max_candidates)
        return [Bucket(b, q, 0) for b, q in p.buckets], p.cost, p.ratio_bound
    cands, r_c = geometric_candidates(ctx_values, max_ctx_candidates)
    by_cand: list[dict[tuple[int, int], int]] = [{} for _ in cands]
    for (b, q, c), n in points.items():
        group = by_cand[cands.index(_round_up(c, cands))]
        group[(b, q)] = group.get((b, q), 0) + n
    n, K = len(cands), max_buckets

    def class_points(i: int, j: int) -> dict[tuple[int, int], int]:
        merged: dict[tuple[int, int], int] = {}
        for group in by_cand[i:j]:
            for key, count in group.items():
                merged[key] = merged.get(key, 0) + count
        return merged

    def class_cost(j: int) -> GroupCost:
        ctx_tokens = cands[j - 1] * block_size
        return lambda b, count, f: b * f + b * count * ctx_tokens

    table: dict[tuple[int, int], np.ndarray] = {}
    bound = 1.0
    for i in range(n):
        for j in range(i + 1, n + 1):
            t = _phase_table(class_points(i, j), K, class_cost(j), max_candidates)
            table[(i, j)] = t.cost_by_count()
            bound = max(bound, t.ratio_bound)
    best = np.full((n + 1, K + 1), INF)
    best[0, 0] = 0.0
    back: dict[tuple[int, int], tuple[int, int]] = {}
    for j in range(1, n + 1):
        for i in range(j):
            costs = table[(i, j)]
            for u in range(1, K + 1):
                for k in range(1, u + 1):
                    total = best[i, u - k] + costs[k]
                    if total < best[j, u]:
                        best[j, u], back[(j, u)] = total, (i, k)
    u = int(np.argmin(best[n]))
    if not np.isfinite(best[n, u]):
        raise ValueError("no plan fits: more batch sizes and context classes than buckets; "
                         "raise --max-buckets.")
    buckets: list[Bucket] = []
    j = n
    while j > 0:
        i, k = back[(j, u)]
        p = plan_phase(class_points(i, j), k, class_cost(j), max_candidates)
        buckets += [Bucket(b, q, cands[j - 1]) for b, q in p.buckets]
        j, u = i, u - k
    return sorted(buckets), float(best[n].min()), bound * r_c


def prompt_group_cost(b: int, count: float, f: np.ndarray) -> np.ndarray:
    return b * f


def decode_group_cost(block_size: int, row_weight: int) -> GroupCost:
    def cost(b: int, count: float, f: np.ndarray) -> np.ndarray:
        return row_weight * b * count + block_size * f
    return cost


# ---------------------------------------------------------------- plans

@dataclass
class BucketPlan:
    """What a server needs from a plan: its buckets, and how much traffic each took."""
    block_size: int
    prompt_buckets: list[Bucket]
    decode_buckets: list[Bucket]
    prompt_weights: list[int] = field(default_factory=list)
    decode_weights: list[int] = field(default_factory=list)
    """Trace passes per bucket (parallel lists): the warmup's order of importance."""
    decode_row_weight: int = DECODE_ROW_WEIGHT
    prompt_pass_overhead: Optional[int] = None
    """The per-pass cost the plan's prompt split assumed (None: the default)."""
    predicted_waste: dict = field(default_factory=dict)
    predicted_rounding_waste: dict = field(default_factory=dict)
    optimality_bound: float = 1.0
    use_prompt_context: Optional[bool] = None
    """Planned for prompts with context blocks (prefix caching, chunked prefill): its
    prompt buckets have them, and a server giving prompts context warms exactly
    these buckets. None: a plan file from before context was planned."""

    def to_json(self) -> dict:
        d = asdict(self)
        d["prompt_buckets"] = [list(b) for b in self.prompt_buckets]
        d["decode_buckets"] = [list(b) for b in self.decode_buckets]
        return {"format": PLAN_FORMAT, "version": 1, **d}

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=1)

    def traffic(self, is_prompt: bool) -> dict[Bucket, int]:
        buckets = self.prompt_buckets if is_prompt else self.decode_buckets
        weights = self.prompt_weights if is_prompt else self.decode_weights
        return dict(zip(buckets, weights)) if weights else {}


def load_plan(path: str) -> BucketPlan:
    """Read and validate a plan file (ValueError naming the problem)."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"VLLM_BUCKET_PLAN={path!r}: cannot read the plan ({e}).") from None
    if not isinstance(d, dict) or d.get("format") != PLAN_FORMAT:
        raise ValueError(f"VLLM_BUCKET_PLAN={path!r} is not a bucket plan (format "
                         f"{PLAN_FORMAT!r}); write one with python -m vllm.hpu.bucket_planner.")
    try:
        plan = BucketPlan(
            block_size=int(d["block_size"]),
            prompt_buckets=[Bucket(*map(int, b)) for b in d["prompt_buckets"]],
            decode_buckets=[Bucket(*map(int, b)) for b in d["decode_buckets"]],
            prompt_weights=[int(w) for w in d.get("prompt_weights", [])],
            decode_weights=[int(w) for w in d.get("decode_weights", [])],
            decode_row_weight=int(d.get("decode_row_weight", DECODE_ROW_WEIGHT)),
            prompt_pass_overhead=(None if d.get("prompt_pass_overhead") is None
                                  else int(d["prompt_pass_overhead"])),
            predicted_waste=dict(d.get("predicted_waste", {})),
            predicted_rounding_waste=dict(d.get("predicted_rounding_waste", {})),
            optimality_bound=float(d.get("optimality_bound", 1.0)),
            use_prompt_context=(None if d.get("use_prompt_context") is None
                                else bool(d["use_prompt_context"])))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"VLLM_BUCKET_PLAN={path!r}: malformed plan ({e}).") from None
    if not plan.prompt_buckets or not plan.decode_buckets:
        raise ValueError(f"VLLM_BUCKET_PLAN={path!r}: the plan needs prompt and decode buckets.")
    return plan


def split_prompts(p: TracePass, covering: Covering, block_size: int, overhead: int,
                  grouping: Grouping = group_prompts) -> list[TracePass]:
    """The prompt passes the runner runs for a trace line: a prompt set split by
    `grouping` against `covering`, a version-1 pass as it is."""
    if not p.is_prompt_set:
        return [p]
    shapes = [PromptShape(q, c) for q, c in zip(p.query_lens, p.ctx_blocks)]
    return [TracePass("prompt", len(g), max(s.query_len for s in g),
                      max(s.num_context_blocks for s in g),
                      sum(s.query_len + s.num_context_blocks * block_size for s in g))
            for g in grouping(shapes, covering, block_size, overhead)]


def budget_covering(limits: EngineLimits) -> Covering:
    """Every shape the token budget allows as a bucket (the exponential buckets' own
    filter: several sequences fit max_num_batched_tokens), for the planner's first
    split, before there are buckets."""
    def covering(batch_size: int, query_len: int, ctx_blocks: int) -> Optional[Bucket]:
        if batch_size > 1 and batch_size * query_len > limits.max_num_batched_tokens:
            return None
        return Bucket(batch_size, query_len, ctx_blocks)
    return covering


def trace_points(passes: list[TracePass], covering: Optional[Covering] = None,
                 overhead: int = 0, block_size: int = 0) -> tuple[Counter, Counter]:
    """(b, query, context blocks) passes of prompts and (b, blocks) passes of decodes;
    prompt sets are split against `covering` first (None: counted as one pass each).
    A prompt's context is its cached prefix (or earlier chunks): the tokens the pass
    reads but does not compute, and the server's third bucket dimension."""
    prompt: Counter = Counter()
    for p in passes:
        if p.phase != "prompt":
            continue
        runs = [p] if covering is None else split_prompts(p, covering, block_size, overhead)
        prompt.update((r.batch_size, r.query_len, r.num_blocks) for r in runs)
    decode = Counter((p.batch_size, p.num_blocks) for p in passes if p.phase == "decode")
    return prompt, decode


@dataclass
class Evaluation:
    padded: dict[str, int]
    real: dict[str, int]
    unrounded: dict[str, int]
    """The passes' own shapes (a prompt batch padded to its longest prompt)."""
    hits: dict[str, Counter]
    fallbacks: int
    passes: dict[str, int] = field(default_factory=lambda: {"prompt": 0, "decode": 0})
    overhead: int = 0
    """The per-prompt-pass cost the split used."""

    @property
    def prompt_objective(self) -> int:
        """What the split and the plan minimise: padded compute plus pass overheads."""
        return self.padded["prompt"] + self.overhead * self.passes["prompt"]

    @property
    def waste(self) -> dict[str, float]:
        """1 - real / padded: everything padding costs."""
        return {p: waste(self.real[p], self.padded[p]) for p in self.padded}

    @property
    def rounding_waste(self) -> dict[str, float]:
        """1 - shape / bucket: the part the buckets decide (not the batch's own
        padding to its longest prompt, which no bucket can remove)."""
        return {p: waste(self.unrounded[p], self.padded[p]) for p in self.padded}


def evaluate(ctx: HPUBucketingContext, passes: list[TracePass],
             row_weight: int = DECODE_ROW_WEIGHT, grouping: Grouping = group_prompts,
             overhead: Optional[int] = None) -> Evaluation:
    """Replay the trace through the server's own prompt split and bucket lookup
    (fallbacks included), in the server's order: a fallback bucket added for one
    pass is there for the next split. `overhead` None: what the server resolves."""
    bsz = ctx.block_size
    overhead = resolve_pass_overhead(ctx.plan) if overhead is None else overhead
    ev = Evaluation({"prompt": 0, "decode": 0}, {"prompt": 0, "decode": 0},
                    {"prompt": 0, "decode": 0}, {"prompt": Counter(), "decode": Counter()}, 0,
                    overhead=overhead)
    before = len(ctx.fallback_buckets)
    for line in passes:
        if line.phase == "prompt":
            for p in split_prompts(line, ctx.covering_prompt_bucket, bsz, overhead, grouping):
                b = ctx.find_prompt_bucket(p.batch_size, p.query_len, p.num_blocks)
                ev.padded["prompt"] += prompt_cost(*b, bsz)
                shape = prompt_cost(p.batch_size, p.query_len, p.num_blocks, bsz)
                ev.unrounded["prompt"] += shape
                ev.real["prompt"] += p.real_tokens or shape
                ev.hits["prompt"][b] += 1
                ev.passes["prompt"] += 1
        else:
            b = ctx.find_decode_bucket(line.batch_size, line.num_blocks)
            ev.padded["decode"] += decode_cost(b.batch_size, b.num_blocks, bsz, row_weight)
            real = decode_cost(line.batch_size, line.num_blocks, bsz, row_weight)
            ev.real["decode"] += real
            ev.unrounded["decode"] += real
            ev.hits["decode"][b] += 1
            ev.passes["decode"] += 1
    ev.fallbacks = len(ctx.fallback_buckets) - before
    return ev


def _num_kv_blocks(limits: EngineLimits) -> int:
    """The traced server's KV blocks, else what the limits' sequences can use."""
    return limits.num_kv_blocks or limits.max_num_seqs * -(-limits.max_model_len //
                                                           limits.block_size)


def server_context(limits: EngineLimits) -> Optional[HPUBucketingContext]:
    """Exactly the buckets the traced server ran with (the trace's header), or None
    for a trace without them (simulated, or recorded before they were)."""
    if not (limits.prompt_buckets and limits.decode_buckets):
        return None
    grid = BucketPlan(limits.block_size, list(limits.prompt_buckets),
                      list(limits.decode_buckets),
                      prompt_pass_overhead=limits.prompt_pass_overhead,
                      use_prompt_context=limits.use_prompt_context)
    return _context(limits, "plan", grid)


def default_context(limits: EngineLimits, strategy: str = "exp") -> HPUBucketingContext:
    """The baseline a plan is compared with: the traced server's own buckets when the
    trace records them (prompt context and KV size included: a replay then pads
    exactly as the server did); else `strategy`'s buckets for these limits, with
    context buckets where the limits say prompts have context."""
    return server_context(limits) or _context(limits, strategy)


def _context(limits: EngineLimits, strategy: str,
             plan: Optional[BucketPlan] = None) -> HPUBucketingContext:
    num_kv_blocks = _num_kv_blocks(limits)
    if plan is not None and limits.num_kv_blocks is None:
        num_kv_blocks = max(num_kv_blocks, max(b.num_blocks for b in plan.decode_buckets))
    return HPUBucketingContext(limits.max_num_seqs, limits.max_num_prefill_seqs,
                               limits.block_size, limits.max_num_batched_tokens,
                               limits.max_model_len, num_kv_blocks=num_kv_blocks,
                               use_prompt_context=limits.use_prompt_context,
                               strategy=strategy, plan=plan)


def make_plan(passes: list[TracePass], limits: EngineLimits, max_prompt_buckets: int,
              max_decode_buckets: int, row_weight: int = DECODE_ROW_WEIGHT,
              cover_limits: bool = True, max_candidates: int = MAX_CANDIDATES,
              overhead: Optional[int] = None, rounds: int = MAX_PLAN_ROUNDS) -> BucketPlan:
    """The plan for the trace (see the module doc), with its traffic weights.

    `cover_limits` adds passes of weight 0 that the plan must cover, so that traffic
    unlike the trace still finds a warmed bucket (never a compile while serving): a
    lone prompt of the longest chunk (with the most context blocks too, where prompts
    have context), a full prompt batch within the token budget (a prompt batch no
    bucket covers is split by the runner), and the largest decode batch the limits
    and the KV cache allow (a decode batch cannot be split). `overhead`: the cost of
    a prompt pass (None: VLLM_PROMPT_PASS_OVERHEAD_TOKENS, the traced server's, or the
    default).

    Where the traced server gave prompts context (prefix caching on, the default),
    the prompt buckets are planned with their context dimension (`plan_prompt_phase`)
    within the same budget, and the plan says so: a server warms exactly its buckets.
    """
    if overhead is None:  # the traced server's grid carries the overhead it split with
        baseline = server_context(limits)
        overhead = resolve_pass_overhead(baseline.plan if baseline is not None else None)
    bsz = limits.block_size
    _, decode_pts = trace_points(passes)
    if cover_limits:
        decode_pts.setdefault((limits.max_num_seqs, min(_num_kv_blocks(limits),
                                                        limits.max_num_seqs * -(
            -limits.max_model_len // limits.block_size))), 0)
    if not decode_pts:
        raise ValueError("the trace needs plain prompt passes and decode passes to plan both.")
    d = plan_phase(dict(decode_pts), max_decode_buckets, decode_group_cost(bsz, row_weight),
                   max_candidates)
    decode_buckets = [Bucket(b, 1, n) for b, n in d.buckets]
    best: Optional[tuple[BucketPlan, Evaluation]] = None
    covering = budget_covering(limits)
    for _ in range(max(1, rounds)):
        prompt_pts, _ = trace_points(passes, covering, overhead, bsz)
        if cover_limits:
            _add_limit_points(prompt_pts, limits)
        if not prompt_pts:
            raise ValueError("the trace needs plain prompt passes and decode passes to plan "
                             "both.")
        prompt_buckets, _, bound = plan_prompt_phase(dict(prompt_pts), max_prompt_buckets,
                                                     bsz, max_candidates)
        plan = BucketPlan(bsz, prompt_buckets, decode_buckets,
                          decode_row_weight=row_weight, prompt_pass_overhead=overhead,
                          optimality_bound=max(bound, d.ratio_bound),
                          use_prompt_context=limits.use_prompt_context)
        ev = evaluate(plan_context(plan, limits), passes, row_weight, overhead=overhead)
        if best is not None and ev.prompt_objective >= best[1].prompt_objective:
            break
        best = plan, ev
        covering = plan_context(plan, limits).covering_prompt_bucket
    assert best is not None
    plan, ev = best
    plan.prompt_weights = [ev.hits["prompt"][b] for b in plan.prompt_buckets]
    plan.decode_weights = [ev.hits["decode"][b] for b in plan.decode_buckets]
    plan.predicted_waste = ev.waste
    plan.predicted_rounding_waste = ev.rounding_waste
    return plan


def _add_limit_points(prompt_pts: Counter, limits: EngineLimits) -> None:
    longest = min(limits.max_num_batched_tokens, limits.max_model_len)
    prompt_pts.setdefault((1, longest, 0), 0)
    if limits.max_ctx_blocks:
        prompt_pts.setdefault((1, longest, limits.max_ctx_blocks), 0)
    full = limits.prefill_seqs
    prompt_pts.setdefault((full, max(1, min(longest, limits.max_num_batched_tokens // full)),
                           0), 0)


def plan_context(plan: BucketPlan, limits: EngineLimits) -> HPUBucketingContext:
    """The buckets a server with these limits runs for `plan`."""
    return _context(limits, "plan", plan)


def warmup_seconds_to_buckets(budget_s: float, seconds_per_bucket: float) -> int:
    return max(1, int(budget_s // seconds_per_bucket))


# ---------------------------------------------------------------- CLI

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m vllm.hpu.bucket_planner",
                                description="Plan HPU buckets from a traffic trace.")
    p.add_argument("--trace", required=True, help="recorded JSONL trace or ShareGPT-like JSON")
    p.add_argument("--max-buckets", type=int, default=None,
                   help="most buckets per phase (default: as many as today's exponential "
                        "buckets, for a like-for-like comparison)")
    p.add_argument("--warmup-budget-s", type=float, default=None,
                   help="warmup seconds to spend: caps the buckets per phase at budget / "
                        "(2 * --seconds-per-bucket)")
    p.add_argument("--seconds-per-bucket", type=float, default=0.3,
                   help="warmup seconds of one bucket (a never-warmed shape costs 200-400 ms)")
    p.add_argument("--output", default=None, help="write the plan here (JSON)")
    p.add_argument("--decode-row-weight", type=int, default=DECODE_ROW_WEIGHT)
    p.add_argument("--no-cover-limits", dest="cover_limits", action="store_false",
                   help="plan only the trace's shapes (by default the plan also covers the "
                        "largest batches the engine limits allow, so that no traffic compiles)")
    p.add_argument("--max-candidates", type=int, default=MAX_CANDIDATES,
                   help="bucket values considered per dimension (more: closer to the optimum, "
                        "slower)")
    for name in ("block-size", "max-num-seqs", "max-num-batched-tokens", "max-model-len"):
        p.add_argument(f"--{name}", type=int, default=None,
                       help="engine limit (read from a recorded trace's header)")
    return p


def _limits(args: argparse.Namespace) -> Optional[EngineLimits]:
    given = [args.block_size, args.max_num_seqs, args.max_num_batched_tokens,
             args.max_model_len]
    if all(v is None for v in given):
        return None
    if any(v is None for v in given):
        raise ValueError("give all of --block-size, --max-num-seqs, --max-num-batched-tokens "
                         "and --max-model-len, or none (a recorded trace has them).")
    return EngineLimits(*given)


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    logging.getLogger("vllm").setLevel(logging.WARNING)
    limits, passes = read_trace(args.trace, _limits(args))
    if limits is None:
        raise ValueError("the trace has no header: give the engine limits.")
    base = default_context(limits)
    n_prompt, n_decode = base_prompt, base_decode = (base.num_prompt_buckets,
                                                     base.num_decode_buckets)
    base_ev = evaluate(base, passes, args.decode_row_weight)
    if args.max_buckets is not None:
        n_prompt = n_decode = args.max_buckets
    if args.warmup_budget_s is not None:
        cap = warmup_seconds_to_buckets(args.warmup_budget_s / 2, args.seconds_per_bucket)
        n_prompt, n_decode = min(n_prompt, cap), min(n_decode, cap)
    plan = make_plan(passes, limits, n_prompt, n_decode, args.decode_row_weight,
                     args.cover_limits, args.max_candidates)
    print(f"trace: {sum(p.phase == 'prompt' for p in passes)} prompt lines (a step's "
          f"prompts, or a pass of a version-1 trace), "
          f"{sum(p.phase == 'decode' for p in passes)} decode passes")
    label = (f"traced server's buckets ({limits.strategy or 'exp'}"
             f"{', prompt context' if limits.use_prompt_context else ''})"
             if server_context(limits) is not None else "default exp buckets")
    print(f"{label}: {base_prompt} prompt, {base_decode} decode;"
          f" padding waste prompt {base_ev.waste['prompt']:.1%}, decode "
          f"{base_ev.waste['decode']:.1%} (bucket rounding alone: prompt "
          f"{base_ev.rounding_waste['prompt']:.1%}; {base_ev.passes['prompt']} prompt passes;"
          f" {base_ev.fallbacks} fallback buckets)")
    served = plan_context(plan, limits)  # what a server with these limits warms
    n_served = (served.num_prompt_buckets, served.num_decode_buckets)
    plan_ev = evaluate(served, passes, args.decode_row_weight)
    print(f"plan: {n_served[0]} prompt, {n_served[1]} decode (a server warms exactly these"
          f"{', context buckets included' if limits.use_prompt_context else ''}); "
          f"padding waste prompt {plan.predicted_waste['prompt']:.1%}, decode "
          f"{plan.predicted_waste['decode']:.1%} (bucket rounding alone: prompt "
          f"{plan.predicted_rounding_waste['prompt']:.1%}; {plan_ev.passes['prompt']} prompt "
          f"passes; buckets within x{plan.optimality_bound:.3f} of the optimum for their "
          f"passes)")
    print(f"prompt passes split at a cost of {plan.prompt_pass_overhead} token slots per pass "
          "(VLLM_PROMPT_PASS_OVERHEAD_TOKENS)")
    if args.output:
        plan.save(args.output)
        print(f"wrote {args.output}; serve with VLLM_BUCKET_PLAN={args.output}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
