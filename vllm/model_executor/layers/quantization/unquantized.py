"""The default linear method: a plain `weight` [out, in] in the model dtype."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from vllm.model_executor.kernels import linear
from vllm.model_executor.layers.quantization.base_config import LinearMethodBase, make_param


class UnquantizedLinearMethod(LinearMethodBase):
    """`F.linear`, through the platform's `linear` kernel (model_executor/kernels.py; on
    CPU the packed bf16 GEMM when the runner packed the weight, vllm/cpu/gemm.py):
    quantization support adds nothing to this path."""

    def create_weights(self, layer: nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], params_dtype: torch.dtype) -> None:
        layer.weight = make_param((sum(output_partition_sizes), input_size_per_partition),
                                  params_dtype, 0, 1, layer.weight_loader)

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return linear(layer, x, layer.weight, bias)


UNQUANTIZED = UnquantizedLinearMethod()
