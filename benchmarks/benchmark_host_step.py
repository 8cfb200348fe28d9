"""Host time per decode step without the model: state update, input layout, sampling.

A model runner is built without a model (what the model contributes is replaced by
random logits) and stepped through decode steps of `--batch-size` requests with
mixed sampling parameters: greedy, temperature, top-k, top-p, min-p, seeded rows,
logprobs, and presence / frequency / repetition penalties on some of them. Each
request starts `--prompt-len` + `--output-len` tokens in, so the token histories
are long, as in the middle of a generation.

Timed per step (medians over `--steps`):
- `update`: `_update_states` (the scheduler's per-step message applied);
- `inputs`: `_prepare_inputs` (the CPU's token-major layout; skipped on the HPU,
  whose bucketed layout needs a loaded model);
- `sample`: sampling metadata + sampler + recording the tokens, i.e. the sampling
  stage's `_sample` on CPU and `_sample_bucket` (one padded bucket) on the (fake)
  HPU (the runner's own methods before the stage existed); split into
  `sampler` (the `Sampler` call: the logits math, penalties included) and
  `metadata` (the rest: the sampler's inputs and the bookkeeping around it).
The logits are fresh random tensors made outside the timed region.

    python benchmarks/benchmark_host_step.py                       # CPU runner
    VLLM_USE_FAKE_HPU=1 python benchmarks/benchmark_host_step.py   # HPU runner's sampling
"""
from __future__ import annotations

import os
import sys

if __package__ in (None, ""):
    # Run as a file: keep this folder off sys.path (see benchmark_throughput.py).
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import importlib
import statistics
import time
from types import SimpleNamespace
from typing import Any, Callable

import torch

BLOCK_SIZE = 16

MIXED_PARAMS = [
    dict(temperature=0.0),
    dict(temperature=0.8, seed=1),
    dict(temperature=0.7, top_k=50),
    dict(temperature=1.0, top_p=0.9, logprobs=2),
    dict(temperature=0.9, min_p=0.05),
    dict(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.3),
    dict(temperature=0.8, top_k=40, top_p=0.95, repetition_penalty=1.2, seed=7),
    dict(temperature=1.0, frequency_penalty=0.5, repetition_penalty=1.1),
]


PENALTY_PARAMS = [
    dict(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.3),
    dict(temperature=0.0, repetition_penalty=1.2),
    dict(temperature=0.0, frequency_penalty=0.5, repetition_penalty=1.1),
]
MIXES = {"mixed": MIXED_PARAMS, "penalties": PENALTY_PARAMS}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=256,
                        help="Output tokens each request already has at the start.")
    parser.add_argument("--vocab-size", type=int, default=49152)
    parser.add_argument("--mix", choices=sorted(MIXES), default="mixed",
                        help="mixed: every knob on some rows (3 of 8 rows penalized); "
                        "penalties: greedy rows that all have penalties (the sampler is "
                        "then mostly the penalties)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: the host work is small ops, and on a "
                        "shared machine a busy OpenMP team times its waits, not the work)")
    return parser


def _config(max_num_seqs: int) -> Any:
    return SimpleNamespace(
        model_config=SimpleNamespace(torch_dtype=torch.bfloat16),
        cache_config=SimpleNamespace(block_size=BLOCK_SIZE, cache_dtype="auto"),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        parallel_config=SimpleNamespace(tensor_parallel_size=1))


def _hpu_runner(max_num_seqs: int) -> Any:
    """The HPU runner's sampling half: its class with only what sampling touches."""
    for name in ("vllm.hpu.model_runner", "vllm.worker.hpu_model_runner"):
        try:
            module = importlib.import_module(name)
            break
        except ImportError:
            continue
    runner = object.__new__(module.HPUModelRunner)
    base = importlib.import_module("vllm.worker.model_runner_base")
    config = _config(max_num_seqs)
    base.ModelRunnerBase.__init__(runner, config, "cpu")
    if hasattr(runner, "sampling_stage"):
        from vllm.hpu.compile_tracker import CompileTracker
        from vllm.hpu.profiler import HPUProfiler
        from vllm.hpu.sampling_stage import HPUSamplingStage
        # vocab_size / max_logprobs size prompt logprobs and warmup, not timed here.
        runner.sampling_stage = HPUSamplingStage(runner.sampling_stage, CompileTracker(),
                                                 "lazy", HPUProfiler(), 0, 20)
    else:  # before the sampling stage: the runner sampled itself
        runner.sampler = module.Sampler(static_shapes=True)
        runner.tracker = module.CompileTracker()
    return runner


def _sampling_half(runner: Any) -> Any:
    """What holds `sampler`, `_sample` and `_sample_bucket`: the runner's sampling
    stage, or the runner itself before the stage existed."""
    return getattr(runner, "sampling_stage", runner)


def _make_runner(max_num_seqs: int) -> tuple[Any, bool]:
    from vllm.platforms import current_platform
    if current_platform.device_name == "hpu" or os.environ.get("VLLM_USE_FAKE_HPU") == "1":
        return _hpu_runner(max_num_seqs), True
    from vllm.cpu.model_runner import CPUModelRunner
    return CPUModelRunner(_config(max_num_seqs), device="cpu"), False


def _first_step(args: argparse.Namespace, rng: torch.Generator) -> Any:
    from vllm.core.sched_output import NewRequestData, SchedulerOutput
    from vllm.sampling_params import SamplingParams
    total = args.prompt_len + args.output_len + args.warmup_steps + args.steps + 1
    num_blocks = -(-total // BLOCK_SIZE)
    new, scheduled = [], {}
    mix = MIXES[args.mix]
    for i in range(args.batch_size):
        tokens = torch.randint(0, args.vocab_size, (args.prompt_len + args.output_len,),
                               generator=rng).tolist()
        req_id = f"req-{i}"
        new.append(NewRequestData(
            req_id=req_id, prompt_token_ids=tokens[:args.prompt_len],
            output_token_ids=tokens[args.prompt_len:],
            sampling_params=SamplingParams(**mix[i % len(mix)]),
            block_ids=list(range(i * num_blocks, (i + 1) * num_blocks)),
            num_computed_tokens=len(tokens) - 1, wants_prompt_logprobs=False))
        scheduled[req_id] = 1
    return SchedulerOutput(scheduled_new_reqs=new, scheduled_cached_reqs=[],
                           num_scheduled_tokens=scheduled,
                           total_num_scheduled_tokens=len(scheduled))


def _next_step(runner: Any) -> Any:
    from vllm.core.sched_output import CachedRequestData, SchedulerOutput
    cached, scheduled = [], {}
    for req_id, st in runner.requests.items():
        cached.append(CachedRequestData(req_id=req_id, new_block_ids=[],
                                        num_computed_tokens=st.num_tokens - 1,
                                        new_token_ids=[st.token_ids[-1]],
                                        num_tokens=st.num_tokens))
        scheduled[req_id] = 1
    return SchedulerOutput(scheduled_new_reqs=[], scheduled_cached_reqs=cached,
                           num_scheduled_tokens=scheduled,
                           total_num_scheduled_tokens=len(scheduled))


class _TimedSampler:
    """The runner's sampler, its calls timed."""

    def __init__(self, sampler: Callable[..., Any]) -> None:
        self.sampler = sampler
        self.seconds = 0.0

    def __call__(self, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.sampler(*args)
        finally:
            self.seconds += time.perf_counter() - start


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def run(args: argparse.Namespace) -> dict[str, float]:
    rng = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    runner, on_hpu = _make_runner(args.batch_size)
    half = _sampling_half(runner)
    half.sampler = sampler = _TimedSampler(half.sampler)
    times: dict[str, list[float]] = {"update": [], "inputs": [], "metadata": [],
                                     "sampler": []}
    so = _first_step(args, rng)
    for step in range(args.warmup_steps + args.steps):
        logits = torch.randn(args.batch_size, args.vocab_size, generator=rng).to(torch.bfloat16)
        _, t_update = _timed(lambda: runner._update_states(so))
        req_ids = list(so.num_scheduled_tokens)
        t_inputs = 0.0
        sampler.seconds = 0.0
        if on_hpu:
            rows = dict(enumerate(req_ids))
            _, t_sample = _timed(lambda: half._sample_bucket(logits, rows))
        else:
            _, t_inputs = _timed(lambda: runner._prepare_inputs(so))
            _, t_sample = _timed(lambda: half._sample(logits, req_ids))
        if step >= args.warmup_steps:
            for name, t in (("update", t_update), ("inputs", t_inputs),
                            ("metadata", t_sample - sampler.seconds),
                            ("sampler", sampler.seconds)):
                times[name].append(t)
        so = _next_step(runner)
    result = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
    totals = [sum(parts) for parts in zip(*times.values())]
    result["total"] = statistics.median(totals) * 1e3
    result["platform"] = "hpu" if on_hpu else "cpu"
    return result


def main() -> None:
    args = build_parser().parse_args()
    torch.set_num_threads(args.threads)
    r = run(args)
    print(f"host time per decode step ({r['platform']}, {args.mix}, batch {args.batch_size}, "
          f"{args.prompt_len}+{args.output_len} tokens, vocab {args.vocab_size}, "
          f"median of {args.steps}, {args.threads} thread(s)): total {r['total']:.2f} ms = "
          f"update {r['update']:.2f} + inputs {r['inputs']:.2f} + metadata "
          f"{r['metadata']:.2f} + sampler {r['sampler']:.2f}")


if __name__ == "__main__":
    main()
