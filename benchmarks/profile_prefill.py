"""Where a prefill's time goes on the CPU path (the prefill table in benchmarks/README.md).

For each prompt length, `--batch-size` fresh random prompts (no prefix-cache hits) are
prefilled in one step (max_tokens=1) with each prefill attention kernel forced in
turn (`rowwise`: the paged decode kernel row by row; `flash`: the blocked prefill
kernel; `sdpa`: torch's scaled_dot_product_attention per sequence) and with the
kernel the start-up measurement chose (`chosen`, prefill_choice.py). Each step is
split into the linear layers (every `cpu_gemm.linear` call: projections, MLP, LM head
at the sampled rows), attention (the backend's forward: KV write plus attention) and
the rest (norms, rotary, activations, runner, sampler). Best of `--reps` steps, wall
clock of this process; the load average is printed beside the table.
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
import time
from typing import Any, Callable

import numpy as np

KINDS = ("chosen", "rowwise", "flash", "sdpa")


class Timer:
    """Accumulates seconds per part while `active`."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}
        self.active = False

    def wrap(self, owner: Any, name: str, part: str) -> Callable[[], None]:
        real = getattr(owner, name)

        def timed(*args, **kwargs):
            if not self.active:
                return real(*args, **kwargs)
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.parts[part] = self.parts.get(part, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)
        return lambda: setattr(owner, name, real)


def one_step(llm: Any, prompts: list, timer: Timer) -> dict[str, float]:
    """Prefill `prompts` in one engine step; seconds of the step and of each part."""
    from vllm import SamplingParams
    from vllm.engine import core as core_mod

    real_step = core_mod.EngineCore.step
    steps: list[float] = []

    def step(self):
        timer.parts = {}
        timer.active = True
        start = time.perf_counter()
        try:
            return real_step(self)
        finally:
            timer.active = False
            steps.append(time.perf_counter() - start)

    core_mod.EngineCore.step = step
    try:
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    finally:
        core_mod.EngineCore.step = real_step
    if len(steps) != 1:
        raise SystemExit(f"the prompts took {len(steps)} steps; raise "
                         "--max-num-batched-tokens")
    return {"step": steps[0], **timer.parts}


def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers import logits_processor
    from vllm.model_executor.layers.quantization import unquantized
    from vllm.attention.backends.torch_sdpa import TorchSDPABackendImpl
    from vllm.cpu.model_runner import CPUModelRunner

    args.enable_prefix_caching = False
    llm = LLM(**dataclasses.asdict(EngineArgs.from_cli_args(args)))
    rng = np.random.default_rng(args.seed)
    timer = Timer()
    undo = [timer.wrap(unquantized, "linear", "gemm"),
            timer.wrap(logits_processor, "linear", "gemm"),
            timer.wrap(TorchSDPABackendImpl, "forward", "attention")]
    chosen = CPUModelRunner._prefill_kind
    rows = []
    try:
        for length in args.input_lens:
            for kind in args.kinds:
                CPUModelRunner._prefill_kind = (
                    chosen if kind == "chosen" else (lambda self, n, k=kind: k))
                best: dict[str, float] = {}
                for _ in range(args.reps + 1):  # the first is a warm-up
                    prompts = [{"prompt_token_ids": rng.integers(0, 10000, length).tolist()}
                               for _ in range(args.batch_size)]
                    r = one_step(llm, prompts, timer)
                    if not best or r["step"] < best["step"]:
                        best = r
                best = {k: 1000 * v for k, v in best.items()}
                best["rest"] = best["step"] - best.get("gemm", 0) - best.get("attention", 0)
                rows.append({"input_len": length, "kind": kind, **best})
                print_row(rows[-1], args.batch_size)
    finally:
        CPUModelRunner._prefill_kind = chosen
        for u in undo:
            u()
    return rows


def print_row(r: dict[str, Any], batch: int) -> None:
    step = r["step"]
    parts = "  ".join(f"{k} {r.get(k, 0):7.1f} ms ({100 * r.get(k, 0) / step:4.1f}%)"
                      for k in ("gemm", "attention", "rest"))
    print(f"| {batch} x {r['input_len']:4d} | {r['kind']:7s} | {step:8.1f} ms | {parts} |",
          flush=True)


def build_parser() -> argparse.ArgumentParser:
    from vllm.engine.arg_utils import EngineArgs
    parser = argparse.ArgumentParser(description="Prefill step time breakdown (CPU).")
    parser.add_argument("--input-lens", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--reps", type=int, default=3)
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(dtype="bfloat16", max_model_len=1024)
    return parser


if __name__ == "__main__":
    from benchmarks.compare_vllm_cpu import cpu_features, cpu_model_name, load_average
    print(f"CPU: {cpu_model_name()} ({cpu_features()}); load average before "
          f"{load_average()}")
    main(build_parser().parse_args())
    print(f"load average after {load_average()}")
