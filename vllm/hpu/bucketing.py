"""Shape buckets for the HPU runner: every batch is padded to one of a fixed set.

Gaudi compiles one graph per input shape, so the runner only ever runs a small set
of shapes ("buckets"), all compiled during warmup. A bucket is
`(batch_size, query_len, num_blocks)`:
- prompt: `num_blocks` = context blocks per sequence (prefix-cache hit or earlier
  chunk of a chunked prefill), 0 for a plain prefill;
- decode: `query_len` = 1 and `num_blocks` = KV blocks of the whole batch (the
  highest block id + 1 with contiguous paged attention).

`VLLM_BUCKETING_STRATEGY` picks how: `exp` (the default), `lin` or `pad` give
each dimension its values from a range `(min, step, max)`: exponential points,
linear (ramp-up by doubling below `step`, then multiples of `step`) or padding-
capped (each value at most `*_PAD_PERCENT` percent and `*_PAD_MAX` above the one
before). Prompt buckets are the grid of bs x query x ctx values that some real batch
can need (see `_prompt_fits`); decode buckets the grid of bs x blocks with at least
one block per sequence. `plan` takes the buckets of a plan file
(`VLLM_BUCKET_PLAN`, from `python -m vllm.hpu.bucket_planner`) instead of the 12
range knobs, exactly (see `_plan_prompt_buckets` for a plan without context buckets).
`VLLM_EXPONENTIAL_BUCKETING` is the strategy's deprecated alias.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, NamedTuple, Optional

from vllm import envs
from vllm.hpu.log import log_bucket_config, log_generated_buckets

if TYPE_CHECKING:
    from vllm.hpu.bucket_planner import BucketPlan

logger = logging.getLogger(__name__)

STRATEGIES = ("exp", "lin", "pad", "plan")


def resolve_strategy(exponential: Optional[bool] = None) -> str:
    """VLLM_BUCKETING_STRATEGY, else the deprecated VLLM_EXPONENTIAL_BUCKETING, else
    `plan` when VLLM_BUCKET_PLAN is set, else `exp`. `exponential` (an explicit
    caller's choice) wins over all of them."""
    if exponential is not None:
        return "exp" if exponential else "lin"
    strategy = envs.VLLM_BUCKETING_STRATEGY.strip().lower()
    if strategy:
        if strategy not in STRATEGIES:
            raise ValueError(f"VLLM_BUCKETING_STRATEGY must be one of {STRATEGIES}, got "
                             f"{strategy!r}.")
        return strategy
    if envs.is_set("VLLM_EXPONENTIAL_BUCKETING"):
        logger.warning("VLLM_EXPONENTIAL_BUCKETING is deprecated: use "
                       "VLLM_BUCKETING_STRATEGY=exp|lin.")
        return "exp" if envs.VLLM_EXPONENTIAL_BUCKETING else "lin"
    return "plan" if envs.VLLM_BUCKET_PLAN else "exp"


class Bucket(NamedTuple):
    batch_size: int
    query_len: int
    num_blocks: int


def linear_range(bmin: int, bstep: int, bmax: int) -> list[int]:
    """Ramp up `min, 2*min, 4*min, ...` below `step`, then `step, 2*step, ... <= max`.

    (2, 32, 64) -> 2 4 8 16 32 64; (128, 128, 512) -> 128 256 384 512.
    A min of 0 adds the value 0 and continues from `step` (0 cannot be doubled).
    min is the lowest bucket: with step < min the multiples of step below min are
    dropped and min itself kept, (4, 2, 8) -> 4 6 8; (3, 2, 9) -> 3 4 6 8.
    """
    _check_range(bmin, bstep, bmax)
    values = [bmin]
    v = bstep if bmin == 0 else bmin
    while v < bstep and v <= bmax:
        values.append(v)
        v *= 2
    values.extend(range(bstep, bmax + 1, bstep))
    return sorted({v for v in values if v >= bmin})


def exponential_range(bmin: int, bstep: int, bmax: int, num: int) -> list[int]:
    """`num` points spaced geometrically up to max, rounded up to `step`; min is the
    lowest value.

    v_i = ceil(base * (max/base)^(i/(num-1)) / step) * step for i in 0..num-1,
    de-duplicated, each clamped to max, with base = max(min, step). A min below the
    step would round every low point up to the same step (min 2, step 128 gave
    128 128 ... : the min was lost and the points spent), so the points are built
    from the step and min is added back as the lowest value; a min above the step
    is the first point, kept as given (not rounded up). The docs' promise, as for
    the linear ranges: the min is the lowest bucket.
    Decode bs (1, 2, 256, 9) -> 1 2 4 8 14 24 42 78 140 256;
    query (128, 128, 8192, 13) -> 128 256 384 512 768 1024 1536 2048 2944 4096 5888 8192;
    query (64, 128, 1024, 5) -> 64 128 256 384 640 1024.
    """
    _check_range(bmin, bstep, bmax)
    if num < 1:
        raise ValueError(f"number of exponential buckets must be >= 1, got {num}.")
    base = min(max(bmin, bstep), bmax)
    values = {bmin} if bmin < base else set()
    if num == 1:
        return sorted(values | {bmax})
    ratio = bmax / base
    for i in range(num):
        point = base * ratio ** (i / (num - 1))
        # The epsilon keeps float noise (64**(1/3) = 3.9999..) from bumping a step.
        rounded = base if i == 0 else math.ceil(point / bstep - 1e-9) * bstep
        values.add(min(bmax, rounded))
    return sorted(values)


def pad_range(bmin: int, bstep: int, bmax: int, pad_max: int, pad_percent: int) -> list[int]:
    """Values from min to max, each at most `pad_percent`% of itself and `pad_max`
    above the one before (never less than `step`, rounded down to it): the most a
    batch is padded is bounded relative to its size.

    (128, 128, 2048, 512, 25) -> 128 256 384 512 640 768 896 1024 1280 1536 1920 2048.
    """
    _check_range(bmin, bstep, bmax)
    if not 0 < pad_percent <= 100 or pad_max < 1:
        raise ValueError(f"pad bucketing needs 0 < PAD_PERCENT <= 100 and PAD_MAX >= 1, got "
                         f"{pad_percent} and {pad_max}.")
    values = [0] if bmin == 0 else []
    v = bstep if bmin == 0 else bmin
    while v < bmax:
        values.append(v)
        pad = min(pad_max, v * pad_percent // 100)
        v += max(bstep, pad // bstep * bstep)
    values.append(bmax)
    return values


def fill_low_end(values: list[int]) -> list[int]:
    """The powers of two strictly between the first two values, added.

    An exponential decode-block range steps in `block_size` blocks, which suits large
    caches but leaves nothing between its min and the first step: at max_model_len 512,
    block 128, 8 sequences the values were {1, 32}, so every batch needing 2 to 31
    blocks read 32. The powers of two fill that gap (1, 2, 4, 8, 16, 32): a batch
    never reads more than twice the blocks it holds there, for a few more buckets.
    """
    if len(values) < 2:
        return values
    low, high = values[0], values[1]
    fill = []
    p = 1
    while p < high:
        if p > low:
            fill.append(p)
        p *= 2
    return sorted(set(values) | set(fill))


def _check_range(bmin: int, bstep: int, bmax: int) -> None:
    if bmin < 0 or bstep < 1 or bmax < max(bmin, 1):
        raise ValueError(f"invalid bucket range (min={bmin}, step={bstep}, max={bmax}): "
                         "need min >= 0, step >= 1 and max >= max(min, 1).")


def _log2_ceil(x: int) -> int:
    return math.ceil(math.log2(x)) if x > 1 else 0


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


@dataclass(frozen=True)
class BucketRange:
    """One dimension's range; `num` set means exponential with that many points,
    `pad_percent` set the pad strategy's range."""
    env_prefix: str  # e.g. VLLM_PROMPT_BS_BUCKET
    min: int
    step: int
    max: int
    num: Optional[int] = None
    pad_percent: Optional[int] = None
    pad_max: Optional[int] = None

    def values(self) -> list[int]:
        if self.pad_percent is not None:
            return pad_range(self.min, self.step, self.max, self.pad_max or 1,
                             self.pad_percent)
        if self.num is None:
            return linear_range(self.min, self.step, self.max)
        return exponential_range(self.min, self.step, self.max, self.num)

    def as_list(self) -> list[int]:
        return [self.min, self.step, self.max]


def read_bucket_range(phase: str, dim: str, bmin: int, bstep: int, bmax: int,
                      num_for_max: Optional[Callable[[int], int]], lowest_min: int
                      ) -> BucketRange:
    """Defaults overridden by VLLM_{phase}_{dim}_BUCKET_{MIN|STEP|MAX}, then validated.

    `num_for_max` gives the number of exponential points for the final max (None:
    linear). `lowest_min` is the smallest legal min (1 for sizes, 0 for context).
    """
    prefix = f"VLLM_{phase}_{dim}_BUCKET"
    parts = {"MIN": bmin, "STEP": bstep, "MAX": bmax}
    for part in parts:
        value = getattr(envs, f"{prefix}_{part}")
        if value is not None:
            parts[part] = value
    if parts["MIN"] < lowest_min:
        raise ValueError(f"{prefix}_MIN must be >= {lowest_min}, got {parts['MIN']}.")
    if parts["STEP"] < 1:
        raise ValueError(f"{prefix}_STEP must be >= 1, got {parts['STEP']}.")
    if parts["MAX"] < max(parts["MIN"], 1):
        raise ValueError(f"{prefix}_MAX must be >= max({prefix}_MIN, 1) = "
                         f"{max(parts['MIN'], 1)}, got {parts['MAX']}.")
    num = num_for_max(parts["MAX"]) if num_for_max is not None else None
    return BucketRange(prefix, parts["MIN"], parts["STEP"], parts["MAX"], num)


def read_pad_range(phase: str, dim: str, bmin: int, bstep: int, bmax: int,
                   lowest_min: int) -> BucketRange:
    """The pad strategy's range: the linear knobs plus *_PAD_PERCENT (default 25) and
    *_PAD_MAX (default a quarter of the max), vllm-gaudi's padding-aware defaults."""
    r = read_bucket_range(phase, dim, bmin, bstep, bmax, None, lowest_min)
    percent = getattr(envs, f"{r.env_prefix}_PAD_PERCENT")
    pad_max = getattr(envs, f"{r.env_prefix}_PAD_MAX")
    percent = 25 if percent is None else percent
    pad_max = max(1, -(-r.max // 4)) if pad_max is None else pad_max
    if not 0 < percent <= 100:
        raise ValueError(f"{r.env_prefix}_PAD_PERCENT must be in (0, 100], got {percent}.")
    if pad_max < 1:
        raise ValueError(f"{r.env_prefix}_PAD_MAX must be >= 1, got {pad_max}.")
    return BucketRange(r.env_prefix, r.min, r.step, r.max, None, percent, pad_max)


def _with_previous(values: list[int]) -> list[tuple[int, int]]:
    """(previous value or 0, value) for each value of an ascending range."""
    return list(zip([0] + values[:-1], values))


def _covering(buckets: list[Bucket], want: Bucket) -> list[Bucket]:
    return [b for b in buckets if b.batch_size >= want.batch_size
            and b.query_len >= want.query_len and b.num_blocks >= want.num_blocks]


class HPUBucketingContext:
    """Generates prompt/decode buckets and finds the bucket a batch is padded to.

    Args:
        max_num_seqs: most sequences in a decode batch.
        max_num_prefill_seqs: most sequences in a prompt batch (None: min(max_num_seqs, 64)).
        block_size: tokens per KV block.
        max_num_batched_tokens: token budget of one step (prompt bucket filter).
        max_model_len: longest sequence (prompt query and context ranges).
        num_kv_blocks: KV blocks available; decode buckets are generated once known.
        use_prompt_context: False when neither prefix caching nor chunked prefill can
            give a prompt a context, so prompt buckets all have 0 context blocks.
        exponential: exponential ranges (True) or linear (False); None: `strategy`.
        contiguous_pa: decode `num_blocks` is the highest physical block id + 1, which
            can be anything up to the cache size, so decode block buckets reach it.
        strategy: exp | lin | pad | plan (None: `resolve_strategy`).
        plan: the plan of the `plan` strategy (None: read VLLM_BUCKET_PLAN).
    """

    def __init__(self, max_num_seqs: int, max_num_prefill_seqs: Optional[int],
                 block_size: int, max_num_batched_tokens: int, max_model_len: int,
                 num_kv_blocks: Optional[int] = None, use_prompt_context: bool = True,
                 exponential: Optional[bool] = None, contiguous_pa: bool = False,
                 strategy: Optional[str] = None, plan: Optional["BucketPlan"] = None) -> None:
        for name, value in (("max_num_seqs", max_num_seqs), ("block_size", block_size),
                            ("max_num_batched_tokens", max_num_batched_tokens),
                            ("max_model_len", max_model_len)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}.")
        if max_num_prefill_seqs is None:
            max_num_prefill_seqs = min(max_num_seqs, 64)
        if not 1 <= max_num_prefill_seqs <= max_num_seqs:
            raise ValueError(f"max_num_prefill_seqs must be in [1, max_num_seqs="
                             f"{max_num_seqs}], got {max_num_prefill_seqs}.")
        self.max_num_seqs = max_num_seqs
        self.max_num_prefill_seqs = max_num_prefill_seqs
        self.block_size = block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.use_prompt_context = use_prompt_context
        self.contiguous_pa = contiguous_pa
        self.strategy = strategy or resolve_strategy(exponential)
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}.")
        self.plan = self._load_plan(plan) if self.strategy == "plan" else None
        self.exponential = self.strategy in ("exp", "plan")
        self.num_kv_blocks: Optional[int] = None
        self.prompt_buckets: list[Bucket] = []
        self.decode_buckets: list[Bucket] = []
        self.fallback_buckets: list[Bucket] = []
        self._lookup_cache: dict[tuple[bool, Bucket], Bucket] = {}
        self._cover_cache: dict[Bucket, Optional[Bucket]] = {}
        self._warn_unused_decode_seq()
        self.prompt_bs_range, self.prompt_seq_range, self.prompt_ctx_range = \
            self._prompt_ranges()
        self.generate_prompt_buckets()
        self.decode_bs_range, self.decode_block_range = self._decode_ranges(
            num_kv_blocks or self._max_decode_blocks())
        self._log_decode_config()
        if num_kv_blocks is not None:
            self.generate_decode_buckets(num_kv_blocks)

    def _load_plan(self, plan: Optional["BucketPlan"]) -> "BucketPlan":
        from vllm.hpu.bucket_planner import load_plan
        if plan is None:
            if not envs.VLLM_BUCKET_PLAN:
                raise ValueError("VLLM_BUCKETING_STRATEGY=plan needs VLLM_BUCKET_PLAN=path "
                                 "(write one with python -m vllm.hpu.bucket_planner).")
            plan = load_plan(envs.VLLM_BUCKET_PLAN)
        if plan.block_size != self.block_size:
            raise ValueError(f"the bucket plan was made for block_size {plan.block_size}, "
                             f"the engine runs {self.block_size}.")
        return plan

    # ---- ranges ----

    @staticmethod
    def _warn_unused_decode_seq() -> None:
        if any(getattr(envs, f"VLLM_DECODE_SEQ_BUCKET_{p}") is not None
               for p in ("MIN", "STEP", "MAX")):
            logger.warning("VLLM_DECODE_SEQ_BUCKET_* is ignored: decode buckets always "
                           "have query length 1 (use VLLM_DECODE_BLOCK_BUCKET_*).")

    def _max_ctx_blocks(self) -> int:
        """Most context blocks a prompt can have: at least one new token follows them."""
        return -(-(self.max_model_len - 1) // self.block_size)

    def _prompt_ranges(self) -> tuple[BucketRange, BucketRange, BucketRange]:
        bsz, mps = self.block_size, self.max_num_prefill_seqs
        max_ctx = self._max_ctx_blocks() if self.use_prompt_context else 0
        if self.strategy == "pad":
            query_max = max(min(self.max_num_batched_tokens, self.max_model_len), bsz)
            return (read_pad_range("PROMPT", "BS", 1, 1, mps, 1),
                    read_pad_range("PROMPT", "SEQ", bsz, bsz, query_max, 1),
                    read_pad_range("PROMPT", "BLOCK", 0, 1, max(max_ctx, 1), 0))
        if self.exponential:
            query_max = min(self.max_num_batched_tokens, self.max_model_len)
            bs = read_bucket_range("PROMPT", "BS", 1, 2, mps,
                                   lambda m: _log2_ceil(m) + 1, 1)
            # ceil(log2(max)) + 1 points, vllm-gaudi's limit for queries.
            seq = read_bucket_range("PROMPT", "SEQ", bsz, bsz, max(query_max, bsz),
                                    lambda m: _log2_ceil(m) + 1, 1)
            ctx = read_bucket_range("PROMPT", "BLOCK", 0, 1, max(max_ctx, 1),
                                    lambda m: _log2_ceil(m) + 1, 0)
        else:
            ctx_step = max(1, 1024 // bsz)
            bs = read_bucket_range("PROMPT", "BS", 1, min(mps, 32), mps, None, 1)
            seq = read_bucket_range("PROMPT", "SEQ", bsz, bsz,
                                    _round_up(self.max_model_len, bsz), None, 1)
            ctx = read_bucket_range("PROMPT", "BLOCK", 0, ctx_step,
                                    _round_up(max(max_ctx, 1), ctx_step), None, 0)
        return bs, seq, ctx

    def _max_decode_blocks(self) -> int:
        """The decode block max before the KV cache's size clamps it."""
        return max(128, self.max_num_seqs * -(-self.max_model_len // self.block_size))

    def _decode_ranges(self, num_kv_blocks: int) -> tuple[BucketRange, BucketRange]:
        bsz, mns = self.block_size, self.max_num_seqs
        max_blocks = self._max_decode_blocks()
        if self.contiguous_pa:
            max_blocks = max(max_blocks, num_kv_blocks)
        if self.strategy == "pad":
            return (read_pad_range("DECODE", "BS", 1, 1, mns, 1),
                    read_pad_range("DECODE", "BLOCK", 1, 1,
                                   min(max_blocks, num_kv_blocks), 1))
        if self.exponential:
            bs = read_bucket_range("DECODE", "BS", 1, 2, mns, lambda m: _log2_ceil(m) + 1, 1)
            blocks = read_bucket_range("DECODE", "BLOCK", 1, bsz, min(max_blocks, num_kv_blocks),
                                       lambda m: _log2_ceil(m) + 1, 1)
        else:
            bs = read_bucket_range("DECODE", "BS", 1, min(mns, 32), mns, None, 1)
            blocks = read_bucket_range("DECODE", "BLOCK", bsz, bsz, max_blocks, None, 1)
        return bs, blocks

    # ---- generation ----

    def generate_prompt_buckets(self) -> list[Bucket]:
        """bs x query x ctx grid, keeping the buckets a real batch can need."""
        bs_r, seq_r, ctx_r = self.prompt_bs_range, self.prompt_seq_range, self.prompt_ctx_range
        seq_values = seq_r.values()
        ctx_values = ctx_r.values() if self.use_prompt_context else [0]
        query_cap = self._query_cap(seq_values)
        if self.plan is not None:
            buckets = self._plan_prompt_buckets(ctx_values, query_cap)
        else:
            buckets = [Bucket(b, q, c) for b in bs_r.values()
                       for q_prev, q in _with_previous(seq_values)
                       for c_prev, c in _with_previous(ctx_values)
                       if self._prompt_fits(Bucket(b, q, c), q_prev, c_prev, query_cap)]
        self.prompt_buckets = sorted(buckets)
        self._clear_lookups()
        blocks = ctx_r.as_list() if self.use_prompt_context else [0, 0, 0]
        log_bucket_config("Prompt", bs_r.as_list(), "seq", seq_r.as_list(),
                          f", blocks:{blocks}")
        log_generated_buckets("Prompt", self.prompt_buckets)
        return self.prompt_buckets

    def _plan_prompt_buckets(self, ctx_values: list[int], query_cap: int) -> list[Bucket]:
        """Exactly the plan's buckets: the server warms what the planner printed.

        A plan made for prompts with context (from a trace of a server with prefix
        caching, the default) has its context buckets already. A plan without them
        (planned for prompts without context, or a plan file from before the planner
        planned context) on a server whose prompts have context would send every
        prefix-cache hit to a compile, so each of its buckets is also added at the
        context values of the exponential range a batch in it can have, with a
        warning that says how many buckets that makes."""
        assert self.plan is not None
        buckets = set(self.plan.prompt_buckets)
        if not self.use_prompt_context or self.plan.use_prompt_context:
            if self.plan.use_prompt_context and not self.use_prompt_context:
                logger.warning("The bucket plan was made for prompts with context (prefix "
                               "caching or chunked prefill); this server gives prompts "
                               "none, so its context buckets are warmed for nothing.")
            return list(buckets)
        for b in self.plan.prompt_buckets:
            for c_prev, c in _with_previous([v for v in ctx_values if v > 0]):
                if self._prompt_fits(Bucket(b.batch_size, b.query_len, c), 0, c_prev,
                                     max(query_cap, b.query_len)):
                    buckets.add(Bucket(b.batch_size, b.query_len, c))
        logger.warning("The bucket plan has no context buckets but this server gives "
                       "prompts context (prefix caching or chunked prefill): its %d prompt "
                       "buckets become %d with context values added. Plan from a trace of "
                       "this server (VLLM_BUCKET_TRACE) to warm only the planned buckets.",
                       len(self.plan.prompt_buckets), len(buckets))
        return list(buckets)

    def _query_cap(self, seq_values: list[int]) -> int:
        """The query bucket of the longest possible prompt chunk."""
        longest = min(self.max_num_batched_tokens, self.max_model_len)
        return next((v for v in seq_values if v >= longest), seq_values[-1])

    def _prompt_fits(self, b: Bucket, q_prev: int, c_prev: int, query_cap: int) -> bool:
        """Keep a bucket when a batch within the engine's limits can need it.

        - query: `bs * query <= max_num_batched_tokens`; a lone sequence may use the
          query bucket its longest possible chunk rounds up to.
        - context, lone sequence: the smallest sequence landing in this bucket (one
          token past the previous query value, after one token past the previous
          context value) fits `max_model_len`. Budget and context are separate
          limits: with chunked prefill a late chunk has a query within the budget
          and a context up to the model length.
        - context, several sequences: all their tokens, context included, fit
          max(max_num_batched_tokens, max_model_len). This keeps the grid (and the
          warmup) small; the runner splits a prompt batch whose padded shape has no
          bucket into several batches that do.
        """
        bsz = self.block_size
        if b.query_len > query_cap:
            return False
        if b.batch_size > 1 and b.batch_size * b.query_len > self.max_num_batched_tokens:
            return False
        if b.num_blocks == 0:
            return True
        if (q_prev + 1) + (c_prev * bsz + 1) > self.max_model_len:
            return False
        limit = max(self.max_num_batched_tokens, self.max_model_len)
        return b.batch_size == 1 or b.batch_size * (b.query_len + b.num_blocks * bsz) <= limit

    def generate_decode_buckets(self, num_kv_blocks: int) -> list[Bucket]:
        """bs x blocks grid, blocks clamped to the KV cache, at least a block per sequence."""
        self.num_kv_blocks = num_kv_blocks
        self.decode_buckets = self.decode_grid(num_kv_blocks)
        configured = self.decode_block_range.max
        self.decode_bs_range, self.decode_block_range = self._decode_ranges(num_kv_blocks)
        self._clear_lookups()
        block_max = self.decode_block_range.max
        log_generated_buckets("Decode", self.decode_buckets,
                              f" (block max {block_max}: the KV cache's blocks)"
                              if block_max != configured else "")
        return self.decode_buckets

    def _log_decode_config(self) -> None:
        """The seed's decode config line, at the seed's moment (start-up, before the
        KV cache is sized; a cache smaller than the block max clamps it later, as the
        "Generated N decode buckets" line then says). `seq` is the KV tokens a
        decode bucket reads (blocks x block_size), the `block` range after it."""
        blocks = self.decode_block_range.as_list()
        log_bucket_config("Decode", self.decode_bs_range.as_list(), "seq",
                          [v * self.block_size for v in blocks], f", block:{blocks}")

    def decode_grid(self, num_kv_blocks: int) -> list[Bucket]:
        """The decode buckets a KV cache of `num_kv_blocks` blocks gets (no state
        changed: the graph memory estimate asks before the cache is sized)."""
        if num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {num_kv_blocks}.")
        bs_range, block_range = self._decode_ranges(num_kv_blocks)
        block_values = sorted({min(v, num_kv_blocks) for v in block_range.values()})
        if self.exponential:
            block_values = fill_low_end(block_values)
        buckets = [Bucket(b, 1, n) for b in bs_range.values() for n in block_values if b <= n]
        if self.plan is not None:
            buckets = sorted({Bucket(b.batch_size, 1, min(b.num_blocks, num_kv_blocks))
                              for b in self.plan.decode_buckets})
        return sorted(buckets)

    # ---- lookup ----

    def find_prompt_bucket(self, batch_size: int, query_len: int, ctx_blocks: int = 0) -> Bucket:
        """Smallest prompt bucket >= (batch_size, query_len, ctx_blocks) in every dim."""
        return self._find(True, Bucket(batch_size, query_len, ctx_blocks))

    def covering_prompt_bucket(self, batch_size: int, query_len: int,
                               ctx_blocks: int = 0) -> Optional[Bucket]:
        """Like `find_prompt_bucket`, but None (no fallback, no warning) when none fits.

        The runner asks this while grouping prompts, to grow a batch only as far as
        an existing bucket covers it.
        """
        want = Bucket(batch_size, query_len, ctx_blocks)
        if want not in self._cover_cache:  # the grouping asks O(n^2) of these per step
            candidates = _covering(self.prompt_buckets, want)
            self._cover_cache[want] = (min(candidates, key=lambda b: self._cost(True, b))
                                       if candidates else None)
        return self._cover_cache[want]

    def _clear_lookups(self) -> None:
        """Forget cached answers: the buckets changed."""
        self._lookup_cache.clear()
        self._cover_cache.clear()

    def find_decode_bucket(self, batch_size: int, num_blocks: int) -> Bucket:
        """Smallest decode bucket >= (batch_size, 1, num_blocks) in every dim."""
        if not self.decode_buckets:
            raise ValueError("decode buckets are not generated yet: call "
                             "generate_decode_buckets(num_kv_blocks) first.")
        return self._find(False, Bucket(batch_size, 1, num_blocks))

    def _cost(self, is_prompt: bool, b: Bucket) -> tuple[int, ...]:
        if is_prompt:
            return (b.batch_size * (b.query_len + b.num_blocks * self.block_size), *b)
        return (b.num_blocks, b.batch_size)

    def _find(self, is_prompt: bool, want: Bucket) -> Bucket:
        if min(want.batch_size, want.query_len) < 1 or want.num_blocks < 0:
            raise ValueError(f"batch shape {tuple(want)} must have batch_size >= 1, "
                             "query_len >= 1 and num_blocks >= 0.")
        key = (is_prompt, want)
        found = self._lookup_cache.get(key)
        if found is None:
            buckets = self.prompt_buckets if is_prompt else self.decode_buckets
            candidates = _covering(buckets, want)
            if candidates:
                found = min(candidates, key=lambda b: self._cost(is_prompt, b))
            else:
                found = self._add_fallback(is_prompt, want)
            self._lookup_cache[key] = found
        return found

    def _add_fallback(self, is_prompt: bool, want: Bucket) -> Bucket:
        """The batch's own shape as a new bucket, warned once and kept.

        No bucket covers the batch, so it compiles whatever it is padded to; as the
        seed's bucketing says, a shape outside the buckets is processed without
        padding (rounding it up to the ranges' next values padded (3, 1, 5) to
        (4, 1, 32), computing more for the same compile). A later batch it covers
        reuses it.
        """
        bucket = Bucket(*want)
        kind = "Prompt" if is_prompt else "Decode"
        if is_prompt:
            self.prompt_buckets = sorted(self.prompt_buckets + [bucket])
        else:
            self.decode_buckets = sorted(self.decode_buckets + [bucket])
        self.fallback_buckets.append(bucket)
        self._clear_lookups()  # the new bucket may beat earlier answers
        logger.warning("%s bucket %s for batch %s was not warmed up (no bucket covers it; "
                       "it runs without padding); this step compiles a new graph. Raise "
                       "the VLLM_%s_*_BUCKET_MAX settings to cover it.",
                       kind, tuple(bucket), tuple(want), kind.upper())
        return bucket

    def drop_cold_bucket(self, is_prompt: bool, bucket: Bucket, cold: set[Bucket]) -> bool:
        """Forget a bucket the warmup did not compile when a warm one (not in `cold`)
        covers it: a batch then pads further instead of compiling while serving.
        True if dropped."""
        buckets = self.prompt_buckets if is_prompt else self.decode_buckets
        if bucket not in buckets or not _covering([b for b in buckets if b not in cold],
                                                   bucket):
            return False
        buckets.remove(bucket)
        self._clear_lookups()
        return True

    @property
    def num_prompt_buckets(self) -> int:
        return len(self.prompt_buckets)

    @property
    def num_decode_buckets(self) -> int:
        return len(self.decode_buckets)
