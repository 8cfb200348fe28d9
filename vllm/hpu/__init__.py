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
| mixture_of_experts | torch.ops.hpu.mixture_of_experts | all experts, routing-weighted (vllm/hpu/moe.py) |
| metric_localcontext(name) | hpu.metrics | graph_compilation counts `record_compile` |
| hpu_ops.cast_to_fp8_v2, fp8_gemm_v2, cast_from_fp8, convert_from_uint4 | torch.ops.hpu.* | float8-cast emulation (fp8_ops.py) |

`record_compile` / `compile_count` (compile accounting) and `track_alloc` /
`track_free` (fake memory ledger) are ours in both modes. The mode is fixed at
import time; `is_fake_hpu()` tells which one is active.
"""
from __future__ import annotations

import importlib.util

from vllm import envs
from vllm.hpu.compile_stats import compile_count, record_compile, reset_compile_stats
from vllm.hpu.memory import reset_tracked_memory, track_alloc, track_free, tracked_bytes


def _want_fake() -> bool:
    return envs.VLLM_USE_FAKE_HPU or importlib.util.find_spec("habana_frameworks") is None


_FAKE = _want_fake()

if _FAKE:
    from vllm.hpu.fake_device import (current_device, device_count, is_lazy, mark_step,
                                      mark_step_count, mem_get_info, metric_localcontext,
                                      set_device, synchronize)
    from vllm.hpu.fake_graphs import graph_stats, wrap_in_hpu_graph
    from vllm.hpu.fake_kernels import (FusedRMSNorm, FusedSDPA, RotaryPosEmbeddingMode,
                                       apply_rotary_pos_emb)
    from vllm.hpu.moe import fake_mixture_of_experts as mixture_of_experts
    from vllm.hpu import fp8_ops as hpu_ops
else:  # pragma: no cover - needs a Gaudi image
    from vllm.hpu.real import (FusedRMSNorm, FusedSDPA, RotaryPosEmbeddingMode,
                               apply_rotary_pos_emb, current_device, device_count,
                               is_lazy, mark_step, mem_get_info, metric_localcontext,
                               set_device, synchronize, wrap_in_hpu_graph)
    from vllm.hpu.moe import real_mixture_of_experts as mixture_of_experts

    import torch as _torch
    hpu_ops = _torch.ops.hpu  # the real fp8 / int4 ops, loaded with habana_frameworks

    def graph_stats(module):  # type: ignore[no-redef]
        raise ValueError("graph_stats is only kept by the fake HPU graph recorder.")

    def mark_step_count() -> int:  # type: ignore[no-redef]
        raise ValueError("mark_step_count is only kept by the fake HPU.")


def is_fake_hpu() -> bool:
    """True when the stand-ins are active (tensors then live on the CPU)."""
    return _FAKE


def torch_device_type() -> str:
    """Device type for torch tensors: 'cpu' on the fake HPU, 'hpu' on Gaudi."""
    return "cpu" if _FAKE else "hpu"


__all__ = [
    "FusedRMSNorm", "FusedSDPA", "hpu_ops", "RotaryPosEmbeddingMode", "apply_rotary_pos_emb",
    "compile_count", "current_device", "device_count", "graph_stats", "is_fake_hpu",
    "is_lazy", "mark_step", "mark_step_count", "mem_get_info", "metric_localcontext",
    "mixture_of_experts", "record_compile", "reset_compile_stats", "reset_tracked_memory",
    "set_device", "synchronize", "torch_device_type", "track_alloc", "track_free",
    "tracked_bytes", "wrap_in_hpu_graph",
]
