"""Linear layers that know how to shard themselves over tensor-parallel ranks.

Weights are stored as `[out_features, in_features]` (as in HF checkpoints) for the
part this rank owns. Every parameter carries `weight_loader(param, loaded_weight,
shard_id=None)`, which takes the full checkpoint tensor and copies this rank's
slice into the parameter; merged layers (`qkv_proj`, `gate_up_proj`) use
`shard_id` to say which checkpoint tensor ("q"/"k"/"v", or 0/1) is being loaded.

Column-parallel layers split the output features; row-parallel layers split the
input features and all-reduce their output. A column-parallel layer followed by a
row-parallel one therefore needs exactly one all-reduce.

Quantization enters through one object per layer, `quant_method` (vLLM's
LinearMethodBase idea, see layers/quantization/): it creates the weight parameters,
repacks them after loading and computes `x @ W^T`. Without a quantization config it
is `UnquantizedLinearMethod` (a `weight` [out, in] and the packed bf16 CPU GEMM).
Parameters of any method carry `output_dim` / `input_dim`, which the loaders below
use to shard them and to place merged parts (see quantization/base_config.py).

`forward` returns the output tensor only (vLLM returns `(output, bias)`; nothing
here skips the bias add, so the tuple would only cost allocations).
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn

from vllm.distributed import (get_tensor_model_parallel_rank,
                              get_tensor_model_parallel_world_size,
                              tensor_model_parallel_all_gather,
                              tensor_model_parallel_all_reduce)
from vllm.model_executor.layers.quantization import current_quant_method
from vllm.model_executor.layers.quantization.base_config import make_param


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator != 0:
        raise ValueError(f"{what} ({numerator}) must be divisible by the tensor parallel "
                         f"size ({denominator}).")
    return numerator // denominator


def _copy_checked(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if dst.shape != src.shape and (dst.numel() == src.numel() == 1
                                   or (dst.dim() == src.dim() + 1 and dst.shape[0] == 1
                                       and dst.shape[1:] == src.shape)):
        src = src.reshape(dst.shape)  # a scalar saved as [] or [1]; one part of per-part data
    if dst.shape != src.shape:
        raise ValueError(f"shape mismatch loading {name}: checkpoint slice "
                         f"{tuple(src.shape)}, parameter {tuple(dst.shape)}.")
    dst.copy_(src)


class LinearBase(nn.Module):
    """Holds the TP position and the parameter factory shared by all linear layers."""

    packable_weight = True
    """The runner may attach a packed copy of the weight (see cpu_gemm)."""

    def __init__(self, input_size: int, output_size: int,
                 params_dtype: Optional[torch.dtype] = None, prefix: str = "") -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.params_dtype = params_dtype
        self.prefix = prefix
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()

        self.quant_method = current_quant_method(self, prefix)

    def _create_params(self, out_partition_sizes: list[int], in_features: int,
                       bias: bool) -> None:
        """The quant method's weight parameters, then the (never quantized) bias."""
        dtype = self.params_dtype or torch.get_default_dtype()
        self.quant_method.create_weights(self, in_features, out_partition_sizes, dtype)
        if bias:
            self.bias = make_param((sum(out_partition_sizes),), dtype, 0, None,
                                   self.weight_loader)
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,
                      shard_id: Optional[Union[str, int]] = None) -> None:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return (f"in_features={self.input_size}, out_features={self.output_size}, "
                f"bias={self.bias is not None}, tp_size={self.tp_size}, "
                f"quant_method={type(self.quant_method).__name__}")


class ReplicatedLinear(LinearBase):
    """The full weight on every rank (small projections, routers)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = True,
                 params_dtype: Optional[torch.dtype] = None, prefix: str = "") -> None:
        super().__init__(input_size, output_size, params_dtype, prefix)
        self._create_params([output_size], input_size, bias)

    def weight_loader(self, param, loaded_weight, shard_id=None) -> None:
        _copy_checked(param.data, loaded_weight, self.prefix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


class ColumnParallelLinear(LinearBase):
    """Output features split over ranks: rank r owns rows [r*n, (r+1)*n) of the weight."""

    def __init__(self, input_size: int, output_size: int, bias: bool = True,
                 gather_output: bool = False, params_dtype: Optional[torch.dtype] = None,
                 prefix: str = "") -> None:
        super().__init__(input_size, output_size, params_dtype, prefix)
        self.gather_output = gather_output
        self.output_size_per_partition = divide(output_size, self.tp_size,
                                                f"output size of {prefix or 'layer'}")
        self._create_params(self.output_partition_sizes(), input_size, bias)

    def output_partition_sizes(self) -> list[int]:
        """This rank's output features of each merged part (one part here)."""
        return [self.output_size_per_partition]

    def weight_loader(self, param, loaded_weight, shard_id=None) -> None:
        dim = param.output_dim
        if dim is not None:
            n = param.shape[dim]
            loaded_weight = loaded_weight.narrow(dim, self.tp_rank * n, n)
        _copy_checked(param.data, loaded_weight, self.prefix)

    def _load_part(self, param, loaded_weight, part: int, start: int, size: int,
                   src_index: int) -> None:
        """Copy merged part `part` (this rank's output features [start, start+size),
        taken as slice `src_index` of the checkpoint tensor) into `param`, whose
        output dimension may be packed or grouped (placed by proportion)."""
        name = f"{self.prefix}[{part}]"
        if getattr(param, "shard_indexed", False):
            _copy_checked(param.data[part:part + 1], loaded_weight.reshape(1), name)
            return
        if getattr(param, "per_part", False):  # one row per part (e.g. each part's g_idx)
            _copy_checked(param.data[part], loaded_weight, name)
            return
        dim = param.output_dim
        if dim is None:  # the same for every part (e.g. GPTQ's g_idx)
            _copy_checked(param.data, loaded_weight, name)
            return
        units, total = param.shape[dim], self.output_size_per_partition
        start, size = start * units // total, size * units // total
        _copy_checked(param.data.narrow(dim, start, size),
                      loaded_weight.narrow(dim, src_index * size, size), name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.quant_method.apply(self, x, self.bias)
        if self.gather_output and self.tp_size > 1:
            out = tensor_model_parallel_all_gather(out, dim=-1)
        return out


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input in one matmul.

    Used for `gate_up_proj` = [gate_proj; up_proj]. Each rank's weight is the
    concatenation of its slices of every part, so the output splits into the parts
    with plain views.
    """

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = True,
                 gather_output: bool = False, params_dtype: Optional[torch.dtype] = None,
                 prefix: str = "") -> None:
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), bias, gather_output, params_dtype,
                         prefix)
        for size in self.output_sizes:
            divide(size, self.tp_size, f"each output size of {prefix or 'layer'}")

    def output_partition_sizes(self) -> list[int]:
        return [size // self.tp_size for size in self.output_sizes]

    def weight_loader(self, param, loaded_weight, shard_id: Optional[int] = None) -> None:
        if shard_id is None:  # a checkpoint that already stores the merged tensor
            if param.output_dim is None:
                _copy_checked(param.data, loaded_weight, self.prefix)
                return
            offset, dim = 0, param.output_dim
            for i, size in enumerate(self.output_sizes):
                n = size * param.shape[dim] * self.tp_size // self.output_size
                self.weight_loader(param, loaded_weight.narrow(dim, offset, n), i)
                offset += n
            return
        if not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(f"shard_id must be in [0, {len(self.output_sizes)}), got "
                             f"{shard_id}.")
        n = self.output_sizes[shard_id] // self.tp_size
        start = sum(self.output_sizes[:shard_id]) // self.tp_size
        self._load_part(param, loaded_weight, shard_id, start, n, self.tp_rank)


class QKVParallelLinear(ColumnParallelLinear):
    """The q, k and v projections in one matmul, heads split over ranks.

    Each rank owns `total_num_heads / tp` query heads. Key/value heads are split the
    same way when there are at least `tp` of them; otherwise each rank keeps one KV
    head and `tp / total_num_kv_heads` consecutive ranks share (replicate) it, so
    that rank r's query heads still attend to the KV head they are grouped with.
    """

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int,
                 total_num_kv_heads: Optional[int] = None, bias: bool = True,
                 params_dtype: Optional[torch.dtype] = None, prefix: str = "") -> None:
        tp_size = get_tensor_model_parallel_world_size()
        total_num_kv_heads = total_num_kv_heads or total_num_heads
        self.head_size = head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = divide(total_num_heads, tp_size, "num_attention_heads")
        if total_num_kv_heads >= tp_size:
            self.num_kv_heads = divide(total_num_kv_heads, tp_size, "num_key_value_heads")
            self.num_kv_head_replicas = 1
        else:
            if tp_size % total_num_kv_heads != 0:
                raise ValueError(f"tensor parallel size ({tp_size}) must be a multiple of "
                                 f"num_key_value_heads ({total_num_kv_heads}) when it is "
                                 "larger.")
            self.num_kv_heads = 1
            self.num_kv_head_replicas = tp_size // total_num_kv_heads
        self.q_size = self.num_heads * head_size
        self.kv_size = self.num_kv_heads * head_size
        # Output size as if every rank's slice were distinct (replicas counted).
        output_size = (self.num_heads + 2 * self.num_kv_heads) * tp_size * head_size
        super().__init__(hidden_size, output_size, bias, False, params_dtype, prefix)

    def output_partition_sizes(self) -> list[int]:
        return [self.q_size, self.kv_size, self.kv_size]

    def weight_loader(self, param, loaded_weight, shard_id: Optional[str] = None) -> None:
        if shard_id is None:  # checkpoint with a fused qkv tensor
            if param.output_dim is None:
                _copy_checked(param.data, loaded_weight, self.prefix)
                return
            dim = param.output_dim
            full = (self.total_num_heads + 2 * self.total_num_kv_heads) * self.head_size
            q = self.total_num_heads * self.head_size * loaded_weight.shape[dim] // full
            kv = self.total_num_kv_heads * self.head_size * loaded_weight.shape[dim] // full
            for sid, (start, size) in zip("qkv", ((0, q), (q, kv), (q + kv, kv))):
                self.weight_loader(param, loaded_weight.narrow(dim, start, size), sid)
            return
        if shard_id == "q":
            dst_start, size, src_index = 0, self.q_size, self.tp_rank
        elif shard_id in ("k", "v"):
            dst_start = self.q_size + (0 if shard_id == "k" else self.kv_size)
            size, src_index = self.kv_size, self.tp_rank // self.num_kv_head_replicas
        else:
            raise ValueError(f"shard_id must be 'q', 'k' or 'v', got {shard_id!r}.")
        self._load_part(param, loaded_weight, "qkv".index(shard_id), dst_start, size,
                        src_index)


class RowParallelLinear(LinearBase):
    """Input features split over ranks; partial outputs are summed with an all-reduce.

    The bias is added once, after the reduction.
    """

    def __init__(self, input_size: int, output_size: int, bias: bool = True,
                 input_is_parallel: bool = True, reduce_results: bool = True,
                 params_dtype: Optional[torch.dtype] = None, prefix: str = "") -> None:
        super().__init__(input_size, output_size, params_dtype, prefix)
        self.input_is_parallel = input_is_parallel
        self.reduce_results = reduce_results
        self.input_size_per_partition = divide(input_size, self.tp_size,
                                               f"input size of {prefix or 'layer'}")
        self._create_params([output_size], self.input_size_per_partition, bias)

    def weight_loader(self, param, loaded_weight, shard_id=None) -> None:
        dim = param.input_dim
        if dim is not None:  # the bias and per-output scales are not split
            n = param.shape[dim]
            loaded_weight = loaded_weight.narrow(dim, self.tp_rank * n, n)
        _copy_checked(param.data, loaded_weight, self.prefix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.quant_method.apply(self, x, self.bias)
        if not self.input_is_parallel:
            n = self.input_size_per_partition
            x = x.narrow(-1, self.tp_rank * n, n)
        out = self.quant_method.apply(self, x)
        if self.reduce_results:
            out = tensor_model_parallel_all_reduce(out)
        if self.bias is not None:
            out = out + self.bias
        return out
