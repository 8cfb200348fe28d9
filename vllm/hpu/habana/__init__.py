"""One import for everything the HPU path needs from `habana_frameworks.torch`.

On a Gaudi image (habana_frameworks importable, VLLM_USE_FAKE_HPU unset) the names
below are the real ones. Otherwise (VLLM_USE_FAKE_HPU=1, or no habana_frameworks)
they are plain-torch stand-ins that run on the CPU, so the whole HPU backend can
be exercised and tested off hardware:

| name | real | fake |
|---|---|---|
| mark_step() | htcore.mark_step | counted no-op (ops run eagerly; `mark_step_count()`) |
| is_lazy() | utils.internal.is_lazy | PT_HPU_LAZY_MODE == 1 |
| wrap_in_hpu_graph(m, ...) | hpu.wrap_in_hpu_graph | counts captures/replays per signature |
| synchronize() | torch.hpu.synchronize | no-op |
| set_device(), current_device(), device_count() | torch.hpu.* | VLLM_FAKE_HPU_DEVICE_COUNT devices, one current per process |
| mem_get_info() | torch.hpu.mem_get_info | the current device's VLLM_FAKE_HPU_MEMORY_GB minus `track_alloc`ed bytes |
| FusedSDPA, FusedRMSNorm, apply_rotary_pos_emb | hpex kernels | torch equivalents |
| mixture_of_experts | torch.ops.hpu.mixture_of_experts | all experts, routing-weighted (vllm/hpu/habana/moe.py) |
| metric_localcontext(name) | hpu.metrics | graph_compilation counts `record_compile` |
| hpu_ops.cast_to_fp8_v2, fp8_gemm_v2, cast_from_fp8, convert_from_uint4 | torch.ops.hpu.* | float8-cast emulation (fp8_ops.py) |
| compile_backend() | "hpu_backend" (Gaudi's dynamo backend) | `fake_hpu_backend`: eager, keeps each graph's output specs (fake_compile.py) |
| warmup_regions() | no-op context | `shape_only_regions()`: compiled regions trace and guard but skip the math |

This module is the one seam: nothing outside `vllm/hpu/habana/` imports `real.py` or a
`fake_*.py` module (tests/test_import_rules.py checks it), so the backend above it is
the same code on Gaudi and off it.

`record_compile` / `compile_count` (compile accounting) and `track_alloc` /
`track_free` (fake memory ledger) are ours in both modes. The mode is fixed at
import time; `is_fake_hpu()` tells which one is active.
"""
from __future__ import annotations

import contextlib
import importlib.util
from typing import Any, ContextManager

from vllm import envs
from vllm.hpu.habana.compile_stats import compile_count, record_compile, reset_compile_stats
from vllm.hpu.habana.memory import reset_tracked_memory, track_alloc, track_free, tracked_bytes


def _want_fake() -> bool:
    return envs.VLLM_USE_FAKE_HPU or importlib.util.find_spec("habana_frameworks") is None


_FAKE = _want_fake()

if _FAKE:
    from vllm.hpu.habana.fake_device import (current_device, device_count, is_lazy, mark_step,
                                      mark_step_count, mem_get_info, metric_localcontext,
                                      set_device, synchronize)
    from vllm.hpu.habana.fake_graphs import graph_stats, wrap_in_hpu_graph
    from vllm.hpu.habana.fake_kernels import (FusedRMSNorm, FusedSDPA, RotaryPosEmbeddingMode,
                                       apply_rotary_pos_emb)
    from vllm.hpu.habana.moe import fake_mixture_of_experts as mixture_of_experts
    from vllm.hpu.habana import fp8_ops as hpu_ops
    from vllm.hpu.habana.fake_compile import fake_hpu_backend, shape_only_regions

    def compile_backend() -> Any:
        """The dynamo backend HPU regions compile with (see the table above)."""
        return fake_hpu_backend

    def release_hpu_graphs(module: Any) -> None:
        """Free the graphs `wrap_in_hpu_graph(module)` captured (their memory leaves
        the fake ledger); the caller then drops the module."""
        graph_stats(module).release()

    def warmup_regions() -> ContextManager[None]:
        """Wraps torch.compile warmup passes (see the table above)."""
        return shape_only_regions()
else:  # pragma: no cover - needs a Gaudi image
    from vllm.hpu.habana.real import (FusedRMSNorm, FusedSDPA, RotaryPosEmbeddingMode,
                               apply_rotary_pos_emb, current_device, device_count,
                               is_lazy, mark_step, mem_get_info, metric_localcontext,
                               set_device, synchronize, wrap_in_hpu_graph)
    from vllm.hpu.habana.moe import real_mixture_of_experts as mixture_of_experts

    import torch as _torch
    hpu_ops = _torch.ops.hpu  # the real fp8 / int4 ops, loaded with habana_frameworks

    def graph_stats(module):  # type: ignore[no-redef]
        raise ValueError("graph_stats is only kept by the fake HPU graph recorder.")

    def mark_step_count() -> int:  # type: ignore[no-redef]
        raise ValueError("mark_step_count is only kept by the fake HPU.")

    def compile_backend() -> Any:  # type: ignore[no-redef]
        return "hpu_backend"

    def release_hpu_graphs(module: Any) -> None:  # type: ignore[no-redef]
        """On Gaudi a wrapped module's graphs are freed with the module: the caller
        drops its references (and the collector runs)."""
        import gc
        gc.collect()

    def warmup_regions() -> ContextManager[None]:  # type: ignore[no-redef]
        return contextlib.nullcontext()


def is_fake_hpu() -> bool:
    """True when the stand-ins are active (tensors then live on the CPU)."""
    return _FAKE


def torch_device_type() -> str:
    """Device type for torch tensors: 'cpu' on the fake HPU, 'hpu' on Gaudi."""
    return "cpu" if _FAKE else "hpu"


__all__ = [
    "FusedRMSNorm", "FusedSDPA", "compile_backend", "hpu_ops", "RotaryPosEmbeddingMode", "apply_rotary_pos_emb",
    "compile_count", "current_device", "device_count", "graph_stats", "is_fake_hpu",
    "is_lazy", "mark_step", "mark_step_count", "mem_get_info", "metric_localcontext",
    "mixture_of_experts", "record_compile", "release_hpu_graphs", "reset_compile_stats", "reset_tracked_memory",
    "set_device", "synchronize", "torch_device_type", "track_alloc", "track_free",
    "tracked_bytes", "warmup_regions", "wrap_in_hpu_graph",
]
