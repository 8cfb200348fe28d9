"""Where the engine core runs, and async scheduling, measured through the OpenAI server.

Modes (one server each, the same prompts):
- `inproc`: the core in a thread of the API server process
  (VLLM_ENABLE_V1_MULTIPROCESSING=0, the server's only mode before);
- `mp`: the core in its own process (the server's default);
- `mp+async`: its own process and `--async-scheduling`;
- `inproc+async`: a thread of the API process and `--async-scheduling`.
Workload: compare_hf.py's mixed64 (64 random-token prompts of 32..488 tokens, greedy,
EOS ignored, `--output-len` tokens each) streamed with `--concurrency` streams at a time
(several values: one server start per mode, one run per concurrency). Reported per row:
output tokens/s, TTFT p50 and TPOT p50, the CPU seconds the API process and the core
process (with its workers; in-process: nothing) used during the run, with lscpu's model
name and the load average.

    python benchmarks/benchmark_engine_core.py --concurrency 16 64 --output-len 128
"""
from __future__ import annotations

import os
import sys

if __package__ in (None, ""):
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import tempfile

from benchmarks.compare_hf import make_requests
from benchmarks.compare_vllm_cpu import (cpu_features, cpu_model_name, default_model_dir,
                                         engine_env, load_average)
from benchmarks.served_compare import free_port, measure, start_server, stop_server, \
    wait_ready

MODES = {
    "inproc": ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, ()),
    "mp": ({"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}, ()),
    "mp+async": ({"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}, ("--async-scheduling",)),
    "inproc+async": ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, ("--async-scheduling",)),
}


def run_mode(mode: str, args: argparse.Namespace, model: str,
             prompts: list[list[int]]) -> list[dict]:
    extra_env, extra_args = MODES[mode]
    env, cwd = engine_env("ours")
    env.update(extra_env)
    port = free_port()
    log_path = os.path.join(tempfile.gettempdir(), f"engine-core-{mode}-{port}.log")
    proc = start_server(sys.executable, model, args.dtype, args.max_model_len, port, env,
                        cwd, log_path, extra_args + ("--disable-log-requests",))
    rows = []
    try:
        startup = wait_ready(proc, port, args.timeout, log_path)
        measure(port, model, prompts[:8], 4, 8)  # warm the server's first steps
        for concurrency in args.concurrency:
            before = _cpu_seconds(proc.pid)
            res = measure(port, model, prompts, args.output_len, concurrency)
            after = _cpu_seconds(proc.pid)
            res.update(mode=mode, concurrency=concurrency, startup_s=startup,
                       load=load_average(), api_cpu_s=after[0] - before[0],
                       core_cpu_s=after[1] - before[1])
            rows.append(res)
            print(_row(res), flush=True)
    finally:
        stop_server(proc)
    return rows


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of the API server process and of its children (the
    engine core process and its workers): whether the API process is the bottleneck."""
    import psutil
    server = psutil.Process(pid)

    def used(p: "psutil.Process") -> float:
        try:
            t = p.cpu_times()
            return t.user + t.system
        except psutil.NoSuchProcess:
            return 0.0

    return used(server), sum(used(c) for c in server.children(recursive=True))


def _row(r: dict) -> str:
    return (f"| {r['mode']} | {r['concurrency']} | {r['output_tok_s']:.1f} | "
            f"{r['ttft_p50_ms']:.0f} | {r['tpot_p50_ms']:.1f} | {r['api_cpu_s']:.1f} | "
            f"{r['core_cpu_s']:.1f} | {r['seconds']:.1f} | {r['load']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--model", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    model = args.model or default_model_dir()
    prompts = [r.prompt_token_ids for r in make_requests("mixed64", args.output_len,
                                                          args.seed)]
    rows = []
    for mode in args.modes:
        rows += run_mode(mode, args, model, prompts)
    print(f"\n{cpu_model_name()} ({cpu_features()}), {os.cpu_count()} CPUs; mixed64, "
          f"{args.output_len} output tokens, {args.dtype}")
    print("| mode | streams | output tok/s | TTFT p50 ms | TPOT p50 ms | API process CPU s "
          "| core process CPU s | wall s | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(_row(r))


if __name__ == "__main__":
    main()
