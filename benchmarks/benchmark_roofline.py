"""CPU roofline: each decode step against memory bandwidth, each prefill step against
the bf16 GEMM peak, both measured in this process (issue 53, item 2).

1. Probes, run on the engine's step thread (its thread count, its OpenMP pool):
   - bandwidth: a STREAM triad `a = b + s * c` on float32 arrays well above the last-
     level cache, best of several runs, counted as STREAM does (3 arrays moved; the
     write-allocate read of `a` is not counted, so the figure is STREAM's own);
   - bf16 GEMM peak: square bf16 products through the engine's linear-layer path
     (`vllm.cpu.gemm.linear` on a weight packed by the engine's measured plan), at
     the prompt-chunk row count; the kernel it chose is reported.
2. The engine (`vllm.LLM`, greedy, EOS ignored) at each batch size: wall time of every
   `EngineCore.step` (the engine keeps no per-step timing of its own), split into
   prefill steps and full-batch decode steps. The triad runs again right before and
   right after each batch size (this VM's bandwidth moves between phases minutes
   apart), and each batch is held against the faster of those two.
3. Accounting from the model config (`ModelBytes`): a decode step reads every linear
   weight once (LM head included, the embedding table not: it is only gathered) plus
   the KV of every context token of every request; a prefill step computes 2 FLOPs
   per weight per prompt token, causal attention, and logits only for the prompts it
   completes (as the runner does). Shares: of the bandwidth roofline (bytes per
   step / step time against the triad), of the GEMM peak, and of the roofline
   itself (the longer of the two times over the step time: at batch 16 on a fast
   2-core machine the FLOPs at the peak take as long as the bytes at the bandwidth).

The engine's `--enable-mfu-metrics` estimate (vllm/engine/perf_metrics.py) is not used
here: it counts the embedding table as read every step and logits for every prompt
token, which is right for its purpose (a comparable counter) but not for a roofline.
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
import datetime
import json
import statistics
import time
from typing import Any, Callable, Optional

import numpy as np
import torch


# ------------------------------------------------------------------ probes
def triad_bandwidth(num_elements: int, runs: int = 5, allocations: int = 3) -> float:
    """STREAM triad bytes per second, best of `runs` on each of `allocations` fresh
    sets of arrays: 3 float32 arrays moved per element. Fresh arrays because the
    figure depended on where the arrays landed (on a 2-core VM one set ran at ~50
    GB/s, the next at ~80). Each set is touched once first: page faults are not timed."""
    best = float("inf")
    for _ in range(allocations):
        b = torch.rand(num_elements, dtype=torch.float32)
        c = torch.rand(num_elements, dtype=torch.float32)
        a = torch.empty_like(b)
        torch.add(b, c, alpha=3.0, out=a)
        for _ in range(runs):
            start = time.perf_counter()
            torch.add(b, c, alpha=3.0, out=a)
            best = min(best, time.perf_counter() - start)
        del a, b, c
    return 3 * 4 * num_elements / best


class _Linear(torch.nn.Module):
    """A bare linear layer the engine's packing code accepts."""
    packable_weight = True

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)


def gemm_peak(size: int, rows: Optional[int] = None, runs: int = 3) -> tuple[float, str]:
    """bf16 FLOP/s (best of `runs`) of a [rows, size] x [size, size]^T product through
    the engine's linear path, and the kernel that ran it. Falls back to torch.matmul
    where the engine's packing is unavailable (no oneDNN in this torch build)."""
    from vllm.cpu import gemm
    rows = rows or size
    weight = (torch.randn(size, size) / size ** 0.5).to(torch.bfloat16)
    x = torch.randn(rows, size).to(torch.bfloat16)
    layer = _Linear(weight)
    if gemm.packing_supported(layer.weight):
        gemm.pack_linear_weights(layer)
        plan = gemm.plan_of(layer)
        kind = f"vllm.cpu.gemm.linear ({plan.kind_for(rows)})"

        def fn():
            return gemm.linear(layer, x, layer.weight)
    else:
        kind = "torch.matmul"

        def fn():
            return torch.matmul(x, weight.t())
    fn()
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return 2.0 * rows * size * size / best, kind


def run_probes(triad_elements: int, gemm_size: int, gemm_rows: Optional[int],
               llm: Any = None) -> dict:
    """Both probes on the thread the engine's steps run on (its thread count and its
    OpenMP pool: probing from another thread left the engine's pool spinning on the
    same cores and cut the GEMM figure 30-fold on a 2-core machine)."""

    def measure() -> dict:
        with torch.inference_mode():
            bw = triad_bandwidth(triad_elements)
            flops, kind = gemm_peak(gemm_size, gemm_rows)
        return {"threads": torch.get_num_threads(), "triad_bytes_per_s": bw,
                "triad_mib": 3 * 4 * triad_elements / 2 ** 20,
                "gemm_flops_per_s": flops, "gemm_kernel": kind, "gemm_size": gemm_size,
                "gemm_rows": gemm_rows or gemm_size}
    return on_step_thread(llm, measure)


def on_step_thread(llm: Any, fn: Callable[[], Any]) -> Any:
    """fn() on the thread the engine's steps run on (the calling thread when the
    engine has no step thread of its own, or without an engine)."""
    step_thread = None
    if llm is not None:
        executor = llm.llm_engine.engine_core.executor
        step_thread = getattr(executor, "_step_thread", None)
        if getattr(executor, "worker", None) is None:
            raise SystemExit("benchmark_roofline.py needs the single-process executor.")
    return step_thread.submit(fn).result() if step_thread else fn()


def triad_next_to(llm: Any, triad_elements: int, run: Callable[[], dict]) -> dict:
    """run() with the triad measured right before and right after it: this VM's
    bandwidth moves between phases (~45 and ~75 GB/s here, minutes apart), so a step is
    held against the bandwidth of its own moment. The faster of the two is kept (the
    share is then the lower one)."""
    def triad() -> float:
        with torch.inference_mode():
            return triad_bandwidth(triad_elements, runs=3, allocations=2)
    before = on_step_thread(llm, triad)
    row = run()
    after = on_step_thread(llm, triad)
    row["triad_before_after"] = [before, after]
    row["triad_bytes_per_s"] = max(before, after)
    return row


# ------------------------------------------------------------------ accounting
@dataclasses.dataclass
class ModelBytes:
    """Per-step bytes and FLOPs of a dense decoder, from its HF config."""
    layer_params: int
    """Linear weights of all decoder layers (q, k, v, o, gate, up, down)."""
    lm_head_params: int
    norm_params: int
    kv_bytes_per_token: int
    """K and V of one token over all layers."""
    attn_flops_per_pair: int
    """QK^T and PV FLOPs of one (query, key) pair over all layers."""
    dtype_bytes: int = 2

    @classmethod
    def from_hf_config(cls, hf: Any, dtype_bytes: int = 2, kv_dtype_bytes: int = 2
                       ) -> "ModelBytes":
        text = getattr(hf, "text_config", None) or hf
        h, layers = text.hidden_size, text.num_hidden_layers
        heads = text.num_attention_heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        head_dim = getattr(text, "head_dim", None) or h // heads
        attn = h * head_dim * (2 * heads + 2 * kv_heads)
        mlp = 3 * h * text.intermediate_size
        return cls(layer_params=layers * (attn + mlp), lm_head_params=h * text.vocab_size,
                   norm_params=(2 * layers + 1) * h,
                   kv_bytes_per_token=2 * layers * kv_heads * head_dim * kv_dtype_bytes,
                   attn_flops_per_pair=4 * layers * heads * head_dim,
                   dtype_bytes=dtype_bytes)

    @property
    def weight_bytes(self) -> int:
        return self.dtype_bytes * (self.layer_params + self.lm_head_params + self.norm_params)

    def decode_bytes(self, context_lens: list[int]) -> int:
        """Bytes a decode step reads: the weights once, and the KV of every token each
        request attends to (its context, the new token's own included)."""
        return self.weight_bytes + self.kv_bytes_per_token * sum(context_lens)

    def decode_flops(self, context_lens: list[int]) -> float:
        """FLOPs of a decode step: one token per request, logits for each, attention
        over each context. At a few rows this, not the bytes, can bound the step."""
        n = len(context_lens)
        return (2.0 * (self.layer_params + self.lm_head_params) * n
                + self.attn_flops_per_pair * sum(context_lens))

    def prefill_flops(self, num_tokens: int, prompt_len: int) -> float:
        """FLOPs of a step computing `num_tokens` prompt tokens of fresh prompts of
        `prompt_len` tokens, first come first served: whole prompts, then the first
        chunk of the next. Logits only for the prompts the step completes."""
        whole, rest = divmod(num_tokens, prompt_len)
        pairs = whole * prompt_len * (prompt_len + 1) / 2 + rest * (rest + 1) / 2
        return (2.0 * self.layer_params * num_tokens + 2.0 * self.lm_head_params * whole
                + self.attn_flops_per_pair * pairs)


# ------------------------------------------------------------------ engine
class StepTimes:
    """Wall time of every engine step with its scheduled tokens and requests."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, int, int]] = []

    def __enter__(self) -> "StepTimes":
        from vllm.engine import core as core_mod
        self._real = real = core_mod.EngineCore.step
        steps = self.steps

        def step(engine):
            seen = []
            real_schedule = engine.scheduler.schedule

            def schedule():
                so = real_schedule()
                seen.append((so.total_num_scheduled_tokens, len(so.num_scheduled_tokens)))
                return so
            engine.scheduler.schedule = schedule
            start = time.perf_counter()
            try:
                return real(engine)
            finally:
                del engine.scheduler.schedule
                if seen and seen[0][0] > 0:
                    steps.append((time.perf_counter() - start, *seen[0]))
        core_mod.EngineCore.step = step
        return self

    def __exit__(self, *exc) -> None:
        from vllm.engine import core as core_mod
        core_mod.EngineCore.step = self._real


def run_batch(llm: Any, model: ModelBytes, batch: int, input_len: int, output_len: int,
              rng: np.random.Generator) -> dict:
    """One generate() of `batch` fresh random prompts; decode steps are the full-batch
    steps of one token per request, the prefill step the first step."""
    from vllm import SamplingParams
    prompts = [{"prompt_token_ids": rng.integers(100, 10000, input_len).tolist()}
               for _ in range(batch)]
    with StepTimes() as timer:
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=output_len,
                                             ignore_eos=True), use_tqdm=False)
    steps = timer.steps
    decode = [(i, s) for i, s in enumerate(steps) if s[1] == s[2] == batch]
    # The k-th decode step of a request writes its (input_len + k)-th token: context
    # = input_len + k tokens (the prefill step sampled the first output token).
    first = decode[0][0] if decode else 0
    contexts = [[input_len + (i - first) + 1] * batch for i, _ in decode]
    per_step = [(s[0], model.decode_bytes(c)) for (_, s), c in zip(decode, contexts)]
    decode_flops = statistics.mean(map(model.decode_flops, contexts)) if contexts else 0
    decode_s = statistics.median(t for t, _ in per_step) if per_step else float("nan")
    decode_bytes = statistics.mean(b for _, b in per_step) if per_step else 0
    prefill_s, prefill_tokens, _ = steps[0]
    return {"batch": batch, "input_len": input_len, "output_len": output_len,
            "decode_steps": len(decode), "decode_step_ms": 1e3 * decode_s,
            "decode_bytes_per_step": decode_bytes,
            "decode_gb_per_s": decode_bytes / decode_s / 1e9,
            "decode_flops_per_step": decode_flops,
            "decode_tflop_per_s": decode_flops / decode_s / 1e12,
            "prefill_tokens": prefill_tokens, "prefill_step_ms": 1e3 * prefill_s,
            "prefill_flops": model.prefill_flops(prefill_tokens, input_len),
            "prefill_tflop_per_s": model.prefill_flops(prefill_tokens, input_len)
            / prefill_s / 1e12}


# ------------------------------------------------------------------ report
def machine() -> dict:
    """lscpu's model name and the load average, recorded with every result."""
    from benchmarks.compare_vllm_cpu import cpu_model_name
    return {"cpu": cpu_model_name(), "load_avg": list(os.getloadavg()),
            "date": datetime.date.today().isoformat()}


def add_shares(result: dict) -> dict:
    """Each row's shares: decode against the bandwidth (the triad measured next to the
    row where there is one), against the GEMM peak, and against the roofline itself,
    max(bytes / bandwidth, FLOPs / peak): a batch whose FLOPs take longer at the peak
    than its bytes at the bandwidth is bound by compute, and its bandwidth share alone
    could never reach 100%."""
    probes = result["probes"]
    for row in result["batches"]:
        bw = row.get("triad_bytes_per_s", probes["triad_bytes_per_s"])
        row["bw_roofline_share"] = row["decode_gb_per_s"] * 1e9 / bw
        row["decode_gemm_peak_share"] = (row["decode_tflop_per_s"] * 1e12
                                         / probes["gemm_flops_per_s"])
        row["roofline_share"] = max(row["bw_roofline_share"], row["decode_gemm_peak_share"])
        row["gemm_peak_share"] = (row["prefill_tflop_per_s"] * 1e12
                                  / probes["gemm_flops_per_s"])
    return result


def print_report(r: dict) -> None:
    p, m = r["probes"], r["machine"]
    print(f"CPU: {m['cpu']}; load average {' '.join(f'{x:.2f}' for x in m['load_avg'])} "
          f"(before) / {' '.join(f'{x:.2f}' for x in r['load_avg_after'])} (after); "
          f"{p['threads']} threads")
    print(f"triad bandwidth {p['triad_bytes_per_s'] / 1e9:.1f} GB/s ({p['triad_mib']:.0f} MiB "
          f"moved); bf16 GEMM peak {p['gemm_flops_per_s'] / 1e12:.3f} TFLOP/s "
          f"({p['gemm_rows']}x{p['gemm_size']}x{p['gemm_size']}, {p['gemm_kernel']})")
    print(f"model weights read per step {r['weight_bytes'] / 1e6:.1f} MB")
    print("| batch | decode step ms | MB read/step | GB/s | triad GB/s next to it "
          "| % of BW roofline | decode % of GEMM peak | % of roofline "
          "| prefill tokens | prefill step ms | GFLOP | TFLOP/s | % of GEMM peak |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for b in r["batches"]:
        triads = b.get("triad_before_after", [p["triad_bytes_per_s"]] * 2)
        print(f"| {b['batch']} | {b['decode_step_ms']:.2f} | {b['decode_bytes_per_step'] / 1e6:.1f} "
              f"| {b['decode_gb_per_s']:.2f} | {triads[0] / 1e9:.0f} / {triads[1] / 1e9:.0f} "
              f"| {100 * b['bw_roofline_share']:.0f}% "
              f"| {100 * b['decode_gemm_peak_share']:.0f}% | {100 * b['roofline_share']:.0f}% "
              f"| {b['prefill_tokens']} | {b['prefill_step_ms']:.1f} "
              f"| {b['prefill_flops'] / 1e9:.1f} | {b['prefill_tflop_per_s']:.3f} "
              f"| {100 * b['gemm_peak_share']:.0f}% |")


def main(args: argparse.Namespace) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs

    start_machine = machine()
    llm = LLM(**dataclasses.asdict(EngineArgs.from_cli_args(args)))
    model = ModelBytes.from_hf_config(llm.llm_engine.model_config.hf_config)
    probes = run_probes(args.triad_mib * 2 ** 20 // 12, args.gemm_size, args.gemm_rows, llm)
    rng = np.random.default_rng(args.seed or 0)
    llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2),
                 use_tqdm=False)  # warm-up
    triad_elements = args.triad_mib * 2 ** 20 // 12
    batches = [triad_next_to(llm, triad_elements,
                             lambda b=b: run_batch(llm, model, b, args.input_len,
                                                   args.output_len, rng))
               for b in args.batch_sizes]
    result = add_shares({"machine": start_machine, "load_avg_after": list(os.getloadavg()),
                         "model": args.model, "probes": probes,
                         "weight_bytes": model.weight_bytes, "batches": batches})
    print_report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


def build_parser() -> argparse.ArgumentParser:
    from vllm.engine.arg_utils import EngineArgs
    parser = argparse.ArgumentParser(description="CPU roofline of decode and prefill steps.")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--triad-mib", type=int, default=768,
                        help="bytes the triad moves per run (3 arrays), well above the LLC")
    parser.add_argument("--gemm-size", type=int, default=2048)
    parser.add_argument("--gemm-rows", type=int, default=None,
                        help="rows of the GEMM probe (default: --gemm-size, square)")
    parser.add_argument("--json", type=str, default=None, help="write the result here")
    EngineArgs.add_cli_args(parser)
    return parser


if __name__ == "__main__":
    main(build_parser().parse_args())
