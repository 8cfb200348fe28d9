"""Offline latency: wall time of one batch of fixed-length requests, from submit to last token.

Same flags and output lines as vLLM's script: a batch of `--batch-size` prompts of
`--input-len` random token ids, each generating exactly `--output-len` tokens, run
`--num-iters-warmup` times unmeasured and then `--num-iters` times measured.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any

import numpy as np

PERCENTAGES = (10, 25, 50, 75, 90, 99)
# vLLM's script draws prompt ids below 10000; kept so inputs resemble its runs.
DUMMY_VOCAB_LIMIT = 10000


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Benchmark the latency of processing a single batch of requests.")
    add_cli_args(parser)
    return parser


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """The flags (also `vllm bench latency`'s)."""
    from vllm.engine.arg_utils import EngineArgs
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--n", type=int, default=1, help="Sequences generated per prompt.")
    parser.add_argument("--num-iters-warmup", type=int, default=10,
                        help="Iterations run before measuring.")
    parser.add_argument("--num-iters", type=int, default=30, help="Measured iterations.")
    parser.add_argument("--output-json", type=str, default=None,
                        help="Path to save the latency results as JSON.")
    parser.add_argument("--disable-detokenize", action="store_true",
                        help="Do not detokenize outputs.")
    EngineArgs.add_cli_args(parser)


def validate_args(args: argparse.Namespace) -> None:
    for name in ("input_len", "output_len", "batch_size", "n", "num_iters"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(args, name)}.")
    if args.num_iters_warmup < 0:
        raise ValueError(f"num_iters_warmup must be >= 0, got {args.num_iters_warmup}.")


def dummy_prompts(batch_size: int, input_len: int, vocab_size: int,
                  seed: int) -> list[dict[str, list[int]]]:
    """`batch_size` prompts of `input_len` random token ids, as engine token prompts."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, min(DUMMY_VOCAB_LIMIT, vocab_size), size=(batch_size, input_len))
    return [{"prompt_token_ids": row} for row in ids.tolist()]


def summarize(latencies: list[float]) -> dict[str, Any]:
    arr = np.array(latencies)
    percentiles = np.percentile(arr, PERCENTAGES)
    return {"avg_latency": float(arr.mean()), "latencies": arr.tolist(),
            "percentiles": {str(p): float(v) for p, v in zip(PERCENTAGES, percentiles)}}


def report(summary: dict[str, Any]) -> str:
    lines = [f"Avg latency: {summary['avg_latency']} seconds"]
    lines += [f"{p}% percentile latency: {v} seconds"
              for p, v in summary["percentiles"].items()]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> dict[str, Any]:
    from tqdm import tqdm

    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.transformers_utils.config import create_model_config

    validate_args(args)
    model_config = create_model_config(model=args.model, tokenizer=args.tokenizer,
                                       dtype=args.dtype, max_model_len=args.max_model_len)
    if args.input_len + args.output_len > model_config.max_model_len:
        raise ValueError(f"input_len + output_len = {args.input_len + args.output_len} "
                         f"exceeds max_model_len={model_config.max_model_len}.")
    llm = LLM(**dataclasses.asdict(EngineArgs.from_cli_args(args)))
    extra = {"detokenize": False} if args.disable_detokenize else {}
    params = SamplingParams(n=args.n, temperature=1.0, top_p=1.0, ignore_eos=True,
                            max_tokens=args.output_len, **extra)
    prompts = dummy_prompts(args.batch_size, args.input_len, model_config.vocab_size,
                            args.seed)

    def run_once() -> float:
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start

    print("Warming up...")
    for _ in tqdm(range(args.num_iters_warmup), desc="Warmup iterations"):
        run_once()
    latencies = [run_once() for _ in tqdm(range(args.num_iters), desc="Profiling iterations")]
    summary = summarize(latencies)
    print(report(summary))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(summary, f, indent=4)
    return summary


if __name__ == "__main__":
    main(build_parser().parse_args())
