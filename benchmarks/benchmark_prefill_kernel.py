"""One layer's prefill attention, each CPU kernel on the same prompt (issue 33's table in
benchmarks/README.md).

Kinds: `flash-f32` (the blocked prefill kernel on float32 FMAs), `flash-dot` (on
AVX512-BF16 dot products) and `flash-amx` (on AMX tiles), each where the library has
that path (bf16, head size a multiple of 32), `rowwise` (the
paged decode kernel, one query row per token against its prefix) and `sdpa` (torch's
scaled_dot_product_attention). One fresh sequence per length (no context), SmolLM2-135M's
heads by default. Repetitions interleave the kinds (A B C D, A B C D, ...) so that load
from other processes falls on all of them alike; medians are printed with the load
average before and after.
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
import statistics
import time
from typing import Callable, Optional

import torch

BLOCK = 16


def runners(length: int, hq: int, hkv: int, d: int, dtype: torch.dtype,
            out: Optional[torch.Tensor] = None) -> dict[str, Callable[[], None]]:
    """A call per kind for one fresh sequence of `length` tokens, each writing `out`
    ([length, hq * d], new when None)."""
    from vllm.attention.backends.torch_sdpa import _sdpa
    from vllm.cpu import cpu_ops, prefill_ops
    g = torch.Generator().manual_seed(0)
    blocks = -(-length // BLOCK)
    cache = torch.randn(2, hkv, blocks * BLOCK, d, generator=g).to(dtype)
    q = torch.randn(length, hq * d, generator=g).to(dtype)
    out = torch.empty(length, hq * d, dtype=dtype) if out is None else out
    scale = d ** -0.5
    table = torch.arange(blocks, dtype=torch.int32)[None]
    ints = [torch.tensor([v], dtype=torch.int32) for v in (0, length, 0)]
    rows = table.expand(length, blocks).contiguous()
    lens = torch.arange(1, length + 1, dtype=torch.int32)

    def flash(kernel: int) -> Callable[[], None]:
        return lambda: prefill_ops.prefill_attention(q, cache, table, *ints, hq, BLOCK, scale,
                                                     out, kernel)

    fns = {"flash-f32": flash(prefill_ops.FMA)}
    if dtype == torch.bfloat16 and d % 32 == 0:
        for name, kernel in (("flash-dot", prefill_ops.DOT), ("flash-amx", prefill_ops.AMX)):
            if prefill_ops.best_bf16_kernel() >= kernel:
                fns[name] = flash(kernel)
    fns["rowwise"] = lambda: cpu_ops.decode_attention(q, cache, rows, lens, hq, BLOCK, scale,
                                                      out)
    fns["sdpa"] = lambda: out.copy_(_sdpa(q.view(length, hq, d), cache[0], cache[1], None,
                                          scale, causal=True))
    return fns


def time_interleaved(fns: dict[str, Callable[[], None]], reps: int,
                     calls: int) -> dict[str, float]:
    """Median over `reps` interleaved rounds of the mean seconds of `calls` calls."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(reps):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls)
    return {k: statistics.median(v) for k, v in samples.items()}


def main(args: argparse.Namespace) -> None:
    dtype = getattr(torch, args.dtype)
    print(f"load average before: {os.getloadavg()}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for length in args.lengths:
            fns = runners(length, args.num_heads, args.num_kv_heads, args.head_size, dtype)
            calls = max(1, args.min_tokens // length)
            med = time_interleaved(fns, args.reps, calls)
            cells = "  ".join(f"{k} {v * 1e6:8.1f} us" for k, v in med.items())
            print(f"threads {threads} len {length:5d}: {cells}", flush=True)
    print(f"load average after: {os.getloadavg()}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Prefill attention kernels, one layer.")
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--num-heads", type=int, default=9)
    parser.add_argument("--num-kv-heads", type=int, default=3)
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--min-tokens", type=int, default=512,
                        help="calls per sample: this many tokens / the length, at least 1")
    return parser


if __name__ == "__main__":
    main(build_parser().parse_args())
