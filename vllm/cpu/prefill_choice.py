"""Which kernel attends a CPU prefill, chosen by measurement at start-up.

Three ways can run a prompt (or a chunk of one) of the torch_sdpa backend with the
native kernels loaded, and which is fastest depends on the CPU and the length:

- `rowwise`: the paged decode kernel, one query row per token against its own prefix
  (cpu_ops.decode_attention). No fixed costs, and on AVX512-BF16 CPUs its dot products
  are bf16 instructions, but every row re-reads its whole prefix: quadratic reads.
- `flash`: the blocked prefill kernel (prefill_ops.cpp): tiles of query rows against
  tiles of keys read once per tile from the paged cache, one call for all prefills.
- `sdpa`: torch's `scaled_dot_product_attention`, one call per sequence (after
  gathering the context when there is one).

On a 2-core AVX2 EPYC (SmolLM2's 9 query / 3 KV heads of 64, bf16, 1 thread, CPU time
of a shared machine): at 32 tokens rowwise 0.12 ms, flash 0.10, sdpa 0.10; at 128
tokens 1.60 / 0.54 / 0.86 ms; at 512 tokens 23.3 / 7.0 / 10.4 ms. On an AMX Xeon, where
flash runs on AMX tiles (bf16), 1 thread, loaded machine: 32 tokens 0.08 / 0.04 / 0.07
ms (rowwise / flash / sdpa), 128 tokens 0.52 / 0.18 / 0.29, 512 tokens 10.4 / 3.7 / 3.9.
So each start measures all three on one
synthetic sequence of the model's head layout at a few lengths (`LENGTHS`), interleaved,
best of `_TRIALS`, and a prefill then takes the winner of its length's bucket. The plan
is cached with the GEMM plans' cache (autotune.py), per CPU model, threads, torch and
kernel sources, so only a machine's first start pays the ~0.1-0.5 s of timing.
"""
from __future__ import annotations

import bisect
import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from vllm.cpu import autotune, cpu_ops, loader, prefill_ops

logger = logging.getLogger(__name__)

ROWWISE, FLASH, SDPA = "rowwise", "flash", "sdpa"
LENGTHS = (32, 128, 512)
"""Sequence lengths (context + new tokens) that are timed."""
_UPPER = [64, 256, 1024]  # inclusive upper bound of each bucket but the last
"""Past 1024 tokens the plan takes the faster of flash and sdpa at 512: rowwise re-reads
the prefix per row, and at 2048 tokens it was ~2x slower than SDPA."""
_TRIALS = 5
_BLOCK = 16
_MEASURED: dict[tuple[str, str], "PrefillPlan"] = {}
"""Plans measured by this process: engines started again in one process (tests,
benchmarks) do not time again, even when their timings were unsteady."""


@dataclass(frozen=True)
class PrefillPlan:
    """The kernel for each length bucket (`_UPPER`)."""
    kinds: tuple[str, ...]

    def kind_for(self, total_len: int) -> str:
        return self.kinds[bisect.bisect_left(_UPPER, total_len)]


def plan_from(timings: list[dict[str, list[float]]]) -> PrefillPlan:
    """Fastest kind per measured length, then the longest bucket without rowwise."""
    kinds = [min(t, key=lambda k: t[k][0]) for t in timings]
    last = {k: v for k, v in timings[-1].items() if k != ROWWISE}
    kinds.append(min(last, key=lambda k: last[k][0]))
    return PrefillPlan(tuple(kinds))


def candidates(kv_cache: torch.Tensor) -> list[str]:
    kinds = [SDPA]
    if cpu_ops.usable(kv_cache):
        kinds.append(ROWWISE)
    if prefill_ops.usable(kv_cache):
        kinds.append(FLASH)
    return kinds


def _runner(kind: str, length: int, hq: int, hkv: int, d: int,
            dtype: torch.dtype) -> Callable[[], None]:
    """One call of `kind` for a fresh sequence of `length` tokens (no context)."""
    from vllm.attention.backends.torch_sdpa import _sdpa
    g = torch.Generator().manual_seed(0)
    blocks = -(-length // _BLOCK)
    cache = torch.randn(2, hkv, blocks * _BLOCK, d, generator=g).to(dtype)
    q = torch.randn(length, hq * d, generator=g).to(dtype)
    out = torch.empty(length, hq * d, dtype=dtype)
    scale = d ** -0.5
    table = torch.arange(blocks, dtype=torch.int32)[None]
    if kind == FLASH:
        ints = [torch.tensor([v], dtype=torch.int32) for v in (0, length, 0)]
        return lambda: prefill_ops.prefill_attention(q, cache, table, *ints, hq, _BLOCK,
                                                     scale, out)
    if kind == ROWWISE:
        rows = table.expand(length, blocks).contiguous()
        lens = torch.arange(1, length + 1, dtype=torch.int32)
        return lambda: cpu_ops.decode_attention(q, cache, rows, lens, hq, _BLOCK, scale, out)
    k, v = cache[0], cache[1]
    return lambda: out.copy_(_sdpa(q.view(length, hq, d), k, v, None, scale, causal=True))


def measure(length: int, kinds: list[str], hq: int, hkv: int, d: int,
            dtype: torch.dtype) -> dict[str, list[float]]:
    """Seconds per call of each kind, trials interleaved across kinds, sorted (the
    minimum is the estimate: load from other processes only adds time)."""
    fns = {k: _runner(k, length, hq, hkv, d, dtype) for k in kinds}
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    for fn in fns.values():
        fn()
    for _ in range(_TRIALS):
        for k, fn in fns.items():
            start = time.perf_counter()
            fn()
            samples[k].append(time.perf_counter() - start)
    return {k: sorted(v) for k, v in samples.items()}


def _cache_path(kinds: list[str]) -> Path:
    sources = b"".join(p.read_bytes() for p in (loader.SOURCE, prefill_ops.SOURCE))
    return autotune.cache_path("attention", "prefill",
                               [",".join(kinds), hashlib.sha256(sources).hexdigest()[:16],
                                ",".join(map(str, LENGTHS))])


def choose_plan(hq: int, hkv: int, d: int, dtype: torch.dtype) -> Optional[PrefillPlan]:
    """The plan for this head layout: cached, or measured now on a short-lived thread
    (autotune.measure_off_thread: it leaves no OpenMP team on the calling thread). None
    without both native kernels: the runner keeps its fixed rule."""
    kinds = candidates(torch.empty(0, dtype=dtype))
    if ROWWISE not in kinds or FLASH not in kinds:
        return None
    key = f"{hq},{hkv},{d},{str(dtype).removeprefix('torch.')}"
    path = _cache_path(kinds)
    memo = _MEASURED.get((str(path), key))
    if memo is not None:  # this process measured it already
        return memo
    entry = autotune.CachedChoice.from_json(autotune.load(path).get(key))
    if entry is not None and not (len(entry.kinds) == len(_UPPER) + 1
                                  and set(entry.kinds) <= set(kinds)):
        entry = None
    if entry is not None and not entry.needs_timing():
        return PrefillPlan(entry.kinds)
    timings = autotune.measure_off_thread(
        lambda: [measure(n, kinds, hq, hkv, d, dtype) for n in LENGTHS],
        "vllm-prefill-autotune")
    chosen = autotune.keep_best(entry, plan_from(timings).kinds, timings)
    plan = PrefillPlan(chosen.kinds)
    _MEASURED[(str(path), key)] = plan
    stored = autotune.load(path)
    stored[key] = chosen.to_json()
    autotune.store(path, stored)
    logger.info("Prefill attention by length bucket %s (measured, %s): %s; us per call: %s",
                LENGTHS, "steady" if chosen.steady else
                f"unsteady, try {chosen.tries} of {autotune.MAX_TRIES}",
                "/".join(plan.kinds),
                "; ".join(f"{n}: " + " ".join(f"{k}={v[0] * 1e6:.0f}"
                                              for k, v in sorted(t.items()))
                          for n, t in zip(LENGTHS, timings)))
    return plan
