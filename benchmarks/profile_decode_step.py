"""Where a decode step's time goes, on the CPU path (the table in benchmarks/README.md).

Runs `--batch-size` prompts of `--input-len` random tokens for `--output-len` greedy
tokens twice with the same engine:

1. the module path (the fused native layer call switched off), with every native
   kernel wrapper and `scaled_dot_product_attention` timed: the kernels' share of a
   decode step, and the rest (Python: modules, runner, scheduler, sampling glue);
2. the default path (decode steps as one native call per layer), timed as a whole.

Only pure decode steps are counted (the prefill step is reported apart). Times are
wall clock of this process; run it on an otherwise idle machine.
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
import collections
import dataclasses
import json
import time
from typing import Any, Callable

import numpy as np

KERNELS = ("gemm_bf16_packed", "gemm_bf16_amx", "decode_attention", "rms_norm", "rotary_",
           "silu_and_mul", "write_kv")


class StepTimer:
    """Times engine steps and the kernel calls made inside them."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, int, int]] = []  # (seconds, tokens, requests)
        self.kernels: collections.Counter = collections.Counter()
        self.in_decode = False

    def wrap_kernel(self, owner: Any, name: str) -> Callable[[], None]:
        real = getattr(owner, name)

        def timed(*args, **kwargs):
            if not self.in_decode:
                return real(*args, **kwargs)
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.kernels[name] += time.perf_counter() - start

        setattr(owner, name, timed)
        return lambda: setattr(owner, name, real)


def _run(llm: Any, prompts: list, output_len: int, timer: StepTimer) -> None:
    from vllm import SamplingParams
    from vllm.engine import core as core_mod

    real_step = core_mod.EngineCore.step

    def step(self):
        so_tokens = []
        real_schedule = self.scheduler.schedule

        def schedule():
            so = real_schedule()
            tokens, requests = so.total_num_scheduled_tokens, len(so.num_scheduled_tokens)
            so_tokens.append((tokens, requests))
            timer.in_decode = tokens == requests and tokens > 0
            return so

        self.scheduler.schedule = schedule
        start = time.perf_counter()
        try:
            return real_step(self)
        finally:
            del self.scheduler.schedule
            timer.in_decode = False
            if so_tokens:
                timer.steps.append((time.perf_counter() - start, *so_tokens[0]))

    core_mod.EngineCore.step = step
    try:
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=output_len,
                                             ignore_eos=True), use_tqdm=False)
    finally:
        core_mod.EngineCore.step = real_step


def _summarize(timer: StepTimer, kernel_share: bool) -> dict[str, Any]:
    decode = [s for s in timer.steps if s[1] == s[2] and s[1] > 0]
    prefill = [s for s in timer.steps if s[1] != s[2]]
    n = max(1, len(decode))
    out = {"decode_steps": len(decode),
           "decode_step_ms": 1000 * sum(s[0] for s in decode) / n,
           "prefill_ms": 1000 * sum(s[0] for s in prefill)}
    if kernel_share:  # kernel time is only accumulated inside decode steps
        out["kernels_ms_per_step"] = {k: 1000 * v / n for k, v in timer.kernels.items()}
    return out


def main(args: argparse.Namespace) -> dict[str, Any]:
    import torch.nn.functional as F

    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs
    from vllm.cpu import fused_decode as llama_fused
    from vllm.cpu import cpu_ops

    llm = LLM(**dataclasses.asdict(EngineArgs.from_cli_args(args)))
    rng = np.random.default_rng(args.seed)

    def prompts() -> list:  # fresh ids each call: no prefix-cache hits
        return [{"prompt_token_ids": rng.integers(0, 10000, args.input_len).tolist()}
                for _ in range(args.batch_size)]

    from vllm import SamplingParams
    llm.generate(prompts(), SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)

    # 1. Module path with timed kernels; kernel times counted in decode steps only.
    real_build = llama_fused.FusedDecode.build
    llama_fused.FusedDecode.build = classmethod(lambda cls, layers: None)
    _reset_fused(llm)
    timer = StepTimer()
    undo = [timer.wrap_kernel(cpu_ops, k) for k in KERNELS]
    undo.append(timer.wrap_kernel(F, "scaled_dot_product_attention"))
    _run(llm, prompts(), args.output_len, timer)
    for u in undo:
        u()
    llama_fused.FusedDecode.build = real_build
    _reset_fused(llm)
    modules = _summarize(timer, kernel_share=True)

    # 2. Default path (fused decode layers).
    fused_timer = StepTimer()
    _run(llm, prompts(), args.output_len, fused_timer)
    fused = _summarize(fused_timer, kernel_share=False)

    result = {"batch_size": args.batch_size, "input_len": args.input_len,
              "output_len": args.output_len, "module_path": modules, "fused_path": fused}
    print_report(result)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=4)
    return result


def _reset_fused(llm: Any) -> None:
    """Make the model's decoder stack re-decide its fused runner (after build() was
    swapped): the CPU forward keeps it in the op's `state`."""
    from vllm.model_executor.layers.decoder_stack import DecoderStack
    for module in _models(llm):
        if isinstance(module, DecoderStack):
            module.state.clear()


def _models(llm: Any):
    executor = llm.llm_engine.engine_core.executor
    worker = getattr(executor, "worker", None)
    if worker is None:
        raise SystemExit("profile_decode_step.py needs the single-process executor.")
    return worker.model_runner.model.modules()


def print_report(r: dict[str, Any]) -> None:
    m, f = r["module_path"], r["fused_path"]
    print(f"batch {r['batch_size']}, {r['input_len']} prompt tokens, {r['output_len']} "
          f"generated; decode steps: module path {m['decode_step_ms']:.2f} ms, "
          f"fused path {f['decode_step_ms']:.2f} ms")
    total = m["decode_step_ms"]
    kernels = m["kernels_ms_per_step"]
    for name, ms in sorted(kernels.items(), key=lambda kv: -kv[1]):
        print(f"  {name:32s} {ms:7.2f} ms  {100 * ms / total:5.1f}%")
    rest = total - sum(kernels.values())
    print(f"  {'rest (Python, runner, sampling)':32s} {rest:7.2f} ms  {100 * rest / total:5.1f}%")


def build_parser() -> argparse.ArgumentParser:
    from vllm.engine.arg_utils import EngineArgs
    parser = argparse.ArgumentParser(description="Decode-step time breakdown (CPU).")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--output-json", type=str, default=None)
    EngineArgs.add_cli_args(parser)
    return parser


if __name__ == "__main__":
    main(build_parser().parse_args())
