"""Padding waste of today's exponential HPU buckets vs the bucket planner's plan.

Draws the synthetic ShareGPT-like request set (`datasets.sample_synthetic_lengths`),
turns it into the steps a continuous-batching scheduler runs (`bucket_trace.simulate`:
each step's decode batch and the prompts it admits), and replays them through the HPU
runner's prompt split and bucket lookup (`bucket_planner.evaluate`):

- exponential buckets, each step's prompts as one pass (the replay before the runner's
  split was traced; a pass no bucket covers gets a fallback bucket),
- exponential buckets, the runner's former greedy split (`greedy_group_prompts`),
- exponential buckets, the runner's least-cost split (`group_prompts`),
- a plan with the same number of buckets (`vllm.hpu.bucket_planner`), least-cost split.

No model and no device are needed; deterministic.

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
from vllm.hpu.bucket_planner import (Evaluation, default_context, evaluate,  # noqa: E402
                                     make_plan, plan_context)
from vllm.hpu.bucket_trace import EngineLimits, TracePass, simulate  # noqa: E402
from vllm.hpu.prompt_grouping import greedy_group_prompts, resolve_pass_overhead  # noqa: E402


def as_one_pass(p: TracePass) -> TracePass:
    """A step's prompts as one pass (a version-1 trace line)."""
    return TracePass(p.phase, p.batch_size, p.query_len, p.num_blocks, p.real_tokens)


def row(name: str, n_prompt: int, n_decode: int, ev: Evaluation) -> str:
    return (f"{name:30s} {n_prompt:3d} + {n_decode:3d} buckets: prompt waste "
            f"{ev.waste['prompt']:6.1%} (rounding {ev.rounding_waste['prompt']:6.1%}), "
            f"{ev.passes['prompt']:5d} passes, with their overhead "
            f"{ev.prompt_objective / ev.real['prompt']:.2f}x real; decode waste "
            f"{ev.waste['decode']:5.1%}; {ev.fallbacks} fallback buckets")


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
    n_prompt = default_context(limits).num_prompt_buckets
    n_decode = default_context(limits).num_decode_buckets
    rows = [("exponential, step = 1 pass", evaluate(default_context(limits),
                                                   [as_one_pass(x) for x in passes])),
            ("exponential, greedy split", evaluate(default_context(limits), passes,
                                                   grouping=greedy_group_prompts)),
            ("exponential, least-cost split", evaluate(default_context(limits), passes))]
    start = time.perf_counter()
    plan = make_plan(passes, limits, n_prompt, n_decode)
    took = time.perf_counter() - start
    plan_ev = evaluate(plan_context(plan, limits), passes)
    print(f"trace: {sum(x.phase == 'prompt' for x in passes)} steps with prompts, "
          f"{sum(x.phase == 'decode' for x in passes)} decode passes; a prompt pass costs "
          f"{resolve_pass_overhead()} token slots (VLLM_PROMPT_PASS_OVERHEAD_TOKENS)")
    for name, ev in rows:
        print(row(name, n_prompt, n_decode, ev))
    print(row("plan, least-cost split", len(plan.prompt_buckets), len(plan.decode_buckets),
              plan_ev))
    for name, ev in (("step = 1 pass", rows[0][1]), ("least-cost split", rows[2][1])):
        ratio = plan_ev.waste["prompt"] / ev.waste["prompt"]
        print(f"plan prompt waste / exponential ({name}): {ratio:.2f}"
              f" ({'at most' if ratio <= 0.5 else 'more than'} half)")
    print(f"plan computed in {took:.1f} s, buckets within x{plan.optimality_bound:.3f} of the "
          f"optimum for their passes")


if __name__ == "__main__":
    main()
