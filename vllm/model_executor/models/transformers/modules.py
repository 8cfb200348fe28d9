"""Building a `transformers` model without its weights, then swapping in our layers.

The library's model is built with its parameters on the meta device (no memory, no
random init) but its buffers real (rotary inverse frequencies are computed at init and
not in the checkpoint). Then its `nn.Linear` layers become our linear layers (our GEMM
kernels, quantization methods and tensor-parallel sharding, from the model's
`base_model_tp_plan`), its plain `nn.Embedding` our vocab-parallel embedding, and every
parameter still on meta is allocated for the checkpoint to fill.
"""
from __future__ import annotations

import contextlib
import fnmatch
from typing import Any, Iterator, Optional

import torch
from torch import nn

from vllm.model_executor.layers.linear import (ColumnParallelLinear, ReplicatedLinear,
                                               RowParallelLinear)
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

COLWISE = ("colwise",)
ROWWISE = ("rowwise",)
"""tp-plan styles that shard a linear layer; every other style (the `*_gather_output`
and `*_split_input` forms a model uses where a norm needs all heads, replicated
modules) keeps the layer whole on every rank."""


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Every parameter registered inside moves to the meta device; buffers stay real.

    Combined with transformers' `no_init_weights`, so the brief real allocation of each
    parameter is never initialized."""
    from transformers.initialization import no_init_weights
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: Optional[nn.Parameter]) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=False)
        original(module, name, param)

    nn.Module.register_parameter = register
    try:
        with no_init_weights():
            yield
    finally:
        nn.Module.register_parameter = original


def tp_style(plan: dict[str, str], name: str) -> Optional[str]:
    """The plan's style for module `name` of the base model ('layers.3.mlp.up_proj'
    matches 'layers.*.mlp.up_proj')."""
    for pattern, style in plan.items():
        if fnmatch.fnmatchcase(name, pattern):
            return style
    return None


def _set_submodule(root: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, child, module)


def _make_linear(linear: nn.Linear, style: Optional[str], tp_size: int,
                 prefix: str) -> nn.Module:
    bias = linear.bias is not None
    n_in, n_out = linear.in_features, linear.out_features
    if tp_size > 1 and style in COLWISE:
        return ColumnParallelLinear(n_in, n_out, bias=bias, prefix=prefix)
    if tp_size > 1 and style in ROWWISE:
        return RowParallelLinear(n_in, n_out, bias=bias, prefix=prefix)
    return ReplicatedLinear(n_in, n_out, bias=bias, prefix=prefix)


def replace_layers(base: nn.Module, plan: dict[str, str], tp_size: int, prefix: str,
                   shard_attention: bool) -> None:
    """Swap the base model's `nn.Linear` and plain `nn.Embedding` modules for ours
    (subclasses, e.g. an embedding that scales its output, keep their own forward).

    Attention projections shard only with `shard_attention` (the heads split evenly);
    fused projections (`qkv`, `gate_up`) never do: a contiguous split would cut across
    their parts."""
    for name, module in list(base.named_modules()):
        full = f"{prefix}.{name}" if prefix else name
        if type(module) is nn.Linear:
            style = tp_style(plan, name)
            fused = any(part in name.rsplit(".", 1)[-1] for part in ("qkv", "gate_up"))
            if fused or (".self_attn." in f".{name}" and not shard_attention):
                style = None
            _set_submodule(base, name, _make_linear(module, style, tp_size, full))
        elif type(module) is nn.Embedding:
            embed = VocabParallelEmbedding(module.num_embeddings, module.embedding_dim,
                                           prefix=full)
            _set_submodule(base, name, embed)


def materialize_meta(model: nn.Module, device: Any) -> None:
    """Allocate (uninitialized) every parameter still on the meta device."""
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if param.device.type == "meta":
                setattr(module, name, nn.Parameter(
                    torch.empty(param.shape, dtype=param.dtype, device=device),
                    requires_grad=False))
