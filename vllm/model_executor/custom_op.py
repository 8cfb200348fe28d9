"""Layers with one implementation per platform, chosen once (vLLM's `CustomOp`).

A layer that needs a platform-specific kernel subclasses `CustomOp` and writes
`forward_native` (plain torch: the reference, and the path of every platform without
its own), plus any of `forward_cpu`, `forward_hpu`, `forward_cuda`. The method is
picked from `vllm.platforms.current_platform` when the layer is built and stored on
the instance, so `forward` is one indirect call: no per-call test of where a tensor
lives, and torch.compile sees a single, fixed code path (no guard on the device).

Why not per call from the tensor's device: on the fake HPU tensors live on the CPU,
yet the model must run what a Gaudi runs (the hpex kernels), not the CPU-native ones.

Plugins may replace a registered op with their own subclass (`register_oot`), as
vLLM's out-of-tree platforms do; the replacement is built wherever the in-tree class
is constructed, so models need no change.

A platform may instead register just a forward function for an op
(`register_forward(name, device)`): it is bound to every instance of the op and of
its subclasses (e.g. the scaled rotary embeddings) built on that platform, in place
of `forward_<device>`. The HPU kernels are bound this way by the HPU plugin's
`register_ops()` (vllm/platforms/hpu_plugin.py), so the layers themselves carry no
Gaudi code and a CPU process never imports it.
"""
from __future__ import annotations

import logging
import types
from typing import Any, Callable, Optional

from torch import nn

logger = logging.getLogger(__name__)


class CustomOp(nn.Module):
    """Base of every layer with per-platform kernels; see the module docstring."""

    op_registry: dict[str, type["CustomOp"]] = {}
    """name -> in-tree class (`@CustomOp.register(name)`)."""
    oot_registry: dict[str, type["CustomOp"]] = {}
    """name -> out-of-tree replacement (`@CustomOp.register_oot(name)`)."""
    platform_forwards: dict[str, dict[str, Callable[..., Any]]] = {}
    """device name -> {op name -> forward(self, ...)} (`CustomOp.register_forward`)."""
    name: str = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> "CustomOp":
        replacement = CustomOp.oot_registry.get(cls.__dict__.get("name", ""))
        if replacement is not None and not issubclass(cls, replacement):
            cls = replacement
        return super().__new__(cls)

    def __init__(self) -> None:
        super().__init__()
        self._forward_method = self.dispatch_forward()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward_method(*args, **kwargs)

    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        """Plain torch; every other method falls back to it."""
        raise NotImplementedError

    def forward_cpu(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward_native(*args, **kwargs)

    def forward_hpu(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward_native(*args, **kwargs)

    def forward_cuda(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward_native(*args, **kwargs)

    def forward_oot(self, *args: Any, **kwargs: Any) -> Any:
        """Out-of-tree platforms: overridden by a plugin's replacement class."""
        return self.forward_native(*args, **kwargs)

    def dispatch_forward(self) -> Callable[..., Any]:
        """The bound method for the current platform (called once, at construction)."""
        from vllm.platforms import current_platform
        registered = self.registered_forward(current_platform.device_name)
        if registered is not None:
            return registered
        if current_platform.is_hpu():
            return self.forward_hpu
        if current_platform.is_cpu():
            return self.forward_cpu
        if current_platform.is_cuda():
            return self.forward_cuda
        return self.forward_oot

    def registered_forward(self, device: str) -> Optional[Callable[..., Any]]:
        """The function registered for `device` under this op's name (or the name of
        the nearest registered base class), bound to this instance; else None."""
        table = CustomOp.platform_forwards.get(device, {})
        for klass in type(self).__mro__:
            fn = table.get(klass.__dict__.get("name", ""))
            if fn is not None:
                return types.MethodType(fn, self)
        return None

    @property
    def forward_method_name(self) -> str:
        """Which implementation this instance runs, e.g. 'forward_hpu' (tests, logs)."""
        return self._forward_method.__name__

    @classmethod
    def register(cls, name: str) -> Callable[[type["CustomOp"]], type["CustomOp"]]:
        """Class decorator: record an in-tree op under `name` (vLLM's op names)."""
        def decorator(op_cls: type[CustomOp]) -> type[CustomOp]:
            if name in cls.op_registry:
                raise ValueError(f"custom op {name!r} is already registered.")
            op_cls.name = name
            cls.op_registry[name] = op_cls
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
            if key not in cls.op_registry:
                raise ValueError(f"no in-tree custom op named {key!r} to replace; known: "
                                 f"{', '.join(sorted(cls.op_registry))}.")
            cls.oot_registry[key] = op_cls
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
            if name not in cls.op_registry:
                raise ValueError(f"no custom op named {name!r}; known: "
                                 f"{', '.join(sorted(cls.op_registry))}.")
            cls.platform_forwards.setdefault(device, {})[name] = fn
            return fn
        return decorator
