"""How much device memory HPU graphs take, measured instead of guessed.

Gaudi's backends reserve a hand-set share of memory for graphs
(`VLLM_GRAPH_RESERVED_MEM`, 0.1 by default) before they know what the graphs
take; at long `max_model_len` the decode graphs outgrow it and the warmup runs out
of memory (vllm-gaudi issues #1736, #1347). Here, unless the user sets that
variable, the worker measures instead:

1. After the profile run and before the KV cache is sized, the runner captures a
   few probe graphs (`probe_buckets`) on a small temporary KV cache and records
   the device memory each one took.
2. `GraphMemoryModel.fit` turns them into a linear cost model per phase:

       prompt bytes = fixed + per_token * (bs * query_len) + per_ctx * (bs * ctx_blocks)
       decode bytes = fixed + per_row * bs + per_block * num_blocks

   (a graph's static buffers and workspace grow with the padded tokens it
   processes and the KV blocks it gathers; the fixed part is the graph itself).
   The probe graphs are then dropped.
3. `plan_graph_reserve` sums the model's estimate over every bucket the warmup
   will capture (plus `HEADROOM`) and reserves that, at most `MAX_GRAPH_SHARE`
   of the usable memory; the KV cache gets the rest.
4. At capture time each bucket's estimate (scaled by what the captures so far
   measured against their estimates) must fit the memory left, else the bucket
   is skipped with a log line and runs without a graph; a capture that still
   runs out of memory is caught (`is_device_oom`), logged and skipped (on a single
   rank; see `oom_is_recoverable` for tensor parallelism).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import numpy as np
import torch

from vllm.hpu.bucketing import Bucket

logger = logging.getLogger(__name__)

HEADROOM = 0.10
"""Extra share reserved above the model's estimate (probe noise, fragmentation)."""
MAX_GRAPH_SHARE = 0.5
"""At most this share of usable memory goes to graphs: beyond it the KV cache (and
so the batch the server can hold) pays more than the graphs save; the buckets that
do not fit run without a graph (the warmup logs which)."""


def prompt_features(bucket: Bucket) -> tuple[float, float, float]:
    """(1, padded query tokens, context blocks read) of a prompt bucket."""
    b, q, c = bucket
    return 1.0, float(b * q), float(b * c)


def decode_features(bucket: Bucket) -> tuple[float, float, float]:
    """(1, rows, KV blocks gathered) of a decode bucket."""
    return 1.0, float(bucket.batch_size), float(bucket.num_blocks)


def features(is_prompt: bool, bucket: Bucket) -> tuple[float, float, float]:
    return prompt_features(bucket) if is_prompt else decode_features(bucket)


@dataclass(frozen=True)
class GraphMemoryModel:
    """bytes(bucket) = coef . features(bucket), coefficients >= 0 (see module doc)."""
    is_prompt: bool
    coef: tuple[float, float, float]
    samples: tuple[tuple[Bucket, int], ...] = ()
    """The probes it was fitted on (bucket, measured bytes), for the log."""

    @classmethod
    def fit(cls, is_prompt: bool, samples: Sequence[tuple[Bucket, int]]) -> "GraphMemoryModel":
        """Least squares over the probes. A feature no probe varied gets no weight
        (its share sits in the fixed part, exact when every bucket has the probes'
        value, e.g. prompts without context); a negative coefficient (measurement
        noise) is clamped to 0."""
        if not samples:
            raise ValueError("GraphMemoryModel.fit needs at least one measured graph.")
        x = np.array([features(is_prompt, b) for b, _ in samples], dtype=np.float64)
        y = np.array([max(0, n) for _, n in samples], dtype=np.float64)
        varied = [0] + [j for j in (1, 2) if np.ptp(x[:, j]) > 0]
        coef = np.zeros(3)
        sol, *_ = np.linalg.lstsq(x[:, varied], y, rcond=None)
        coef[varied] = np.maximum(sol, 0.0)
        return cls(is_prompt, (float(coef[0]), float(coef[1]), float(coef[2])),
                   tuple((b, int(n)) for b, n in samples))

    def estimate(self, bucket: Bucket) -> float:
        return float(np.dot(self.coef, features(self.is_prompt, bucket)))

    def describe(self) -> str:
        names = (("tokens", "ctx blocks") if self.is_prompt else ("rows", "blocks"))
        return (f"{self.coef[0]:.0f} B + {self.coef[1]:.1f} B x {names[0]} + "
                f"{self.coef[2]:.1f} B x {names[1]}")


def probe_buckets(is_prompt: bool, buckets: Iterable[Bucket], max_blocks: int) -> list[Bucket]:
    """A few buckets whose graphs pin down the model: the smallest one, the one with
    the most padded tokens (prompt) or rows (decode), and one that reads more KV
    blocks (at most `max_blocks`, the temporary cache's size)."""
    buckets = sorted(set(buckets))
    if not buckets:
        return []
    if is_prompt:
        small = min(buckets, key=lambda b: (b.batch_size * b.query_len, b.num_blocks, b))
        big = max((b for b in buckets if b.num_blocks == 0 or b == small),
                  key=lambda b: (b.batch_size * b.query_len, b))
        with_ctx = [b for b in buckets if 0 < b.num_blocks <= max_blocks
                    and (b.batch_size, b.query_len) == (small.batch_size, small.query_len)]
        ctx = [max(with_ctx, key=lambda b: b.num_blocks)] if with_ctx else []
        return sorted({small, big, *ctx})
    small = Bucket(1, 1, 1)
    rows = max(b.batch_size for b in buckets)
    wide = Bucket(rows, 1, min(rows, max_blocks))
    deep = Bucket(1, 1, max(1, min(max_blocks, max(b.num_blocks for b in buckets))))
    return sorted({small, wide, deep})


@dataclass(frozen=True)
class GraphReservePlan:
    reserve: int
    """Bytes kept for graphs: the estimate plus headroom, capped (see module doc)."""
    prompt_bytes: float
    decode_bytes: float
    capped: bool


def plan_graph_reserve(prompt: GraphMemoryModel, decode: GraphMemoryModel,
                       prompt_buckets: Iterable[Bucket], decode_buckets: Iterable[Bucket],
                       usable: int) -> GraphReservePlan:
    """The graph memory every bucket needs (see module doc, step 3)."""
    p = sum(prompt.estimate(b) for b in prompt_buckets)
    d = sum(decode.estimate(b) for b in decode_buckets)
    want = int((p + d) * (1 + HEADROOM))
    cap = int(usable * MAX_GRAPH_SHARE)
    return GraphReservePlan(min(want, cap), p, d, want > cap)


def is_device_oom(error: BaseException) -> bool:
    """An allocation the device refused: torch's OutOfMemoryError (what the fake HPU
    raises), or the Gaudi runtime's RuntimeError for a failed device allocation."""
    if isinstance(error, MemoryError):
        return True
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and (
        "out of memory" in text.lower() or "Allocation failed" in text
        or "PT_DEVMEM" in text)


def fit_models(samples: dict[bool, list[tuple[Bucket, int]]]
               ) -> tuple[GraphMemoryModel, GraphMemoryModel]:
    """(prompt, decode) models from the probes; a phase with no probe (every capture
    refused, or no buckets) gets a zero model: its captures are then tried and the
    out-of-memory guard decides."""
    models = []
    for is_prompt in (True, False):
        if samples.get(is_prompt):
            models.append(GraphMemoryModel.fit(is_prompt, samples[is_prompt]))
        else:
            logger.warning("No %s graph could be measured; its captures will be tried "
                           "one by one.", "prompt" if is_prompt else "decode")
            models.append(GraphMemoryModel(is_prompt, (0.0, 0.0, 0.0)))
    return models[0], models[1]


def oom_is_recoverable(tp_group) -> bool:
    """A capture that runs out of memory on one rank of several stops that rank before
    the pass's remaining collectives, which its peers then wait in forever: only a
    single rank can skip the bucket and go on. With TP the error is raised (a failed
    start, not a hang); the budget checks, taken over every rank's memory, are what
    keep TP captures within memory."""
    return tp_group.world_size == 1


_FAILED = 1 << 62
"""Stands for "this rank's capture failed" in the one max-reduction a capture makes."""


def reduce_capture(all_reduce_int, used: int, failed: bool) -> Optional[int]:
    """The bytes a capture took on the rank that took the most, or None when any TP
    rank's capture failed; one collective (`all_reduce_int(value, "max")`)."""
    worst = all_reduce_int(_FAILED if failed else max(0, used), "max")
    return None if worst >= _FAILED else worst
