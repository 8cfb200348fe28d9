"""Decode steps of Llama-family layers as one native call per layer (CPU, bf16).

At decode batch sizes a layer's arithmetic takes well under a millisecond, so the
Python around it (a dozen module calls, wrapper checks, tensor allocations) becomes a
third of the step. `fused_decode_layers_cpu` is the CPU forward of the model's
`DecoderStack` op (layers/decoder_stack.py, bound in vllm/cpu/ops.py like the other
CPU kernels). When a step holds only decodes and every layer qualifies, it hands each
layer to `vllm_llama_decode_layer` (vllm/cpu/cpu_ops.cpp), which
runs the same kernels the modules call (RMSNorm, GEMM, rotary, KV write, paged decode
attention, SwiGLU) in the same order with the same roundings. Any other step, or any
layer that does not qualify, takes the module path; tests compare the two.

Each projection reaches the native layer as a (function address, context) pair: bf16
weights packed for the native GEMM (`vllm_linear_bf16_packed`, AVX512-BF16 or AVX2) or
int4 weights (GPTQ / AWQ / compressed-tensors W4A16 after loading, int_weights.py:
`vllm_int4_linear_bf16` of quant_ops.cpp, the very function the module path calls, on
any CPU). So a quantized model keeps the one-call layer, and reads 4 bits a weight.

LoRA (the manager wraps the projections in `LoRALinear`): steps without adapters run
the fused layers unchanged; steps with adapters pass each row's slot and each
projection's per-slot A / B, and the native layer adds the shrink-expand deltas right
after each projection (`lora_add` in cpu_ops.cpp). Static-shape (HPU) schedules and
adapters held in another dtype than bf16 take the module path.

Qualifies: every projection in one of the two native forms, tensor parallel size 1
(no all-reduce inside the layer), SiLU MLP, plain rotary over the fused q/k heads (not
Qwen3's per-head norms), one RMSNorm epsilon.
"""
from __future__ import annotations

import ctypes
from typing import Any, Optional

import torch

from vllm.forward_context import get_forward_context
from vllm.cpu.gemm import AMX, NATIVE, native_pack, plan_of
from vllm.cpu.gemm_autotune import ROW_UPPER
from vllm.cpu.loader import get_native_lib

_PtrArray10 = ctypes.c_void_p * 10
_PtrArray8 = ctypes.c_void_p * 8
_PtrArray4 = ctypes.c_void_p * 4
_I64Array7 = ctypes.c_int64 * 7
_I64Array4 = ctypes.c_int64 * 4
_F32Array2 = ctypes.c_float * 2

INT4 = "int4"
"""Plan-free kind of an int4 projection: native up to `NATIVE_MAX_ROWS` rows."""


def _base(module: Any) -> Any:
    """The model's own layer under a LoRA wrapper (the wrapper itself has no weight)."""
    from vllm.lora.layers import LoRALinear
    return module.base_layer if isinstance(module, LoRALinear) else module


def _int4_weights(module: Any) -> bool:
    """Int4 weights in int_weights.py's CPU layout, natural input order."""
    from vllm.model_executor.layers.quantization.int_weights import IntWeightLinearMethod
    from vllm.cpu import quant_ops
    method = getattr(module, "quant_method", None)
    return (isinstance(method, IntWeightLinearMethod) and not method.on_hpu
            and getattr(module, "w_bits", None) == 4 and module.w_perm is None
            and hasattr(module, "w_q") and module.w_scales.shape[1] > 0
            and (module.w_q.shape[1] * 2 // module.w_scales.shape[1]) % 32 == 0
            and quant_ops.get_quant_lib() is not None)


def _projection(module: Any, lib: ctypes.CDLL
                ) -> Optional[tuple[int, ctypes.Array, Optional[Any], str]]:
    """(function address, context, plan, kind) of one projection's native form, or None.
    The context holds raw pointers: the module keeps the tensors alive."""
    module = _base(module)
    bias = getattr(module, "bias", None)
    if bias is not None and (bias.dtype != torch.bfloat16 or not bias.is_contiguous()):
        return None
    pack = native_pack(module)
    if pack is not None:
        n, k = module.weight.shape
        plan = plan_of(module)
        words = [pack.data_ptr(), n, k, 0 if bias is None else bias.data_ptr(),
                 0 if plan is None else plan.mask_of(AMX), len(ROW_UPPER), *ROW_UPPER]
        ctx = (ctypes.c_int64 * len(words))(*words)
        fn = ctypes.cast(lib.vllm_linear_bf16_packed, ctypes.c_void_p).value
        return fn, ctx, plan_of(module), NATIVE
    if _int4_weights(module):
        from vllm.cpu import quant_ops
        ctx = quant_ops.int4_ctx(module.w_q, module.w_scales, module.w_zeros, bias)
        return None if ctx is None else (quant_ops.int4_linear_fn(), ctx, None, INT4)
    return None


def _weight_key(module: Any) -> Optional[torch.Tensor]:
    module = _base(module)
    pack = native_pack(module)
    return pack if pack is not None else getattr(module, "w_q", None)


def packed_weight_of(layer: Any) -> tuple:
    """(qkv module, the native form of its weight: bf16 pack or int4 tensor), compared
    by identity: either changes when the weights are (re)packed or (re)loaded, or the
    layer is wrapped for LoRA."""
    attn = getattr(layer, "self_attn", None)
    qkv = getattr(attn, "qkv_proj", None)
    return (qkv, None if qkv is None else _weight_key(qkv))


def _ptr(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


def _modules(layer: Any) -> tuple:
    attn, mlp = layer.self_attn, layer.mlp
    return attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj


class _LayerArgs:
    """The pointers and sizes of one layer that do not change between steps."""

    def __init__(self, layer: Any, lib: ctypes.CDLL) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        mods = _modules(layer)
        self.projections = [_projection(m, lib) for m in mods]
        self.weights = _PtrArray10(
            layer.input_layernorm.weight.data_ptr(),
            layer.post_attention_layernorm.weight.data_ptr(),
            *[p for fn, ctx, _, _ in self.projections for p in (fn, ctypes.addressof(ctx))])
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
        from vllm.lora.layers import LoRALinear
        self.loras = [m if isinstance(m, LoRALinear) else None for m in mods]
        self.lora_ctx: Optional[ctypes.Array] = None
        self._lora_arrays: list = []


def layer_qualifies(layer: Any) -> bool:
    """Static checks of one decoder layer (see the module docstring)."""
    from vllm.distributed import get_tensor_model_parallel_world_size
    from vllm.model_executor.layers.activation import SiluAndMul
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None or not getattr(attn, "fused_decode_ok", False):
        return False
    mods = (getattr(attn, "qkv_proj", None), getattr(attn, "o_proj", None),
            getattr(mlp, "gate_up_proj", None), getattr(mlp, "down_proj", None))
    lib = get_native_lib()
    if lib is None or any(m is None or _projection(m, lib) is None for m in mods):
        return False
    rope = attn.rotary_emb
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    return (get_tensor_model_parallel_world_size() == 1
            and isinstance(getattr(mlp, "act_fn", None), SiluAndMul)
            and rope.cos_sin_cache.dtype == torch.bfloat16
            and rope.head_size == attn.head_dim
            and all(n.weight.dtype == torch.bfloat16 for n in norms)
            and norms[0].variance_epsilon == norms[1].variance_epsilon)


def _lora_context(wrapper: Any, max_rank: int) -> Optional[ctypes.Array]:
    """One projection's per-slot adapters for `lora_add`: {N, K, slots, (A, B, r)...};
    None when a slot's tensors are not bf16 / contiguous or its rank exceeds the native
    bound (the step then takes the module path)."""
    slots = len(wrapper.a_slots)
    words = [sum(wrapper.spec.out_sizes), wrapper.spec.in_features, slots]
    for a, b in zip(wrapper.a_slots, wrapper.b_slots):
        if a is None:
            words += [0, 0, 0]
            continue
        if (a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16 or not a.is_contiguous()
                or not b.is_contiguous() or a.shape[0] > max_rank):
            return None
        words += [a.data_ptr(), b.data_ptr(), a.shape[0]]
    return (ctypes.c_int64 * len(words))(*words)


class FusedDecode:
    """Runs decode-only steps of a model's own layers through the native layer call."""

    def __init__(self, layers: list[Any]) -> None:
        self.layers = layers
        self.lib = get_native_lib()
        self.args = [_LayerArgs(layer, self.lib) for layer in layers]
        self.plans = {id(p[2]): (p[2], p[3]) for a in self.args for p in a.projections}
        self._native_rows: dict[int, bool] = {}
        wrappers = [w for a in self.args for w in a.loras if w is not None]
        self.lora_batch = wrappers[0].batch if wrappers else None
        self._lora_version: Optional[int] = None
        self._lora_ok = False

    def native_for(self, rows: int) -> bool:
        """Whether the module path would run the same kernels at this row count: the
        measured choice (gemm_autotune.py) is the native GEMM, on bf16 dot products or
        AMX tiles, for every bf16 matmul (where oneDNN's kernel wins the layers run as
        modules instead; the layer's GEMMs read the AMX buckets from their context), and
        int4 layers are within the native int4 kernel's rows."""
        ok = self._native_rows.get(rows)
        if ok is None:
            from vllm.model_executor.layers.quantization.int_weights import native_max_rows
            ok = all(rows <= native_max_rows() if kind == INT4
                     else plan is not None and plan.kind_for(rows) in (NATIVE, AMX)
                     for plan, kind in self.plans.values())
            self._native_rows[rows] = ok
        return ok

    @classmethod
    def build(cls, layers: list[Any]) -> Optional["FusedDecode"]:
        """A runner when the native library is loaded and every layer qualifies."""
        if not layers or get_native_lib() is None:
            return None
        if not all(layer_qualifies(layer) for layer in layers):
            return None
        return cls(layers)

    def _lora_slots(self, n: int) -> Optional[torch.Tensor]:
        """Per-row slots of this step's adapters (int64 [n]), with every layer's LoRA
        contexts current; None when the native layer cannot apply them."""
        batch = self.lora_batch
        slots = getattr(batch, "token_slots", None)
        if batch.static_shapes or slots is None or len(slots) != n:
            return None
        if self._lora_version != batch.weights_version:
            self._lora_ok = self._build_lora_contexts()
            self._lora_version = batch.weights_version
        return torch.from_numpy(slots).to(torch.int64) if self._lora_ok else None

    def _build_lora_contexts(self) -> bool:
        max_rank = self.lib.vllm_max_lora_rank()
        for args in self.args:
            ctxs = [None if w is None else _lora_context(w, max_rank) for w in args.loras]
            if any(c is None and w is not None for c, w in zip(ctxs, args.loras)):
                return False
            args._lora_arrays = ctxs  # keeps the arrays alive while the pointers are used
            args.lora_ctx = _PtrArray4(*[0 if c is None else ctypes.addressof(c)
                                         for c in ctxs])
        return True

    def run(self, positions: torch.Tensor, hidden: torch.Tensor,
            residual: Optional[torch.Tensor]) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """(hidden, residual) after all layers, or None when this step does not fit
        (prefills in it, no native metadata, other dtypes, adapters the native layer
        cannot apply): the caller then runs the modules."""
        ctx = get_forward_context()
        md = getattr(ctx, "attn_metadata", None) if ctx is not None else None
        table = getattr(md, "decode_block_table", None)
        n = hidden.shape[0]
        if (table is None or md.num_decodes != n or not self.native_for(n)
                or hidden.dtype != torch.bfloat16
                or not hidden.is_contiguous() or hidden.dim() != 2
                or positions.dtype != torch.int64 or not positions.is_contiguous()):
            return None
        lora_slots = None
        if self.lora_batch is not None and self.lora_batch.active:
            lora_slots = self._lora_slots(n)
            if lora_slots is None:
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
        batch = _PtrArray8(positions.data_ptr(), a0.cos_sin.data_ptr(), 0, 0,
                           md.slot_mapping.data_ptr(), table.data_ptr(),
                           md.decode_seq_lens.data_ptr(), _ptr(lora_slots))
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
                 args.fshape, batch, bshape, args.lora_ctx if lora_slots is not None else None,
                 workspace.data_ptr(), threads)
            first = False
        return hidden, residual


def decode_runner(stack: Any) -> Optional[FusedDecode]:
    """The stack's native runner (None where it does not apply), rebuilt whenever the
    weights were (re)packed, or the layers wrapped (LoRA), since the last check."""
    if not stack.layers or torch.is_grad_enabled():
        return None
    key = packed_weight_of(stack.layers[0])
    old = stack.state.get("key")
    if not (isinstance(old, tuple) and all(a is b for a, b in zip(key, old))):
        stack.state.update(runner=FusedDecode.build(stack.layers), key=key)
    return stack.state["runner"]


def fused_decode_layers_cpu(self: Any, positions: torch.Tensor, hidden: torch.Tensor,
                            residual: Optional[torch.Tensor]
                            ) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """The CPU forward of `DecoderStack`: (hidden, residual) after all layers, or None
    (the model then runs its modules)."""
    runner = decode_runner(self)
    return None if runner is None else runner.run(positions, hidden, residual)
