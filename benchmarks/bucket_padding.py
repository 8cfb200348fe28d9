"""Padding waste of the HPU bucket grids on random batches (no model, no device).

A batch runs at its bucket's shape, so every token slot between the batch's real
tokens and the bucket's is computed for nothing. This script draws random prompt and
decode batches within the engine's limits, finds each one's bucket with the HPU
runner's own bucketing (`HPUBucketingContext`, the default strategy of this
checkout), and reports:

- prompt: padding to the longest prompt of the batch (bs x longest vs the real
  tokens) and padding from rounding that up to the bucket (bucket bs x query vs bs x
  longest); the total waste is 1 - real / bucket tokens = 1 - (1 - a)(1 - b).
- decode: rows (bucket bs vs bs) and KV blocks read (bucket blocks vs the blocks the
  batch holds: without contiguous paged attention a decode batch reads the blocks of
  its sequences, ceil(context / block_size) each).

    python benchmarks/bucket_padding.py --max-model-len 512 --block-size 128 \\
        --max-num-seqs 8 --batches 100
"""
from __future__ import annotations

import argparse
import os
import random
import sys

if __package__ in (None, ""):
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    sys.path.insert(0, os.path.dirname(_HERE))

try:
    from vllm.hpu.bucketing import HPUBucketingContext
except ImportError:  # checkouts before the HPU backend moved into vllm/hpu/
    from vllm.worker.hpu_bucketing import HPUBucketingContext  # type: ignore


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def prompt_padding(ctx: HPUBucketingContext, batches: list[list[int]]) -> dict[str, float]:
    real = longest = padded = 0
    for lengths in batches:
        bucket = ctx.find_prompt_bucket(len(lengths), max(lengths), 0)
        real += sum(lengths)
        longest += len(lengths) * max(lengths)
        padded += bucket.batch_size * bucket.query_len
    return {"to_longest": 1 - _ratio(real, longest), "bucket_rounding": 1 - _ratio(longest, padded),
            "total": 1 - _ratio(real, padded)}


def decode_padding(ctx: HPUBucketingContext, batches: list[list[int]],
                   block_size: int) -> dict[str, float]:
    rows = bucket_rows = blocks = bucket_blocks = 0
    for contexts in batches:
        need = sum(-(-c // block_size) for c in contexts)
        bucket = ctx.find_decode_bucket(len(contexts), need)
        rows += len(contexts)
        bucket_rows += bucket.batch_size
        blocks += need
        bucket_blocks += bucket.num_blocks
    return {"rows": 1 - _ratio(rows, bucket_rows), "blocks": 1 - _ratio(blocks, bucket_blocks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192,
                        help="the scheduler's default with chunked prefill")
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=480)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    budget = args.max_num_batched_tokens
    num_kv_blocks = args.max_num_seqs * -(-args.max_model_len // args.block_size)
    ctx = HPUBucketingContext(args.max_num_seqs, None, args.block_size, budget,
                              args.max_model_len, num_kv_blocks=num_kv_blocks,
                              use_prompt_context=False)
    def batch(rng: random.Random, n_max: int) -> list[int]:
        return [rng.randint(args.min_len, args.max_len) for _ in range(rng.randint(1, n_max))]

    prompt_rng, decode_rng = random.Random(args.seed), random.Random(args.seed + 1)

    prompts = []
    while len(prompts) < args.batches:  # batches the runner would run as one pass
        b = batch(prompt_rng, args.max_num_seqs)
        if ctx.covering_prompt_bucket(len(b), max(b), 0) is not None:
            prompts.append(b)
    decodes = [batch(decode_rng, args.max_num_seqs) for _ in range(args.batches)]
    p = prompt_padding(ctx, prompts)
    d = decode_padding(ctx, decodes, args.block_size)
    print(f"buckets: {ctx.num_prompt_buckets} prompt, {ctx.num_decode_buckets} decode; "
          f"decode block values {sorted({b.num_blocks for b in ctx.decode_buckets})}")
    print(f"prompt padding over {args.batches} batches: total {p['total']:.1%} "
          f"(to the longest prompt {p['to_longest']:.1%}, bucket rounding "
          f"{p['bucket_rounding']:.1%})")
    print(f"decode padding over {args.batches} batches: rows {d['rows']:.1%}, "
          f"KV blocks {d['blocks']:.1%}")


if __name__ == "__main__":
    main()
