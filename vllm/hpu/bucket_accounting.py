"""Per-pass bucket accounting of the HPU runner: padding, bucket hits, the trace.

Every real (not warmup) pass the runner pads to a bucket is reported here once: it
adds the pass's padded and real compute (`padding_cost.py`) and its bucket to
`PaddingStats`, counts passes that ran in a fallback bucket (one generated at
serving time, i.e. not warmed up), and, with `VLLM_BUCKET_TRACE=path`, appends each
decode pass's shape, and each set of prompts the runner split into passes, to a
trace for the bucket planner. Nothing here touches the device: the numbers leave the
worker through `HPUModelRunner.get_bucket_stats`, a utility call the server polls at
most once a second.
"""
from __future__ import annotations

import logging
from typing import Optional

from vllm import envs
from vllm.hpu.bucket_trace import EngineLimits, TracePass, TraceRecorder
from vllm.hpu.bucketing import Bucket, HPUBucketingContext
from vllm.hpu.padding_cost import DECODE_ROW_WEIGHT, PaddingStats, decode_cost, prompt_cost
from vllm.hpu.prompt_grouping import resolve_pass_overhead

logger = logging.getLogger(__name__)


class BucketAccounting:

    def __init__(self, bucketing: HPUBucketingContext, record_trace: bool = True) -> None:
        self.bucketing = bucketing
        self.block_size = bucketing.block_size
        self.row_weight = (bucketing.plan.decode_row_weight if bucketing.plan is not None
                           else DECODE_ROW_WEIGHT)
        self.padding = PaddingStats()
        self.fallback_passes = 0
        self.recorder: Optional[TraceRecorder] = None
        if record_trace and envs.VLLM_BUCKET_TRACE:
            self.recorder = TraceRecorder(envs.VLLM_BUCKET_TRACE, self.trace_limits)

    def trace_limits(self) -> EngineLimits:
        """The trace's header: the limits and the grid the server runs (its warmed
        buckets, without the fallbacks serving added: a replay adds them again at the
        same passes), so the planner replays against the server's real buckets."""
        b = self.bucketing
        fallback = set(b.fallback_buckets)
        return EngineLimits(
            b.block_size, b.max_num_seqs, b.max_num_batched_tokens, b.max_model_len,
            b.max_num_prefill_seqs, use_prompt_context=b.use_prompt_context,
            num_kv_blocks=b.num_kv_blocks, strategy=b.strategy,
            prompt_pass_overhead=resolve_pass_overhead(b.plan),
            prompt_buckets=tuple(x for x in b.prompt_buckets if x not in fallback),
            decode_buckets=tuple(x for x in b.decode_buckets if x not in fallback))

    def prompt_set(self, query_lens: list[int], ctx_blocks: list[int]) -> None:
        """A step's prompts of one dependency level, before they are split into passes
        (traced as a set, so the planner can replay the split for any buckets)."""
        if self.recorder is not None and query_lens:
            self.recorder.record(TracePass.prompt_set(query_lens, ctx_blocks,
                                                      self.block_size))

    def prompt_pass(self, bucket: Bucket, query_lens: list[int], ctx_blocks: list[int]) -> None:
        bsz = self.block_size
        real = sum(q + c * bsz for q, c in zip(query_lens, ctx_blocks))
        self._add("prompt", bucket, prompt_cost(*bucket, bsz), real)

    def decode_pass(self, bucket: Bucket, batch_size: int, num_blocks: int) -> None:
        padded = decode_cost(bucket.batch_size, bucket.num_blocks, self.block_size,
                             self.row_weight)
        real = decode_cost(batch_size, num_blocks, self.block_size, self.row_weight)
        self._add("decode", bucket, padded, real)
        if self.recorder is not None:
            self.recorder.record(TracePass("decode", batch_size, 1, num_blocks))

    def _add(self, phase: str, bucket: Bucket, padded: int, real: int) -> None:
        self.padding.add(phase, tuple(bucket), padded, real)
        if bucket in self.bucketing.fallback_buckets:
            self.fallback_passes += 1

    def stats(self) -> dict:
        out = self.padding.snapshot()
        out.update(fallback_passes=self.fallback_passes, strategy=self.bucketing.strategy,
                   decode_row_weight=self.row_weight)
        if self.bucketing.plan is not None:
            out["predicted_waste"] = dict(self.bucketing.plan.predicted_waste)
        return out

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()
