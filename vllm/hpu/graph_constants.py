"""Python values a graph bakes in, declared by the layers that use them.

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

from typing import Hashable

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
