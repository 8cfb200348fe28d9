"""Choose the fastest bf16 CPU GEMM for each weight shape and row count, by measurement.

Which kernel wins depends on the CPU and on the number of rows, and a choice tuned on
one machine is a regression on another: on an AMD EPYC with AVX512-BF16 (no AMX) the
native VNNI kernel (vllm/cpu) beats oneDNN at every size, while on a Xeon with
AMX-BF16 oneDNN's AMX kernel is 2-3x faster than it once a matmul has 16+ rows, and the
native kernel still wins at 1-4 rows (memory-bound decode). So at start-up each distinct
weight shape `[N, K]` is timed with every candidate at a few row counts (`ROW_BUCKETS`),
and each call then goes to the winner for its row count.

Candidates: `native` (vllm/cpu's packed GEMM: bf16 dot products on AVX512-BF16
CPUs, bf16 weights widened to float32 in registers on AVX2 CPUs), `onednn`
(`torch.ops.mkldnn` on a weight reordered once; only where oneDNN has a bf16 kernel,
which needs AVX512-BW/VL/DQ or AVX-NE-CONVERT: on AVX2-only CPUs its reorder raises),
`amx` (the same packed weight through AMX tiles, `tdpbf16ps`, on CPUs that have them and
weights whose K is a multiple of 32: no second copy of the weight; on a 2-core Xeon it
streams the weights of 16-row decode steps at about 1.5x oneDNN's speed, while oneDNN
still wins from 64 rows up), `fp32` (`F.linear` in float32 on a float32 copy of the weight: on AVX2-only CPUs
torch's bf16 matmul falls back to a scalar loop, 20-50x slower than float32 from 16
rows up) and `torch` (`F.linear` on the plain weight: no copy, the fallback). Results are cached per CPU model, thread count, torch
version and kernel library under `$VLLM_CACHE_ROOT/gemm/` (autotune.py), so only the
first start on a machine pays the measurement (a second or two for a small model).
`VLLM_CPU_NATIVE_GEMM=1` / `0` force native / oneDNN instead of measuring.
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
import torch.nn.functional as F

from vllm import envs
from vllm.cpu import autotune, cpu_ops, loader

logger = logging.getLogger(__name__)

NATIVE, AMX, ONEDNN, FP32, TORCH = "native", "amx", "onednn", "fp32", "torch"
SHARED_LAYOUT = {AMX: NATIVE}
"""Kinds that run on another kind's pack (the same tensor serves both)."""
ROW_BUCKETS = (1, 4, 16, 64, 256, 2048)
"""Row counts that are timed; a call with r rows uses the bucket of `ROW_UPPER`. The
last one stands for prompt chunks (every step of more than 512 rows: prompts of up to
`max_num_batched_tokens`, 2048-8192), timed at 2048 rows: there the kernel that wins at
a few hundred rows can lose by 1.7x (AMX tiles against oneDNN on a 2-core Xeon: at 1024
rows the two were within noise of each other, at 2048 and 4096 oneDNN ran 1.7-2x
faster, and a 16 x 256-token prefill step went from ~1.0 s to ~0.8 s)."""
ROW_UPPER = (2, 8, 32, 128, 512)
"""Inclusive upper row bound of each bucket but the last (the native fused layer reads
them too: fused_decode.py)."""
_TRIALS = 5
_MIN_SAMPLE_S = 2e-3
_NATIVE_MARGIN = 1.5
"""At decode-sized row counts (every bucket but the last) the native kinds (dot products
or AMX on the native pack) win unless another kind is this much faster: a decode step
runs as one native call per layer (fused_decode.py) only where every projection's kind
is native. On a 2-core AMX Xeon, 64-row decode steps took ~85 ms fused against 110-120
ms through the modules, while oneDNN's GEMMs there were only ~15% faster than AMX's.
The last bucket (prompt chunks, never a fused step) takes the fastest kind."""
_PRUNE = 4.0
"""A kind this many times slower than the best at some row count is not timed at larger
ones (where it only falls further behind: timing a dot-product kernel on a 2048-row LM
head would take seconds)."""


@dataclass(frozen=True)
class GemmPlan:
    """The kernel for each row bucket of one weight shape."""
    kinds: tuple[str, ...]

    def kind_for(self, rows: int) -> str:
        return self.kinds[bisect.bisect_left(ROW_UPPER, rows)]

    def mask_of(self, kind: str) -> int:
        """Bit b set: row bucket b runs `kind`."""
        return sum(1 << b for b, k in enumerate(self.kinds) if k == kind)

    @property
    def needed(self) -> frozenset[str]:
        return frozenset(self.kinds)


def forced_kind() -> Optional[str]:
    """The kernel VLLM_CPU_NATIVE_GEMM forces (native for 1/true, oneDNN for 0/false),
    None when unset or 'auto' (measure). VLLM_BATCH_INVARIANT=1 forces the native
    kernel: it computes each output row alone, with one summation order whatever the
    row count, while the measured plan switches kernels (and oneDNN its blocking) with
    the number of rows, so a request's logits would depend on its neighbours."""
    value = envs.VLLM_CPU_NATIVE_GEMM
    if value is None:
        return NATIVE if envs.VLLM_BATCH_INVARIANT else None
    if envs.VLLM_BATCH_INVARIANT and not value:
        raise ValueError("VLLM_BATCH_INVARIANT=1 needs the native GEMM, whose results do "
                         "not depend on the row count; unset VLLM_CPU_NATIVE_GEMM=0.")
    return NATIVE if value else ONEDNN


def available_kinds() -> list[str]:
    kinds = [TORCH, FP32]
    if onednn_bf16_works():
        kinds.append(ONEDNN)
    if cpu_ops.gemm_supported():
        kinds.append(NATIVE)
        if cpu_ops.amx_gemm_supported():
            kinds.append(AMX)
    return kinds


def kinds_for_shape(kinds: list[str], shape: tuple[int, int]) -> list[str]:
    """The candidates that can run a [N, K] weight: AMX needs whole 32-wide k steps."""
    return [k for k in kinds if k != AMX or shape[1] % 32 == 0]


def onednn_bf16_works() -> bool:
    """Whether oneDNN's packed bf16 linear runs on this CPU (probed once on a tiny
    weight: torch raises on CPUs without the instructions its bf16 path needs)."""
    ok = _PROBED.get(ONEDNN)
    if ok is None:
        ok = False
        if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                             "_reorder_linear_weight"):
            try:
                w = torch.ones(16, 32, dtype=torch.bfloat16)
                run(ONEDNN, torch.ones(2, 32, dtype=torch.bfloat16), w, pack(ONEDNN, w), None)
                ok = True
            except RuntimeError as e:
                logger.info("oneDNN bf16 linear unavailable on this CPU: %s", e)
        _PROBED[ONEDNN] = ok
    return ok


_PROBED: dict[str, bool] = {}


def fallback_kind() -> str:
    """The kernel taken where a chosen one cannot be used (forced or unpackable):
    oneDNN, or where it has no bf16 kernel the float32 copy (torch's own bf16 matmul
    is a scalar loop on those CPUs)."""
    return ONEDNN if onednn_bf16_works() else FP32


def pack(kind: str, weight: torch.Tensor) -> Optional[torch.Tensor]:
    """The weight in `kind`'s layout (None for `torch`, which uses the plain weight)."""
    if kind == NATIVE:
        return cpu_ops.pack_bf16(weight)
    if kind == AMX:
        return cpu_ops.pack_bf16(weight) if weight.shape[1] % 32 == 0 else None
    if kind == ONEDNN:
        return torch.ops.mkldnn._reorder_linear_weight(weight)
    if kind == FP32:
        return weight.float().contiguous()
    return None


def run(kind: str, x: torch.Tensor, weight: torch.Tensor, packed: Optional[torch.Tensor],
        bias: Optional[torch.Tensor]) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for 2-D bf16 `x` through `kind`'s kernel."""
    if kind == NATIVE:
        return cpu_ops.gemm_bf16_packed(x, packed, weight.shape[0], bias)
    if kind == AMX:
        return cpu_ops.gemm_bf16_amx(x, packed, weight.shape[0], bias)
    if kind == ONEDNN:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    if kind == FP32:
        return F.linear(x.float(), packed, None if bias is None else bias.float()).to(x.dtype)
    return F.linear(x, weight, bias)


# ------------------------------------------------------------------ measurement
def _sample(fn: Callable[[], object], iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def measure(weight: torch.Tensor, kinds: list[str], rows: int) -> dict[str, list[float]]:
    """Seconds per call of each kind on `rows` random rows, one sample per interleaved
    trial, sorted (fastest first): the minimum is the estimate, since load from other
    processes only ever adds time."""
    x = torch.randn(rows, weight.shape[1]).to(torch.bfloat16)
    packs = {k: pack(k, weight) for k in kinds if k not in SHARED_LAYOUT}
    packs.update({k: packs.get(SHARED_LAYOUT[k]) for k in kinds if k in SHARED_LAYOUT})
    packs.update({k: pack(k, weight) for k in kinds if packs.get(k) is None})
    fns = {k: (lambda k=k: run(k, x, weight, packs[k], None)) for k in kinds}
    iters = {}
    for k, fn in fns.items():
        fn()
        once = max(_sample(fn, 1), 1e-6)
        iters[k] = max(1, min(100, int(_MIN_SAMPLE_S / once)))
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(_TRIALS):
        for k, fn in fns.items():
            samples[k].append(_sample(fn, iters[k]))
    return {k: sorted(v) for k, v in samples.items()}


def _winner(timings: dict[str, float], margin: float = _NATIVE_MARGIN) -> str:
    best = min(timings, key=timings.get)
    native = [k for k in (NATIVE, AMX) if k in timings]
    if best in native or not native:
        return best
    mine = min(native, key=timings.get)
    return mine if timings[mine] <= margin * timings[best] else best


def choose(weight: torch.Tensor, kinds: list[str]
           ) -> tuple[GemmPlan, list[dict], list[dict[str, list[float]]]]:
    """The plan for one weight shape, the timings behind it (best seconds per kind and
    row bucket) and the sorted samples (their steadiness decides the caching)."""
    measured, contenders = [], list(kinds)
    for rows in ROW_BUCKETS:
        samples = measure(weight, contenders, rows)
        measured.append(samples)
        best = min(v[0] for v in samples.values())
        contenders = [k for k in contenders if samples[k][0] <= _PRUNE * best]
    timings = [{k: v[0] for k, v in m.items()} for m in measured]
    last = len(timings) - 1
    plan = GemmPlan(tuple(_winner(t, 1.0 if b == last else _NATIVE_MARGIN)
                          for b, t in enumerate(timings)))
    return plan, timings, measured


# ------------------------------------------------------------------ cache
def cache_path(kinds: list[str]) -> Path:
    """One JSON file per machine setup: CPU model, thread count, torch, kernel source."""
    src = (hashlib.sha256(loader.SOURCE.read_bytes()).hexdigest()[:16]
           if NATIVE in kinds or AMX in kinds else "")
    return autotune.cache_path("gemm", "plans",
                               [",".join(kinds), src, ",".join(map(str, ROW_BUCKETS)),
                                f"margin={_NATIVE_MARGIN}"])


def plan_shapes(weights: dict[tuple[int, int], torch.Tensor]) -> dict[tuple[int, int], GemmPlan]:
    """A plan for each weight shape, from the cache or measured now (then cached)."""
    forced = forced_kind()
    kinds = available_kinds()
    if forced is not None:
        kind = forced if forced in kinds else fallback_kind()
        if kind != NATIVE and envs.VLLM_BATCH_INVARIANT:
            kind = TORCH  # torch's GEMM in fixed row tiles (kernels.torch_linear)
            logger.warning("VLLM_BATCH_INVARIANT=1: this CPU has no native bf16 GEMM "
                           "(AVX512-BF16 or AVX2 + FMA), so every linear layer runs "
                           "torch's GEMM in fixed 64-row tiles (slower).")
        return {s: GemmPlan((kind,) * len(ROW_BUCKETS)) for s in weights}
    path = cache_path(kinds)
    cached = autotune.load(path)
    plans, table, noisy = {}, [], []
    for shape, weight in weights.items():
        key = f"{shape[0]},{shape[1]}"
        entry = autotune.CachedChoice.from_json(cached.get(key))
        shape_kinds = kinds_for_shape(kinds, shape)
        if (entry is not None and len(entry.kinds) == len(ROW_BUCKETS)
                and all(k in shape_kinds for k in entry.kinds)):
            if not entry.needs_timing():
                plans[shape] = GemmPlan(entry.kinds)
                continue
        else:
            entry = None
        plan, timings, samples = autotune.measure_off_thread(
            lambda: choose(weight.detach(), shape_kinds), "vllm-gemm-autotune")
        table.append((shape, timings))
        chosen = autotune.keep_best(entry, plan.kinds, samples)
        cached[key] = chosen.to_json()
        plans[shape] = GemmPlan(chosen.kinds)
        if not chosen.steady:
            noisy.append(chosen.tries)
    if table:
        autotune.store(path, cached)
        _log_table(table, plans)
    if noisy:
        logger.warning("GEMM timings were unsteady (is the machine busy?): the steadiest "
                       "choice seen is cached and timed again at the next %d start(s) at "
                       "most (VLLM_CPU_RETUNE=1 times it again on request).",
                       max(0, autotune.MAX_TRIES - min(noisy)))
    return plans


def _log_table(table: list, plans: dict) -> None:
    lines = [f"GEMM kernel choice on {autotune.cpu_model()} ({autotune.timing_threads()} threads), "
             f"us per call at rows {ROW_BUCKETS}:"]
    for shape, timings in table:
        cells = []
        for rows, t in zip(ROW_BUCKETS, timings):
            cells.append(f"{rows}: " + " ".join(f"{k}={v * 1e6:.0f}" for k, v in sorted(t.items())))
        lines.append(f"  [{shape[0]}x{shape[1]}] -> {'/'.join(plans[shape].kinds)}  "
                     + " | ".join(cells))
    logger.debug("\n".join(lines))
    summary = {}
    for shape in plans:
        summary.setdefault("/".join(plans[shape].kinds), []).append(f"{shape[0]}x{shape[1]}")
    logger.info("GEMM kernels by row bucket %s (measured, cached): %s", ROW_BUCKETS,
                "; ".join(f"{k}: {', '.join(v)}" for k, v in summary.items()))
