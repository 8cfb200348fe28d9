"""The default HPU bucket grid's trade: warmup size against padding waste.

Each bucket is a graph compiled (and, in HPU graph mode, captured) before the server
listens, so the grid's size is the warmup's length; its spacing is the padding every
batch pays. For a few engine configurations this prints, side by side:

- this engine's default grid (exponential, prefix caching on: prompt buckets have a
  context dimension; decode blocks up to the KV cache);
- vllm-gaudi's exponential grid for the same limits, computed from its documented
  rules (see `gaudi_grid`);
- the bucket planner's plan for the workload at a small bucket budget (`--plan-buckets`).

For each: the bucket counts, the padding waste of a synthetic workload replayed
through the runner's own prompt split and bucket lookup (`bucket_planner.evaluate`,
which matches what a server measures, issue 54), and, with `--warmup`, the warmup's
graph compilations and seconds on the fake HPU (a tiny random model in HPU graph
mode: the compile count is the grid's, the seconds only this machine's).

The workload: `datasets.sample_synthetic_lengths` requests (seed 0) through the
planner's continuous-batching model (`bucket_trace.simulate`); every other request
starts with a shared system prompt of a quarter of max_model_len, whose full blocks
are prefix-cache hits after its first use (context blocks of the prompt pass).

    python benchmarks/bucket_grid_tradeoff.py [--warmup]
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Optional

if __package__ in (None, ""):
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    sys.path.insert(0, os.path.dirname(_HERE))

from benchmarks.compare_vllm_cpu import cpu_model_name  # noqa: E402
from benchmarks.datasets import sample_synthetic_lengths  # noqa: E402
from vllm.hpu.bucket_planner import (BucketPlan, default_context, evaluate,  # noqa: E402
                                     make_plan, plan_context)
from vllm.hpu.bucket_trace import EngineLimits, TracePass, simulate  # noqa: E402
from vllm.hpu.bucketing import Bucket, HPUBucketingContext, exponential_range  # noqa: E402

CONFIGS = [(512, 8), (2048, 32), (4096, 64)]
"""(max_model_len, max_num_seqs); block 128, the scheduler's 8192-token budget."""
BLOCK_SIZE = 128
BUDGET = 8192


def _log2_points(value: int) -> int:
    return math.ceil(math.log2(value)) + 1 if value > 1 else 1


def gaudi_grid(limits: EngineLimits) -> tuple[list[Bucket], list[Bucket]]:
    """vllm-gaudi's exponential buckets for these limits, from its documentation: each
    dimension an exponential range (min, step, max, limit) with limit = ceil(log2(max))
    + 1 points, min and max included, points rounded up to step and de-duplicated (a
    min of 0 or 1 is added back to points built from step); every value of each
    dimension warmed with every other, then filtered.

    - prompt: bs (1, 2, max_num_prefill_seqs); query (block, block, max_num_batched_
      tokens); with prefix caching, context blocks (0, 1, (max_model_len - block) /
      block); kept when bs * (query + ctx * block) <= max_num_batched_tokens and
      query + ctx * block <= max_model_len;
    - decode: bs (1, 2, max_num_seqs); blocks (1, max_num_seqs, the KV blocks); kept
      when bs <= blocks <= bs * ceil(max_model_len / block).
    """
    bsz, mps = limits.block_size, limits.prefill_seqs
    bs = exponential_range(1, 2, mps, _log2_points(mps))
    query = exponential_range(bsz, bsz, limits.max_num_batched_tokens,
                              _log2_points(limits.max_num_batched_tokens))
    max_ctx = max(1, (limits.max_model_len - bsz) // bsz)
    ctx = (exponential_range(0, 1, max_ctx, _log2_points(max_ctx))
           if limits.use_prompt_context else [0])
    prompt = [Bucket(b, q, c) for b in bs for q in query for c in ctx
              if b * (q + c * bsz) <= limits.max_num_batched_tokens
              and q + c * bsz <= limits.max_model_len]
    kv = limits.num_kv_blocks or limits.max_num_seqs * -(-limits.max_model_len // bsz)
    dbs = exponential_range(1, 2, limits.max_num_seqs, _log2_points(limits.max_num_seqs))
    blocks = exponential_range(1, limits.max_num_seqs, kv, _log2_points(kv))
    per_seq = -(-limits.max_model_len // bsz)
    decode = [Bucket(b, 1, n) for b in dbs for n in blocks if b <= n <= b * per_seq]
    return sorted(prompt), sorted(decode)


def workload(limits: EngineLimits, num_requests: int) -> list[TracePass]:
    """The synthetic requests' passes, every other one behind a shared, cached prefix."""
    bsz = limits.block_size
    prefix_blocks = limits.max_model_len // 4 // bsz
    pairs = sample_synthetic_lengths(num_requests, seed=0, max_model_len=limits.max_model_len)
    shared = [i % 2 == 0 for i in range(len(pairs))]
    pairs = [(min(p + (prefix_blocks * bsz if s else 0), limits.max_model_len - 1), o)
             for (p, o), s in zip(pairs, shared)]
    passes, next_request, seen_prefix = [], 0, False
    for p in simulate(pairs, limits):
        if p.phase == "decode":
            passes.append(p)
            continue
        queries, ctx = [], []
        for q in p.query_lens:  # simulate admits in request order
            cached = 0
            if shared[next_request] and limits.use_prompt_context:
                cached = min(prefix_blocks, (q - 1) // bsz) if seen_prefix else 0
                seen_prefix = True
            queries.append(q - cached * bsz)
            ctx.append(cached)
            next_request += 1
        passes.append(TracePass.prompt_set(queries, ctx, bsz))
    return passes


@dataclass
class Row:
    name: str
    prompt: list[Bucket]
    decode: list[Bucket]
    waste: dict
    compiles: Optional[int] = None
    seconds: Optional[float] = None


def _exact(limits: EngineLimits, prompt: list[Bucket], decode: list[Bucket]
           ) -> HPUBucketingContext:
    return plan_context(BucketPlan(limits.block_size, prompt, decode,
                                   use_prompt_context=limits.use_prompt_context), limits)


def rows_for(limits: EngineLimits, passes: list[TracePass], plan_buckets: int) -> list[Row]:
    ours = default_context(limits, "exp")  # no grid in `limits`: generated
    ours_prompt, ours_decode = list(ours.prompt_buckets), list(ours.decode_buckets)
    rows = [Row("this engine (exp)", ours_prompt, ours_decode, evaluate(ours, passes).waste)]
    g_prompt, g_decode = gaudi_grid(limits)
    rows.append(Row("vllm-gaudi (exp, documented rules)", g_prompt, g_decode,
                    evaluate(_exact(limits, g_prompt, g_decode), passes).waste))
    plan = make_plan(passes, limits, plan_buckets, plan_buckets)
    rows.append(Row(f"plan ({plan_buckets} + {plan_buckets} at most)", plan.prompt_buckets,
                    plan.decode_buckets,
                    evaluate(_exact(limits, plan.prompt_buckets, plan.decode_buckets),
                             passes).waste))
    return rows


WARMUP_CODE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from tests.conftest import make_tiny_model
from vllm import LLM
model = make_tiny_model(sys.argv[2], "llama", max_position_embeddings=int(sys.argv[3]))
llm = LLM(model=model, dtype="float32", max_model_len=int(sys.argv[3]),
          max_num_seqs=int(sys.argv[4]), block_size=128,
          num_gpu_blocks_override=int(sys.argv[5]))
runner = llm.llm_engine.engine_core.executor.worker.model_runner
print("RESULT", json.dumps([runner.tracker.num_compiles_warmup, runner.warmup_seconds,
                            runner.bucketing.num_prompt_buckets,
                            runner.bucketing.num_decode_buckets]))
"""


def measure_warmup(limits: EngineLimits, row: Row, tmp: str) -> None:
    """Start the fake HPU (HPU graph mode) on exactly the row's buckets."""
    plan = BucketPlan(limits.block_size, row.prompt, row.decode,
                      use_prompt_context=limits.use_prompt_context)
    path = os.path.join(tmp, "grid.json")
    plan.save(path)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "VLLM_TARGET_DEVICE": "hpu", "VLLM_USE_FAKE_HPU": "1",
           "PT_HPU_LAZY_MODE": "1", "VLLM_BUCKET_PLAN": path, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", WARMUP_CODE, root, os.path.join(tmp, "m"),
                          str(limits.max_model_len), str(limits.max_num_seqs),
                          str(limits.num_kv_blocks)], env=env, capture_output=True,
                         text=True, check=True)
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    import json
    compiles, seconds, n_prompt, n_decode = json.loads(line[len("RESULT "):])
    assert (n_prompt, n_decode) == (len(row.prompt), len(row.decode)), (n_prompt, n_decode)
    row.compiles, row.seconds = compiles, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-requests", type=int, default=500)
    parser.add_argument("--plan-buckets", type=int, default=16)
    parser.add_argument("--warmup", action="store_true",
                        help="also start the fake HPU on each grid (compiles, seconds)")
    args = parser.parse_args()
    import logging
    logging.getLogger("vllm").setLevel(logging.ERROR)
    print("| max_model_len, max_num_seqs | grid | prompt buckets | decode buckets | "
          "warmup compiles | warmup s | prompt waste | decode waste |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for max_model_len, max_num_seqs in CONFIGS:
            limits = EngineLimits(BLOCK_SIZE, max_num_seqs, BUDGET, max_model_len,
                                  use_prompt_context=True,
                                  num_kv_blocks=max_num_seqs * -(-max_model_len // BLOCK_SIZE))
            passes = workload(limits, args.num_requests)
            for row in rows_for(limits, passes, args.plan_buckets):
                if args.warmup:
                    measure_warmup(limits, row, tmp)
                print(f"| {max_model_len}, {max_num_seqs} | {row.name} | {len(row.prompt)} | "
                      f"{len(row.decode)} | {'-' if row.compiles is None else row.compiles} | "
                      f"{'-' if row.seconds is None else f'{row.seconds:.0f}'} | "
                      f"{row.waste['prompt']:.1%} | {row.waste['decode']:.1%} |")
    if args.warmup:
        print(f"\nwarmup seconds: fake HPU, tiny random llama, 1 thread; lscpu model name: "
              f"{cpu_model_name()}")


if __name__ == "__main__":
    main()
