"""--cpu-offload-gb: decoder layers whose weights live in host memory.

vLLM's flag: up to `cpu_offload_gb` GiB of the model's weights (per device) stay in
host memory and reach the device for each forward, as their layer runs. It grows
the device memory the KV cache can use, at the cost of one host-to-device copy of
those weights per forward.

How, here:
- whole decoder layers are offloaded, from the first layer of this rank's stack
  forwards (vLLM's order, so the same layers stay on the device for the same
  setting), each one that still fits in the budget; the embedding, the final norm
  and the LM head stay on the device (they run once per pass, not per layer);
- the offloaded layers of one parameter layout share one set of device tensors, the
  *staging copy*: the first offloaded layer's own tensors. Every offloaded layer's
  parameters point at it (`param.data`), and a forward pre-hook copies the layer's
  host tensors into it just before the layer runs. The other layers' device tensors
  are freed: the device keeps `offloaded - staging` bytes fewer;
- parameter objects, their shapes and their device addresses never change, so an
  HPU graph or a CUDA graph records the copy as an ordinary in-place op at a fixed
  address, torch.compile's regions see the same inputs, and nothing recompiles.
  (Host tensors are pinned where a device exists, so the copies can be captured.)

Not for a CPU device (the weights are in host memory already: refused by the CPU
platform), nor with sleep mode or in-place weight updates (both rewrite parameter
storage that offloaded layers share; refused in VllmConfig).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

logger = logging.getLogger(__name__)

_GIB = 1 << 30


@dataclass
class CpuOffload:
    """What `offload_layers` did to one rank's model."""
    layers: list[int] = field(default_factory=list)
    """Indices (in the decoder stack) of the offloaded layers."""
    num_layers: int = 0
    """Decoder layers of this rank."""
    host_bytes: int = 0
    """Weight bytes kept in host memory (the offloaded layers)."""
    staging_bytes: int = 0
    """Device bytes of the staging copies (one layer per parameter layout)."""
    freed_params: list[nn.Parameter] = field(default_factory=list)
    """Parameters whose own device tensor was freed (they now share a staging copy):
    what device memory accounting must stop counting."""
    hooks: list = field(default_factory=list)

    @property
    def device_bytes_saved(self) -> int:
        return self.host_bytes - self.staging_bytes


def _param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def find_decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder stack: the `nn.ModuleList` holding the most parameter bytes (a
    vision tower's list is smaller than the language model's), this rank's layers only
    (another pipeline stage's are parameterless placeholders)."""
    best: Optional[nn.ModuleList] = None
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and (
                best is None or _param_bytes(module) > _param_bytes(best)):
            best = module
    if best is None:
        return []
    return [layer for layer in best if _param_bytes(layer) > 0]


def _layout(layer: nn.Module) -> tuple:
    return tuple((name, tuple(p.shape), p.dtype, tuple(p.stride()))
                 for name, p in layer.named_parameters())


def _host_copy(t: torch.Tensor, pin: bool) -> torch.Tensor:
    host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
    host.copy_(t.detach())
    return host


@torch._dynamo.disable
def _copy_in(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Eager even when the layer is a compiled region (one without attention: the HPU's
    torch.compile mode compiles such layers whole, hooks included): the copy is not
    traced into a graph that would keep the host tensors as its constants."""
    for staged, host in pairs:
        staged.copy_(host, non_blocking=True)


class _CopyIn:
    """Forward pre-hook: the layer's host tensors into the shared staging copy."""

    def __init__(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.pairs = pairs

    def __call__(self, module: nn.Module, args: tuple) -> None:
        _copy_in(self.pairs)


def offload_layers(model: nn.Module, cpu_offload_gb: float, device: torch.device,
                   pin_memory: Optional[bool] = None) -> CpuOffload:
    """Offload this rank's decoder layers within `cpu_offload_gb` GiB (module doc).

    `pin_memory` defaults to True unless `device` is the CPU (the fake HPU)."""
    result = CpuOffload()
    budget = int(cpu_offload_gb * _GIB)
    layers = find_decoder_layers(model)
    result.num_layers = len(layers)
    if budget <= 0 or not layers:
        return result
    pin = device.type != "cpu" if pin_memory is None else pin_memory
    inside = {id(p) for layer in layers for p in layer.parameters()}
    outside = {id(p) for p in model.parameters() if id(p) not in inside}
    chosen: list[int] = []
    left = budget
    for i, layer in enumerate(layers):
        nbytes = _param_bytes(layer)
        shared = any(id(p) in outside for p in layer.parameters())
        if nbytes <= left and not shared:
            chosen.append(i)
            left -= nbytes
    groups: dict[tuple, list[int]] = {}
    for i in chosen:
        groups.setdefault(_layout(layers[i]), []).append(i)
    for members in groups.values():
        if len(members) < 2:  # one layer would be its own staging copy: no gain
            continue
        staging = dict(layers[members[0]].named_parameters())
        result.staging_bytes += _param_bytes(layers[members[0]])
        for i in members:
            layer = layers[i]
            pairs = []
            for name, param in layer.named_parameters():
                host = _host_copy(param.data, pin)
                if param is not staging[name]:
                    param.data = staging[name].data
                    result.freed_params.append(param)
                pairs.append((staging[name].data, host))
            result.hooks.append(layer.register_forward_pre_hook(_CopyIn(pairs)))
            result.host_bytes += _param_bytes(layer)
            result.layers.append(i)
    result.layers.sort()
    _log(result, cpu_offload_gb)
    return result


def _log(result: CpuOffload, cpu_offload_gb: float) -> None:
    if not result.layers:
        logger.warning("cpu_offload_gb=%s offloads nothing: fewer than two decoder layers "
                       "of one layout fit in it (each offloaded layer shares one staging "
                       "copy on the device with the others).", cpu_offload_gb)
        return
    logger.info("CPU offload: decoder layers %s of %d (%.3f GiB) in host memory, copied to "
                "a %.3f GiB staging copy on the device before each runs; device weights "
                "%.3f GiB smaller.", _ranges(result.layers), result.num_layers,
                result.host_bytes / _GIB, result.staging_bytes / _GIB,
                result.device_bytes_saved / _GIB)


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts, start = [], None
    for j, i in enumerate(indices):
        if start is None:
            start = i
        if j + 1 == len(indices) or indices[j + 1] != i + 1:
            parts.append(str(start) if start == i else f"{start}-{i}")
            start = None
    return ", ".join(parts)
