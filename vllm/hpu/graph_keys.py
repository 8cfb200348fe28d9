"""What a graph is keyed by: its inputs' shapes, and the Python values it bakes in.

`input_signature(args)` is the key an HPU graph is recorded under (tensor shapes and
dtypes, scalar values); the fake HPU's graph recorder and the runner's compile
accounting both use it, so they agree with each other and with Gaudi.


A graph (an HPU graph, a lazy-mode recipe, a torch.compile region) is keyed by its
tensor inputs' shapes and dtypes, and also by every Python scalar its ops were
traced with: such a scalar is a constant compiled into the graph, so a new value
is a new graph. Tensors read from module buffers are inputs instead (their values
can change freely). Layers that pass Python scalars to their ops, such as INC's
fp8 layers with RUNTIME_SCALE_PATCHING=0, declare them through their quant
method's `graph_constants(layer)`; `baked_constants(module)` collects them so the
fake HPU's graph keys and the runner's compile accounting see what Gaudi sees.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Hashable

import torch
from torch import nn

_HOLDERS = "_vllm_graph_constant_holders"


def _holders(module: nn.Module) -> list[nn.Module]:
    holders = module.__dict__.get(_HOLDERS)
    if holders is None:
        holders = [m for m in module.modules()
                   if hasattr(getattr(m, "quant_method", None), "graph_constants")]
        module.__dict__[_HOLDERS] = holders  # not a submodule list: plain attribute
    return holders


def baked_constants(module: nn.Module) -> Hashable:
    """The constants every graph of `module` compiles in (empty for most models)."""
    return tuple(m.quant_method.graph_constants(m) for m in _holders(module))


def input_signature(obj: Any) -> Hashable:
    """The key a graph is recorded under: tensor shapes/dtypes, scalar values.

    Recurses through tuples/lists, dicts and dataclasses; any other object counts
    by its type name only (its contents are invisible to a graph).
    """
    if isinstance(obj, torch.Tensor):
        return ("T", tuple(obj.shape), obj.dtype, obj.device.type)
    if obj is None or isinstance(obj, (bool, int, float, str, torch.dtype)):
        return obj
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(input_signature(x) for x in obj))
    if isinstance(obj, dict):
        return ("dict", tuple(sorted((str(k), input_signature(v)) for k, v in obj.items())))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return (type(obj).__qualname__,
                tuple((f.name, input_signature(getattr(obj, f.name)))
                      for f in dataclasses.fields(obj)))
    return ("obj", type(obj).__qualname__)
