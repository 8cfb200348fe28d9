"""Integer weights with group scales (GPTQ, AWQ, compressed-tensors W4A16/W8A16).

Each checkpoint format packs differently (see `unpack_*` and the three methods
below); after loading, every layer holds one layout, whatever the format:

- `w_q` uint8: 4-bit weights [N, K/2] where, in each run of 32 inputs, byte j holds
  input j in its low nibble and input j+16 in its high nibble (so a kernel gets 16
  consecutive inputs from 16 bytes with one mask and one shift); 8-bit weights
  [N, K], one byte each. Values are unsigned (0..15 / 0..255).
- `w_scales`, `w_zeros` float32 [N, G]: W[n, k] = (q[n, k] - zero) * scale of k's
  group; groups are runs of K/G consecutive inputs, the same length for every group.
  A checkpoint whose last group is shorter (GPTQ on an input size that is not a
  multiple of the group size: AutoGPTQ / GPTQModel store ceil(K/group_size) scale rows
  and g_idx = k // group_size) is held on the finer grid gcd(group_size, K), each
  group's scale and zero repeated over its runs: the same weights, so the kernels keep
  one uniform group length.
- `w_perm` int64 [K] or absent: activation ordering (GPTQ desc_act, g_idx). The
  inputs are reordered so each group's inputs are consecutive; the layer then
  multiplies `x[:, w_perm]`, which is the same product.

Products, through the platform's `int4_linear` kernel (model_executor/kernels.py): on
CPU (vllm/cpu/ops.py), the native int4 kernel (vllm/cpu/quant_ops.cpp, AVX-512 or AVX2
rows, a scalar loop elsewhere) for up to `NATIVE_MAX_ROWS` rows (decode: it reads 4 bits
per weight, converting a tile in registers); Llama-family decode steps call the same
kernel from inside the fused native decode layer (vllm/cpu/fused_decode.py); otherwise,
and for 8 bits, the weight is dequantized to the activation dtype and multiplied by the
ordinary GEMM (prefill: the dequantization is paid once per step for many rows). On HPU (vllm/hpu/ops.py), the shim's `convert_from_uint4`
dequantizes on the fly before the matmul, from its own layout (`int4_prepare`).

Tensor parallelism is refused for these methods (the group and g_idx bookkeeping of
split inputs is not implemented); the error names the method and layer.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm import envs
from vllm.model_executor.kernels import kernel
from vllm.model_executor.layers.quantization.base_config import (LinearMethodBase,
                                                                 check_divisible, make_param)

NATIVE_MAX_ROWS = 8
"""Up to this many rows the native int4 kernel runs; above, dequantize + GEMM."""


def native_max_rows() -> float:
    """Most rows the native int4 kernel takes (more go through a dequantized bf16
    matmul); every row count with VLLM_BATCH_INVARIANT=1, so that a request's rows see
    one kernel whatever the batch (the kernel computes each row alone)."""
    return float("inf") if envs.VLLM_BATCH_INVARIANT else NATIVE_MAX_ROWS


def unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Values packed 32/bits per int32 along `dim`, element i of a word in bits
    [i*bits, (i+1)*bits): the tensor with that dimension 32/bits times longer."""
    per = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    x = packed.movedim(dim, -1).to(torch.int32)
    vals = (x.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return vals.reshape(*x.shape[:-1], x.shape[-1] * per).movedim(-1, dim)


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """[N, K] values 0..15 (K % 32 == 0) -> the `w_q` 4-bit layout [N, K/2]."""
    n, k = q.shape
    blocks = q.to(torch.uint8).reshape(n, k // 32, 2, 16)
    return (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


def unpack_nibbles(w_q: torch.Tensor) -> torch.Tensor:
    n, half = w_q.shape
    blocks = w_q.reshape(n, half // 16, 1, 16)
    return torch.cat([blocks & 0xF, blocks >> 4], dim=2).reshape(n, half * 2)


class IntWeightLinearMethod(LinearMethodBase):
    """Shared by the formats: subclasses create the checkpoint's parameters and turn
    them into (q [N, K] ints, scales [G, N]... ) with `unpack`."""

    method = ""

    def __init__(self, bits: int, group_size: int, prefix: str) -> None:
        from vllm.model_executor.layers.quantization.fp8 import on_hpu
        self.bits, self.group_size, self.prefix = bits, group_size, prefix
        self.on_hpu = on_hpu()
        # The platform's 4-bit layout and GEMM (model_executor/kernels.py).
        self.int4_prepare = kernel("int4_prepare")
        self.int4_linear = kernel("int4_linear")

    partial_last_group = False
    """Whether the format stores a shorter last group when the input size is not a
    multiple of the group size (GPTQ does; AWQ and compressed-tensors refuse to write
    such checkpoints, so a loader of theirs refuses them too)."""

    def _check(self, layer: nn.Module, k: int, parts: list[int]) -> int:
        """Validates the shapes; returns the number of groups."""
        if getattr(layer, "tp_size", 1) > 1:
            raise ValueError(f"{self.method}: tensor_parallel_size > 1 is not supported "
                             f"(layer {self.prefix}).")
        group = self._group(k)
        if k % group and not self.partial_last_group:
            raise ValueError(f"{self.method}: input size ({k}) of layer {self.prefix} is not a "
                             f"multiple of group_size {group}; {self.method} checkpoints have "
                             "no shorter last group (quantize with a group size that divides "
                             "it, or leave the layer unquantized with the checkpoint's ignore "
                             "list).")
        check_divisible(k, 32 // self.bits, "input size", self.method, self.prefix)
        if self.bits == 4:
            check_divisible(k, 32, "input size", self.method, self.prefix)
        return -(-k // group)

    def _group(self, k: int) -> int:
        return k if self.group_size == -1 else self.group_size

    def unpack(self, layer: nn.Module
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(q [N, K] int, scales [N, G] float, zeros [N, G] float, g_idx [K] or None)."""
        raise NotImplementedError

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        q, scales, zeros, g_idx = self.unpack(layer)
        for name in list(layer._parameters):
            if name != "bias":
                delattr(layer, name)
        n, k = q.shape
        group = self._group(k)
        perm = None
        if g_idx is not None:
            g_idx = g_idx.long()
            if not torch.equal(g_idx, torch.arange(k) // group):
                perm = torch.sort(g_idx, stable=True).indices
                counts = torch.bincount(g_idx, minlength=scales.shape[1])
                if not torch.equal(counts, torch.bincount(torch.arange(k) // group)):
                    raise ValueError(f"{self.method}: g_idx of layer {self.prefix} does not "
                                     f"give every group {group} inputs (the last one "
                                     f"{k - (scales.shape[1] - 1) * group}).")
                q = q[:, perm]
        scales, zeros = uniform_groups(scales, zeros, group, k)
        w_q = pack_nibbles(q) if self.bits == 4 else q.to(torch.uint8).contiguous()
        layer.register_buffer("w_q", w_q, persistent=False)
        layer.register_buffer("w_scales", scales.float().contiguous(), persistent=False)
        layer.register_buffer("w_zeros", zeros.float().contiguous(), persistent=False)
        layer.w_perm = perm
        layer.w_bits = self.bits
        if self.bits == 4:
            self.int4_prepare(layer, q)  # a backend's own layout (Gaudi's), if any

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        if layer.w_perm is not None:
            x = x.index_select(-1, layer.w_perm)
        if self.bits == 4:
            out = self.int4_linear(layer, x, bias)
            if out is not None:
                return out
        return F.linear(x, dequantize(layer).to(x.dtype), bias)


def uniform_groups(scales: torch.Tensor, zeros: torch.Tensor, group: int, k: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, ceil(K/group)] scales and zeros with a shorter last group -> the same weights
    on groups of gcd(group, K) inputs (unchanged when group divides K)."""
    if k % group == 0:
        return scales, zeros
    sub = math.gcd(group, k)
    repeat = group // sub
    return (scales.repeat_interleave(repeat, 1)[:, :k // sub],
            zeros.repeat_interleave(repeat, 1)[:, :k // sub])


def dequantize(layer: nn.Module) -> torch.Tensor:
    """The layer's float32 weight [N, K] (inputs in `w_perm` order)."""
    q = unpack_nibbles(layer.w_q) if layer.w_bits == 4 else layer.w_q
    n, k = q.shape
    g = layer.w_scales.shape[1]
    q = q.float().view(n, g, k // g)
    return ((q - layer.w_zeros.unsqueeze(-1)) * layer.w_scales.unsqueeze(-1)).view(n, k)


def one_g_idx(per_part: torch.Tensor, prefix: str) -> torch.Tensor:
    """The g_idx shared by the parts of a fused layer (they read the same input, so
    activation-order quantization gives them one order); anything else is refused."""
    if not bool((per_part == per_part[0]).all()):
        raise ValueError(f"layer {prefix}: the fused parts have different g_idx (activation "
                         "orders); this engine needs one order per fused layer.")
    return per_part[0]


class GPTQLinearMethod(IntWeightLinearMethod):
    """AutoGPTQ / GPTQModel layout: qweight [K/pack, N] packed along the input,
    qzeros [G, N/pack] packed along the output, scales [G, N], g_idx [K]. The "gptq"
    checkpoint format stores zero - 1 (the v1 convention), "gptq_v2" the zero itself."""

    method = "gptq"
    partial_last_group = True

    def __init__(self, bits: int, group_size: int, v2: bool, prefix: str) -> None:
        super().__init__(bits, group_size, prefix)
        self.zero_offset = 0 if v2 else 1

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       params_dtype) -> None:
        k, n, per = input_size_per_partition, sum(output_partition_sizes), 32 // self.bits
        groups = self._check(layer, k, output_partition_sizes)
        for size in output_partition_sizes:
            check_divisible(size, per, "output size", self.method, self.prefix)
        loader = layer.weight_loader
        layer.qweight = make_param((k // per, n), torch.int32, 1, 0, loader)
        layer.qzeros = make_param((groups, n // per), torch.int32, 1, 0, loader)
        layer.scales = make_param((groups, n), torch.float32, 1, 0, loader)
        layer.g_idx = make_param((len(output_partition_sizes), k), torch.int32, None, None,
                                 loader, optional=True, per_part=True)
        layer.g_idx.data.copy_((torch.arange(k) // self._group(k)).expand_as(layer.g_idx))

    def unpack(self, layer):
        q = unpack_int32(layer.qweight.data, self.bits, 0).t()
        zeros = unpack_int32(layer.qzeros.data, self.bits, 1) + self.zero_offset
        return q, layer.scales.data.t(), zeros.t().float(), one_g_idx(layer.g_idx.data,
                                                                     self.prefix)


AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)
"""AWQ's GEMM packing puts output column AWQ_ORDER[i] = (0, 2, 4, 6, 1, 3, 5, 7)[i]
of each run of 8 into nibble i; so column j sits in nibble AWQ_REVERSE_ORDER[j]."""


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """[R, C] int32 in AWQ's GEMM order -> [R, 8C] values, columns in natural order."""
    nibbles = unpack_int32(packed, 4, 1).view(packed.shape[0], -1, 8)
    return nibbles[:, :, list(AWQ_REVERSE_ORDER)].reshape(packed.shape[0], -1)


class AWQLinearMethod(IntWeightLinearMethod):
    """AutoAWQ GEMM layout: qweight [K, N/8] and qzeros [G, N/8] packed along the
    output in AWQ's order, scales [G, N]; W = (q - zero) * scale."""

    method = "awq"

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       params_dtype) -> None:
        k, n = input_size_per_partition, sum(output_partition_sizes)
        groups = self._check(layer, k, output_partition_sizes)
        for size in output_partition_sizes:
            check_divisible(size, 8, "output size", self.method, self.prefix)
        loader = layer.weight_loader
        layer.qweight = make_param((k, n // 8), torch.int32, 1, 0, loader)
        layer.qzeros = make_param((groups, n // 8), torch.int32, 1, 0, loader)
        layer.scales = make_param((groups, n), torch.float32, 1, 0, loader)

    def unpack(self, layer):
        q = unpack_awq(layer.qweight.data).t()
        zeros = unpack_awq(layer.qzeros.data).t().float()
        return q, layer.scales.data.t(), zeros, None


class CompressedTensorsWNA16Method(IntWeightLinearMethod):
    """compressed-tensors `pack-quantized`: weight_packed [N, K/pack] int32 packed
    along the input with signed values stored offset by 2^(bits-1), weight_scale
    [N, G], weight_zero_point [N/pack, G] (asymmetric only, packed along the output,
    offset like the weights), weight_g_idx [K] (activation ordering)."""

    method = "compressed-tensors"

    def __init__(self, bits: int, group_size: int, symmetric: bool, actorder: bool,
                 prefix: str) -> None:
        super().__init__(bits, group_size, prefix)
        self.symmetric, self.actorder = symmetric, actorder

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       params_dtype) -> None:
        k, n, per = input_size_per_partition, sum(output_partition_sizes), 32 // self.bits
        groups = self._check(layer, k, output_partition_sizes)
        loader = layer.weight_loader
        layer.weight_packed = make_param((n, k // per), torch.int32, 0, 1, loader)
        layer.weight_scale = make_param((n, groups), torch.float32, 0, 1, loader)
        layer.weight_shape = make_param((2,), torch.int64, None, None, loader, optional=True)
        if not self.symmetric:
            for size in output_partition_sizes:
                check_divisible(size, per, "output size", self.method, self.prefix)
            layer.weight_zero_point = make_param((n // per, groups), torch.int32, 0, 1, loader)
        if self.actorder:
            layer.weight_g_idx = make_param((len(output_partition_sizes), k), torch.int32, None,
                                            None, loader, per_part=True)

    def unpack(self, layer):
        offset = 1 << (self.bits - 1)
        q = unpack_int32(layer.weight_packed.data, self.bits, 1)
        scales = layer.weight_scale.data
        if self.symmetric:
            zeros = torch.full(scales.shape, float(offset))
        else:
            zeros = unpack_int32(layer.weight_zero_point.data, self.bits, 0).float()
        g_idx = one_g_idx(layer.weight_g_idx.data, self.prefix) if self.actorder else None
        return q, scales, zeros, g_idx
