"""Layers with one implementation per platform, chosen once (vLLM's `CustomOp`).

A layer that has platform kernels subclasses `CustomOp`, registers under vLLM's op
name (`@CustomOp.register("rms_norm")`) and writes `forward_native`: plain torch, the
reference and the path of every platform without a kernel of its own. The layers
carry no platform code. Each platform binds its kernels to ops from its own package
with `@CustomOp.register_forward(name, device)`: the CPU's native kernels in
`vllm/cpu/ops.py`, Gaudi's in `vllm/hpu/ops.py` (also bound by the HPU plugin's
`register_ops`), each bound by its platform's `bind_custom_ops` in the worker's device
initialization or when the first layer is built. Kernels that are plain functions
(the GEMM on packed weights, greedy argmax, quantized GEMMs) bind in the same step to
the kernel table, `model_executor/kernels.py`.
So a CPU process never imports Gaudi code, and a platform's kernels live beside the
rest of that platform.

The forward is picked when the layer is built, from `current_platform.device_name`,
and stored on the instance: `forward` is one indirect call, nothing is decided per
call from where a tensor lives (on the fake HPU tensors live on the CPU, yet the
model must run what a Gaudi runs), and torch.compile sees one fixed code path. A
forward bound to an op also serves its subclasses (the scaled rotary embeddings),
found through the MRO.

Plugins replace a whole op with a subclass (`register_oot`, vLLM's hook): it is
built wherever the in-tree class is constructed, and its `forward_oot` runs on every
platform (the plugin took the op over).

All of it is one table, `CustomOp.registry`: op name -> `OpEntry` (the in-tree class,
the out-of-tree replacement, the forward bound per device).
"""
from __future__ import annotations

import logging
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from torch import nn

logger = logging.getLogger(__name__)


@dataclass
class OpEntry:
    """Everything known about one op name."""
    cls: type["CustomOp"]
    oot: Optional[type["CustomOp"]] = None
    """Out-of-tree replacement class (`register_oot`)."""
    forwards: dict[str, Callable[..., Any]] = field(default_factory=dict)
    """device name -> forward(self, ...) (`register_forward`)."""


class CustomOp(nn.Module):
    """Base of every layer with per-platform kernels; see the module docstring."""

    registry: dict[str, OpEntry] = {}
    name: str = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> "CustomOp":
        entry = CustomOp.registry.get(cls.__dict__.get("name", ""))
        if entry is not None and entry.oot is not None and not issubclass(cls, entry.oot):
            cls = entry.oot
        return super().__new__(cls)

    def __init__(self) -> None:
        super().__init__()
        self._forward_method = self.dispatch_forward()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward_method(*args, **kwargs)

    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        """Plain torch; the path of every platform without a bound kernel."""
        raise NotImplementedError

    def forward_oot(self, *args: Any, **kwargs: Any) -> Any:
        """Out-of-tree platforms: overridden by a plugin's replacement class."""
        return self.forward_native(*args, **kwargs)

    def dispatch_forward(self) -> Callable[..., Any]:
        """The bound forward for the current platform (called once, at construction):
        a plugin's replacement runs its `forward_oot` everywhere (it took the op over);
        else the platform's registered kernel, else `forward_oot` on out-of-tree
        platforms, else `forward_native`."""
        from vllm.platforms import current_platform
        current_platform.bind_custom_ops()
        entry = CustomOp.registry.get(self.name)
        if entry is not None and entry.oot is not None and isinstance(self, entry.oot):
            return self.forward_oot
        registered = self.registered_forward(current_platform.device_name)
        if registered is not None:
            return registered
        if current_platform.is_out_of_tree():
            return self.forward_oot
        return self.forward_native

    def registered_forward(self, device: str) -> Optional[Callable[..., Any]]:
        """The forward bound for `device` to this op (or to the nearest registered base
        class), bound to this instance; else None."""
        for klass in type(self).__mro__:
            entry = CustomOp.registry.get(klass.__dict__.get("name", ""))
            fn = entry.forwards.get(device) if entry is not None else None
            if fn is not None:
                return types.MethodType(fn, self)
        return None

    @property
    def forward_method_name(self) -> str:
        """Which implementation this instance runs, e.g. 'rms_norm_hpu' (tests, logs)."""
        return self._forward_method.__name__

    @classmethod
    def entry(cls, name: str) -> OpEntry:
        """The registry entry of op `name` (ValueError naming the known ops)."""
        found = cls.registry.get(name)
        if found is None:
            raise ValueError(f"no in-tree custom op named {name!r}; known: "
                             f"{', '.join(sorted(cls.registry))}.")
        return found

    @classmethod
    def register(cls, name: str) -> Callable[[type["CustomOp"]], type["CustomOp"]]:
        """Class decorator: record an in-tree op under `name` (vLLM's op names)."""
        def decorator(op_cls: type[CustomOp]) -> type[CustomOp]:
            if name in cls.registry:
                raise ValueError(f"custom op {name!r} is already registered.")
            op_cls.name = name
            cls.registry[name] = OpEntry(op_cls)
            return op_cls
        return decorator

    @classmethod
    def register_oot(cls, name: Optional[str] = None
                     ) -> Callable[[type["CustomOp"]], type["CustomOp"]]:
        """Class decorator for plugins: build `op_cls` wherever the in-tree op `name`
        (default: the name of the class it derives from) is constructed."""
        def decorator(op_cls: type[CustomOp]) -> type[CustomOp]:
            key = name or next((b.__dict__["name"] for b in op_cls.__mro__[1:]
                                if b.__dict__.get("name")), "")
            cls.entry(key).oot = op_cls
            logger.info("Custom op %r replaced by %s.%s", key, op_cls.__module__,
                        op_cls.__qualname__)
            return op_cls
        return decorator

    @classmethod
    def register_forward(cls, name: str, device: str
                         ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: `fn(self, ...)` is the forward of op `name` on platforms whose
        `device_name` is `device` (ops built afterwards)."""
        def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
            cls.entry(name).forwards[device] = fn
            return fn
        return decorator

    @classmethod
    def register_forwards(cls, forwards: dict[str, Callable[..., Any]],
                          device: str) -> list[str]:
        """Bind a platform's table of forwards (op name -> fn) for `device` (idempotent;
        affects ops built afterwards); returns the op names bound."""
        for name, fn in forwards.items():
            cls.register_forward(name, device)(fn)
        return sorted(forwards)
