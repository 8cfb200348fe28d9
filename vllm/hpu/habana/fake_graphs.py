"""A stand-in for `habana_frameworks.torch.hpu.wrap_in_hpu_graph` off hardware.

A real HPU graph is recorded once per input signature (shapes and dtypes of every
tensor argument, plus the values of every non-tensor argument) and replayed after
that. The stand-in runs the module eagerly every time but keeps the same books:
the first call with a signature is a "capture" (and a compile, see
`compile_stats`), later calls are "replays". That is what lets tests assert that
serving after warmup captures nothing new, and it makes the classic mistake
visible: a Python scalar that varies per step (a length, a count) is part of the
key, so every value is a new capture. So are the constants the module's layers
bake into a graph (graph_constants.py: e.g. fp8 scales passed as Python floats).

Memory model: a captured graph keeps static output buffers, so each capture adds
the bytes of its outputs to the fake device ledger (`memory.track_alloc`) until
`release()`; a capture whose buffers exceed the device's free memory raises
`torch.OutOfMemoryError`, as the real allocator fails. This lets the runner's
graph-memory budget, and its recovery from an out-of-memory capture, be exercised
off hardware.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Hashable, Optional

import torch
from torch import nn

from vllm.hpu.habana import compile_stats, fake_device, memory
from vllm.hpu.graph_keys import baked_constants, input_signature

logger = logging.getLogger(__name__)


def _output_bytes(out: Any) -> int:
    if isinstance(out, torch.Tensor):
        return out.numel() * out.element_size()
    if isinstance(out, (list, tuple)):
        return sum(_output_bytes(x) for x in out)
    if isinstance(out, dict):
        return sum(_output_bytes(x) for x in out.values())
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        return sum(_output_bytes(getattr(out, f.name)) for f in dataclasses.fields(out))
    return 0


def _check_fits(nbytes: int) -> None:
    free, total = fake_device.mem_get_info()
    if nbytes > free:
        raise torch.OutOfMemoryError(
            f"fake HPU out of memory: an HPU graph capture needs {nbytes} bytes, "
            f"{free} of {total} are free (VLLM_FAKE_HPU_MEMORY_GB)")


class FakeHPUGraphForward:
    """Replaces `module.forward`; counts captures and replays per input signature."""

    def __init__(self, forward: Callable[..., Any], disable_tensor_cache: bool,
                 module: Optional[nn.Module] = None) -> None:
        self._forward = forward
        self._module = module
        self.disable_tensor_cache = disable_tensor_cache
        self.signatures: dict[Hashable, int] = {}  # signature -> bytes held by the capture
        self.captures = 0
        self.replays = 0
        self.bypassed = 0

    def __call__(self, *args: Any, bypass_hpu_graphs: bool = False, **kwargs: Any) -> Any:
        if bypass_hpu_graphs:
            self.bypassed += 1
            return self._forward(*args, **kwargs)
        sig = input_signature((args, kwargs))
        if self._module is not None:
            sig = (sig, baked_constants(self._module))
        out = self._forward(*args, **kwargs)
        if sig in self.signatures:
            self.replays += 1
        else:
            nbytes = _output_bytes(out)
            _check_fits(nbytes)
            self.captures += 1
            compile_stats.record_compile(("hpu_graph", id(self), sig))
            self.signatures[sig] = memory.track_alloc(nbytes)
            logger.debug("fake HPU graph capture #%d", self.captures)
        return out

    def captured_bytes(self) -> int:
        return sum(self.signatures.values())

    def release(self) -> None:
        """Drop every captured graph (and its memory); later calls capture again."""
        for nbytes in self.signatures.values():
            memory.track_free(nbytes)
        self.signatures.clear()


def wrap_in_hpu_graph(module: nn.Module, disable_tensor_cache: bool = True) -> nn.Module:
    """Wrap `module.forward` in place, like the real API, and return the module.

    Call it as `module(*args, bypass_hpu_graphs=False, **kwargs)`; the books are in
    `module.forward` (a `FakeHPUGraphForward`), also reachable via `graph_stats`.
    """
    if isinstance(module.__dict__.get("forward"), FakeHPUGraphForward):
        return module
    module.forward = FakeHPUGraphForward(module.forward, disable_tensor_cache, module)
    return module


def graph_stats(module: nn.Module) -> FakeHPUGraphForward:
    """The capture/replay books of a module wrapped by `wrap_in_hpu_graph`."""
    fwd = module.__dict__.get("forward")
    if not isinstance(fwd, FakeHPUGraphForward):
        raise ValueError("module was not wrapped with wrap_in_hpu_graph (fake HPU).")
    return fwd
