"""Padding waste of today's exponential HPU buckets vs the bucket planner's plan.

Draws the synthetic ShareGPT-like request set (`datasets.sample_synthetic_lengths`),
turns it into the passes a continuous-batching scheduler runs (`bucket_trace.simulate`),
and replays them through the HPU runner's bucket lookup twice: with the default
exponential buckets and with a plan of the same number of buckets
(`vllm.hpu.bucket_planner`). No model and no device are needed.

    python benchmarks/bucket_plan.py --num-prompts 2000 --max-num-seqs 256 \\
        --max-num-batched-tokens 8192 --max-model-len 4096
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time

if __package__ in (None, ""):
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    sys.path.insert(0, os.path.dirname(_HERE))

from benchmarks.datasets import sample_synthetic_lengths  # noqa: E402
from vllm.hpu.bucket_planner import (default_context, evaluate, make_plan,  # noqa: E402
                                     plan_context)
from vllm.hpu.bucket_trace import EngineLimits, simulate  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-prompts", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-model-len", type=int, default=4096)
    args = p.parse_args()
    logging.getLogger("vllm").setLevel(logging.ERROR)
    limits = EngineLimits(args.block_size, args.max_num_seqs, args.max_num_batched_tokens,
                          args.max_model_len)
    passes = simulate(sample_synthetic_lengths(args.num_prompts, args.seed,
                                               max_model_len=args.max_model_len), limits)
    base = default_context(limits)
    n_prompt, n_decode = base.num_prompt_buckets, base.num_decode_buckets
    b = evaluate(base, passes)
    start = time.perf_counter()
    plan = make_plan(passes, limits, n_prompt, n_decode)
    took = time.perf_counter() - start
    e = evaluate(plan_context(plan, limits), passes)
    print(f"trace: {sum(x.phase == 'prompt' for x in passes)} prompt passes, "
          f"{sum(x.phase == 'decode' for x in passes)} decode passes")
    for name, n_p, n_d, ev in (("exponential", n_prompt, n_decode, b),
                               ("plan", len(plan.prompt_buckets), len(plan.decode_buckets), e)):
        print(f"{name:12s} {n_p:4d} prompt + {n_d:4d} decode buckets: padding waste prompt "
              f"{ev.waste['prompt']:6.1%} (bucket rounding {ev.rounding_waste['prompt']:6.1%}),"
              f" decode {ev.waste['decode']:6.1%}; {ev.fallbacks} fallback buckets")
    print(f"plan computed in {took:.1f} s, within x{plan.optimality_bound:.3f} of the optimum")


if __name__ == "__main__":
    main()
