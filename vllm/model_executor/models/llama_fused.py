"""Decode steps of Llama-family layers as one native call per layer (CPU, bf16).

At decode batch sizes a layer's arithmetic takes well under a millisecond, so the
Python around it (a dozen module calls, wrapper checks, tensor allocations) becomes a
third of the step. When a step holds only decodes and every layer qualifies, the
model hands each layer to `vllm_llama_decode_layer` (vllm/native/cpu_ops.cpp), which
runs the same kernels the modules call (RMSNorm, packed GEMM, rotary, KV write, paged
decode attention, SwiGLU) in the same order with the same roundings. Any other step,
or any layer that does not qualify, takes the module path; tests compare the two.

Qualifies: bf16 weights packed for the native GEMM, tensor parallel size 1 (no
all-reduce inside the layer), SiLU MLP, plain rotary over the fused q/k heads (not
Qwen3's per-head norms), one RMSNorm epsilon.
"""
from __future__ import annotations

import ctypes
from typing import Any, Optional

import torch

from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.cpu_gemm import NATIVE, native_pack, plan_of
from vllm.native import cpu_ops
from vllm.native.loader import get_native_lib

_PtrArray10 = ctypes.c_void_p * 10
_PtrArray7 = ctypes.c_void_p * 7
_I64Array7 = ctypes.c_int64 * 7
_I64Array4 = ctypes.c_int64 * 4
_F32Array2 = ctypes.c_float * 2


def _packed(module: Any) -> Optional[torch.Tensor]:
    return native_pack(module)


def packed_weight_of(layer: Any) -> Optional[torch.Tensor]:
    """The native pack of a layer's qkv weight: it changes whenever weights are packed."""
    attn = getattr(layer, "self_attn", None)
    qkv = getattr(attn, "qkv_proj", None)
    return None if qkv is None else _packed(qkv)


def _ptr(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


class _LayerArgs:
    """The pointers and sizes of one layer that do not change between steps."""

    def __init__(self, layer: Any) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        mods = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        self.packs = tuple(_packed(m) for m in mods)
        self.weights = _PtrArray10(
            layer.input_layernorm.weight.data_ptr(),
            layer.post_attention_layernorm.weight.data_ptr(),
            *[p for m, pack in zip(mods, self.packs) for p in (pack.data_ptr(), _ptr(m.bias))])
        rope = attn.rotary_emb
        self.shape = _I64Array7(attn.qkv_proj.input_size, attn.num_heads, attn.num_kv_heads,
                                attn.head_dim, mlp.down_proj.input_size_per_partition,
                                rope.rotary_dim, int(rope.is_neox_style))
        self.fshape = _F32Array2(layer.input_layernorm.variance_epsilon, attn.attn.scale)
        self.layer_idx = attn.attn.layer_idx
        self.qkv_size = attn.q_size + 2 * attn.kv_size
        self.q_size = attn.q_size
        self.inter = mlp.down_proj.input_size_per_partition
        self.cos_sin = rope.cos_sin_cache


def layer_qualifies(layer: Any) -> bool:
    """Static checks of one decoder layer (see the module docstring)."""
    from vllm.distributed import get_tensor_model_parallel_world_size
    from vllm.model_executor.layers.activation import SiluAndMul
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None or not getattr(attn, "fused_decode_ok", False):
        return False
    mods = (getattr(attn, "qkv_proj", None), getattr(attn, "o_proj", None),
            getattr(mlp, "gate_up_proj", None), getattr(mlp, "down_proj", None))
    if any(m is None or _packed(m) is None for m in mods):
        return False
    rope = attn.rotary_emb
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    return (get_tensor_model_parallel_world_size() == 1
            and isinstance(getattr(mlp, "act_fn", None), SiluAndMul)
            and rope.cos_sin_cache.dtype == torch.bfloat16
            and rope.head_size == attn.head_dim
            and all(n.weight.dtype == torch.bfloat16 for n in norms)
            and norms[0].variance_epsilon == norms[1].variance_epsilon)


class FusedDecode:
    """Runs decode-only steps of a model's own layers through the native layer call."""

    def __init__(self, layers: list[Any]) -> None:
        self.layers = layers
        self.args = [_LayerArgs(layer) for layer in layers]
        self.lib = get_native_lib()
        self.plans = [plan_of(m) for layer in layers[:1]
                      for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                layer.mlp.gate_up_proj, layer.mlp.down_proj)]
        self._native_rows: dict[int, bool] = {}

    def native_for(self, rows: int) -> bool:
        """Whether the measured kernel choice (gemm_autotune.py) is the native GEMM for
        all of a layer's matmuls at this row count; on CPUs where oneDNN's AMX kernel
        wins the layers run as modules instead. Layers share shapes, so the first
        layer's plans stand for all."""
        ok = self._native_rows.get(rows)
        if ok is None:
            ok = all(p is not None and p.kind_for(rows) == NATIVE for p in self.plans)
            self._native_rows[rows] = ok
        return ok

    @classmethod
    def build(cls, layers: list[Any]) -> Optional["FusedDecode"]:
        """A runner when the native GEMM is available and every layer qualifies."""
        if not layers or not cpu_ops.gemm_supported():
            return None
        if not all(layer_qualifies(layer) for layer in layers):
            return None
        return cls(layers)

    def run(self, positions: torch.Tensor, hidden: torch.Tensor,
            residual: Optional[torch.Tensor]) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """(hidden, residual) after all layers, or None when this step does not fit
        (prefills in it, no native metadata, other dtypes): the caller then runs the
        modules."""
        ctx = get_forward_context()
        md = getattr(ctx, "attn_metadata", None) if ctx is not None else None
        table = getattr(md, "decode_block_table", None)
        n = hidden.shape[0]
        if (table is None or md.num_decodes != n or not self.native_for(n)
                or hidden.dtype != torch.bfloat16
                or not hidden.is_contiguous() or hidden.dim() != 2
                or positions.dtype != torch.int64 or not positions.is_contiguous()):
            return None
        first = residual is None
        if first:
            residual = torch.empty_like(hidden)
        elif residual.dtype != torch.bfloat16 or not residual.is_contiguous():
            return None
        a0 = self.args[0]
        h = hidden.shape[1]
        workspace = torch.empty(n * (h + a0.qkv_size + a0.q_size + 3 * a0.inter),
                                dtype=torch.bfloat16)
        batch = _PtrArray7(positions.data_ptr(), a0.cos_sin.data_ptr(), 0, 0,
                           md.slot_mapping.data_ptr(), table.data_ptr(),
                           md.decode_seq_lens.data_ptr())
        kv_caches = ctx.kv_caches
        if kv_caches[a0.layer_idx].dtype != torch.bfloat16:
            return None
        num_slots = kv_caches[a0.layer_idx].shape[2]
        bshape = _I64Array4(n, num_slots, table.stride(0), md.block_size)
        threads = torch.get_num_threads()
        call = self.lib.vllm_llama_decode_layer
        for args in self.args:
            cache = kv_caches[args.layer_idx]
            batch[2], batch[3] = cache[0].data_ptr(), cache[1].data_ptr()
            call(hidden.data_ptr(), residual.data_ptr(), int(first), args.weights, args.shape,
                 args.fshape, batch, bshape, workspace.data_ptr(), threads)
            first = False
        return hidden, residual
