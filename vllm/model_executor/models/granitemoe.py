"""GraniteMoE (Granite 3.0 1B-A400M / 3B-A800M, PowerMoE): Granite's four multipliers
on a Mixtral-style sparse MoE block.

The checkpoint stores each layer's experts stacked: `block_sparse_moe.input_linear`
`[E, 2 * inter, hidden]` (gate rows, then up rows), `output_linear` `[E, hidden,
inter]`, and the router as `block_sparse_moe.router.layer`. The router is a softmax
over the top-k logits, i.e. the full softmax's top-k renormalized.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch
from torch import nn

from vllm.model_executor.models.granite import (GraniteDecoderLayer, GraniteForCausalLM,
                                                GraniteModel)
from vllm.model_executor.models.mixtral import MoECausalLMMixin, SparseMoeBlock


class GraniteMoeDecoderLayer(GraniteDecoderLayer):

    def build_mlp(self, config: Any, prefix: str) -> nn.Module:
        return SparseMoeBlock(config.hidden_size, config.num_local_experts,
                              config.num_experts_per_tok, config.intermediate_size,
                              renormalize=True, hidden_act=config.hidden_act, prefix=prefix)


class GraniteMoeModel(GraniteModel):
    layer_cls = GraniteMoeDecoderLayer


def unstack_experts(weights: Iterable[tuple[str, torch.Tensor]]
                    ) -> Iterator[tuple[str, torch.Tensor]]:
    """GraniteMoE's stacked tensors as the per-expert `experts.{e}.w1/w3/w2` and
    `gate` names the MoE loader reads."""
    for name, tensor in weights:
        if name.endswith(".block_sparse_moe.input_linear.weight"):
            base = name[:-len("block_sparse_moe.input_linear.weight")]
            inter = tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                yield f"{base}mlp.experts.{e}.w1.weight", tensor[e, :inter]
                yield f"{base}mlp.experts.{e}.w3.weight", tensor[e, inter:]
        elif name.endswith(".block_sparse_moe.output_linear.weight"):
            base = name[:-len("block_sparse_moe.output_linear.weight")]
            for e in range(tensor.shape[0]):
                yield f"{base}mlp.experts.{e}.w2.weight", tensor[e]
        elif name.endswith(".block_sparse_moe.router.layer.weight"):
            yield name.replace(".block_sparse_moe.router.layer.", ".mlp.gate."), tensor
        else:
            yield name, tensor


class GraniteMoeForCausalLM(MoECausalLMMixin, GraniteForCausalLM):
    model_cls = GraniteMoeModel

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(unstack_experts(weights))
