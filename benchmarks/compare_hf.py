"""The engine against transformers' `generate`, side by side in one process.

Both run the same requests on the same weights and dtype, greedy, EOS ignored, each
request producing exactly `--output-len` tokens; repetitions alternate which backend
goes first, so load that drifts during the run falls on both, and each repetition
draws new prompts (the engine's prefix cache never sees a prompt twice). Reports output tokens
per second of each and their ratio per repetition, plus the engine's start-up time
(constructor to ready; a `.gguf` model must already be converted, which the first
run does once).

Workloads:

| name | requests |
| --- | --- |
| `batch16` | 16 prompts of 128 random token ids |
| `mixed64` | 64 prompts of random token ids, lengths from a seeded log-normal (median 130, sigma 1.0) clipped to 32..488 |
| `batch1` | 1 prompt of 128 random token ids |

transformers gets the requests in order in batches of up to `--hf-max-batch-size`
(16), left-padded, as `benchmark_throughput.py --backend hf` does. Both backends run
with the engine's thread count (the CPU worker uses every core the process may use).
"""
from __future__ import annotations

import os
import sys

if __package__ in (None, ""):
    # Run as a file: see benchmark_throughput.py.
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import dataclasses
import json
import time
from typing import Any

import numpy as np

from benchmarks.benchmark_throughput import time_hf, time_vllm
from benchmarks.datasets import SampleRequest

WORKLOADS = ("batch16", "mixed64", "batch1")
MIXED_MEDIAN, MIXED_SIGMA, MIXED_MIN, MIXED_MAX = 130, 1.0, 32, 488
# Prompt ids are drawn below this bound, as benchmark_latency.py does (vLLM's choice).
VOCAB_LIMIT = 10000


def workload_lengths(name: str, seed: int) -> list[int]:
    """Prompt lengths of a named workload."""
    if name == "batch16":
        return [128] * 16
    if name == "batch1":
        return [128]
    if name == "mixed64":
        rng = np.random.default_rng(seed)
        raw = np.round(MIXED_MEDIAN * np.exp(MIXED_SIGMA * rng.standard_normal(64)))
        return np.clip(raw, MIXED_MIN, MIXED_MAX).astype(int).tolist()
    raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}, got {name!r}.")


def make_requests(name: str, output_len: int, seed: int, rep: int = 0) -> list[SampleRequest]:
    """Random-token prompts of the workload's lengths (the same for both backends).

    Lengths depend on `seed` only; the token ids also on the workload and `rep`, so no
    repetition or workload shares a prompt prefix with an earlier one and the engine's
    prefix cache cannot skip prefills that transformers has to compute.
    """
    rng = np.random.default_rng([seed + 1, WORKLOADS.index(name), rep])
    requests = []
    for length in workload_lengths(name, seed):
        ids = rng.integers(0, VOCAB_LIMIT, size=length).tolist()
        requests.append(SampleRequest(prompt="", prompt_len=length,
                                      expected_output_len=output_len, prompt_token_ids=ids,
                                      use_token_ids=True))
    return requests


def build_parser() -> argparse.ArgumentParser:
    from vllm.engine.arg_utils import EngineArgs

    parser = argparse.ArgumentParser(description="Engine vs transformers.generate, greedy.")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--reps", type=int, default=2, help="Timed runs of each backend.")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--hf-max-batch-size", type=int, default=16)
    parser.add_argument("--output-json", type=str, default=None)
    parser.add_argument("--skip-hf", action="store_true",
                        help="Time the engine only (no ratios).")
    EngineArgs.add_cli_args(parser)
    return parser


def validate_args(args: argparse.Namespace) -> None:
    for name in ("reps", "output_len", "hf_max_batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(args, name)}.")


def _timing_args(args: argparse.Namespace) -> argparse.Namespace:
    """What time_vllm / time_hf read: one greedy sequence per request, no progress bar."""
    return argparse.Namespace(n=1, temperature=0.0, disable_detokenize=False,
                              disable_tqdm=True, hf_max_batch_size=args.hf_max_batch_size)


def _warm_up(llm: Any, hf_model: Any, targs: argparse.Namespace, model_config: Any) -> None:
    """One short request through each backend: first-call costs stay out of the timings."""
    warm = make_requests("batch1", 4, seed=12345)
    time_vllm(llm, warm, targs)
    if hf_model is not None:
        time_hf(hf_model, warm, targs, model_config)


def main(args: argparse.Namespace) -> dict[str, Any]:
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs

    from benchmarks.benchmark_throughput import load_hf

    validate_args(args)
    start = time.perf_counter()
    llm = LLM(**dataclasses.asdict(EngineArgs.from_cli_args(args)))
    startup = time.perf_counter() - start
    model_config = llm.llm_engine.get_model_config()
    hf_model = None if args.skip_hf else load_hf(model_config)
    targs = _timing_args(args)
    _warm_up(llm, hf_model, targs, model_config)
    print(f"Engine start-up: {startup:.2f} s")
    rows = []
    for name in args.workloads:
        for rep in range(args.reps):
            requests = make_requests(name, args.output_len, args.seed, rep)
            lens = [r.prompt_len for r in requests]
            order = ["vllm", "hf"] if rep % 2 == 0 else ["hf", "vllm"]
            result: dict[str, Any] = {"workload": name, "rep": rep,
                                      "num_prompts": len(requests),
                                      "prompt_len_min": min(lens), "prompt_len_max": max(lens),
                                      "prompt_len_mean": sum(lens) / len(lens)}
            for backend in order:
                if backend == "hf" and hf_model is None:
                    continue
                res = (time_vllm(llm, requests, targs) if backend == "vllm"
                       else time_hf(hf_model, requests, targs, model_config))
                result[f"{backend}_output_tok_s"] = res.total_output_tokens / res.elapsed_time
                result[f"{backend}_elapsed_s"] = res.elapsed_time
            if hf_model is not None:
                result["ratio"] = result["vllm_output_tok_s"] / result["hf_output_tok_s"]
            result["loadavg_1m"] = os.getloadavg()[0]
            rows.append(result)
            print(format_row(result), flush=True)
    summary = {"startup_s": startup, "runs": rows}
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(summary, f, indent=4)
    return summary


def format_row(r: dict[str, Any]) -> str:
    line = (f"{r['workload']:8s} rep {r['rep']}: {r['num_prompts']} prompts "
            f"({r['prompt_len_min']}-{r['prompt_len_max']} tokens, mean "
            f"{r['prompt_len_mean']:.0f}): engine {r['vllm_output_tok_s']:.1f} output tok/s")
    if "ratio" in r:
        line += f", transformers {r['hf_output_tok_s']:.1f} output tok/s, ratio {r['ratio']:.2f}x"
    return line + f" (load {r['loadavg_1m']:.1f})"


if __name__ == "__main__":
    main(build_parser().parse_args())
