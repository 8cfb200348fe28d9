"""GPT-OSS (`GptOssForCausalLM`, OpenAI's gpt-oss-20b / -120b): a pre-norm GQA decoder
with a sparse MoE feed-forward in every layer.

Attention: q/k/v and o projections with biases, neox-style YaRN rotary (the config's
`rope_parameters`, `truncate: false`), layers alternating between a sliding window
(`sliding_window`, 128 in the released configs) and full attention (`layer_types`),
and a learned **sink** per head: one more logit in each softmax denominator
(`self_attn.sinks`, float32, this rank's heads; every attention backend honours
`Attention(sinks=...)`).

MoE: a router `Linear` with bias; top-k of its logits, then the softmax over those k
(the same weights as the softmax over all experts renormalized over the k: `FusedMoE`
with `renormalize=True`); experts with biases and the clamped SwiGLU variant
(`swigluoai`: gate clamped above at `swiglu_limit`, up to +-limit, `(up + 1) * gate *
sigmoid(1.702 * gate)`). The experts run in `FusedMoE` (its torch, CPU and HPU
forwards) rather than a module of their own: routing, TP slicing, expert parallelism
and the platform kernels are shared with the other MoE models; only the activation and
the biases were added there.

Checkpoints stack all experts in one tensor per projection: `experts.gate_up_proj`
[E, H, 2I] with gate and up *interleaved* along the last dimension (even columns gate,
odd up), `experts.down_proj` [E, I, H] ([in, out] per expert), and
`gate_up_proj_bias` [E, 2I] (interleaved too) / `down_proj_bias` [E, H]. The loader
cuts them per expert and de-interleaves, so `w13_weight` holds [gate | up]. The
published MXFP4 checkpoints (`quantization_config.quant_method == "mxfp4"`) store the
expert weights as `<proj>_blocks` + `<proj>_scales` in [E, out, in] order; they are
dequantized to the model dtype expert by expert at load time
(layers/quantization/mxfp4.py).

transformers' RMSNorm here multiplies by the weight in float32 before the cast back;
ours casts first (Llama's order): the same in float32, one rounding apart in bf16.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Iterator, Optional, Union

import torch
from torch import nn

from vllm.attention import Attention
from vllm.attention.layer import extract_layer_index
from vllm.distributed import (get_tensor_model_parallel_rank,
                              get_tensor_model_parallel_world_size)
from vllm.model_executor.layers.fused_moe import FusedMoE
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.quantization.mxfp4 import dequantize_mxfp4
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.model_executor.models.llama import (LlamaAttention, LlamaDecoderLayer,
                                              LlamaForCausalLM, LlamaModel)
from vllm.model_executor.models.mixtral import MoECausalLMMixin
from vllm.model_executor.models.utils import sliding_window_of


class GptOssAttention(LlamaAttention):
    """Llama's projections (all with biases) and rotary, a per-layer window, sinks."""

    fused_decode_ok = False  # the native decode layer knows no sinks

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding, prefix: str = "") -> None:
        super().__init__(config, rotary_emb, prefix)
        self.sinks = nn.Parameter(torch.zeros(self.num_heads, dtype=torch.float32),
                                  requires_grad=False)
        self.sinks.weight_loader = self._load_sinks
        window = sliding_window_of(config, extract_layer_index(prefix))
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim ** -0.5,
                              self.num_kv_heads, prefix=f"{prefix}.attn",
                              per_layer_sliding_window=window, sinks=self.sinks)

    @staticmethod
    def projection_biases(config: Any) -> tuple[bool, bool]:
        bias = bool(getattr(config, "attention_bias", True))
        return bias, bias

    def _load_sinks(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """This rank's heads of the checkpoint's [total_heads] sinks."""
        total = self.num_heads * get_tensor_model_parallel_world_size()
        if tuple(loaded.shape) != (total,):
            raise ValueError(f"sinks of shape {tuple(loaded.shape)}; expected ({total},), "
                             "one per attention head.")
        first = get_tensor_model_parallel_rank() * self.num_heads
        param.data.copy_(loaded.narrow(0, first, self.num_heads))


class GptOssMoE(nn.Module):
    """Router (replicated `Linear` with bias) + `FusedMoE` experts (swigluoai, biases)."""

    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        self.router = ReplicatedLinear(config.hidden_size, config.num_local_experts,
                                       bias=True, prefix=f"{prefix}.router")
        self.experts = FusedMoE(
            config.num_local_experts, config.num_experts_per_tok, config.hidden_size,
            config.intermediate_size, renormalize=True, activation="swigluoai",
            has_bias=True, swiglu_limit=getattr(config, "swiglu_limit", 7.0),
            swiglu_alpha=getattr(config, "swiglu_alpha", 1.702), prefix=f"{prefix}.experts")

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.experts(hidden_states, self.router(hidden_states))


class GptOssDecoderLayer(LlamaDecoderLayer):
    attention_cls = GptOssAttention

    def build_mlp(self, config: Any, prefix: str) -> nn.Module:
        return GptOssMoE(config, prefix=prefix)


class GptOssModel(LlamaModel):
    layer_cls = GptOssDecoderLayer


_STACKED_EXPERTS = re.compile(
    r"^(?P<base>.*\.experts)\.(?P<proj>gate_up_proj|down_proj)"
    r"(?P<kind>|_bias|_blocks|_scales)$")
_EXPERT_BIAS = re.compile(r"\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.bias$")
_BIAS_SHARD = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def split_stacked_experts(weights: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype,
                          device: Optional[torch.device] = None
                          ) -> Iterator[tuple[str, torch.Tensor]]:
    """GPT-OSS's stacked expert tensors -> one tensor per expert and projection, named
    as the per-expert checkpoints of other MoE models (`experts.{e}.gate_proj.weight`
    [I, H], `up_proj`, `down_proj` [H, I], and `.bias`); MXFP4 blocks and scales are
    paired and dequantized to `dtype` one expert at a time, on `device` (the model's:
    the packed bytes travel, 4x smaller than the weights). Other tensors pass
    through."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        m = _STACKED_EXPERTS.match(name)
        if m is None:
            yield name, tensor
            continue
        base, proj, kind = m.group("base"), m.group("proj"), m.group("kind")
        if kind in ("_blocks", "_scales"):
            parts = pending.setdefault(f"{base}.{proj}", {})
            parts[kind] = tensor
            if len(parts) < 2:
                continue
            del pending[f"{base}.{proj}"]
            blocks, scales = parts["_blocks"], parts["_scales"]
            for e in range(blocks.shape[0]):
                w = dequantize_mxfp4(blocks[e].to(device), scales[e].to(device),
                                     dtype)  # [out, in]
                yield from _per_expert(base, proj, "weight", e, w)
        elif kind == "_bias":
            for e in range(tensor.shape[0]):
                yield from _per_expert(base, proj, "bias", e, tensor[e])
        else:  # [E, in, out]
            for e in range(tensor.shape[0]):
                yield from _per_expert(base, proj, "weight", e, tensor[e].t())
    if pending:
        raise ValueError(f"MXFP4 expert tensors without their pair: {sorted(pending)} "
                         "(each needs `_blocks` and `_scales`).")


def _per_expert(base: str, proj: str, kind: str, expert: int,
                t: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """t: one expert's [out, ...] weight or [out] bias, output rows interleaved gate/up
    for gate_up_proj."""
    if proj == "gate_up_proj":
        yield f"{base}.{expert}.gate_proj.{kind}", t[0::2]
        yield f"{base}.{expert}.up_proj.{kind}", t[1::2]
    else:
        yield f"{base}.{expert}.down_proj.{kind}", t


class GptOssForCausalLM(MoECausalLMMixin, LlamaForCausalLM):
    model_cls = GptOssModel

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config, prefix)
        self._load_dtype = vllm_config.model_config.torch_dtype

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        device = next(self.parameters()).device
        return super().load_weights(split_stacked_experts(weights, self._load_dtype, device))

    def _param_name(self, name: str) -> tuple[str, Optional[Union[str, int, tuple]]]:
        m = _EXPERT_BIAS.search(name)
        if m is not None:
            param = "w2_bias" if m.group(2) == "down_proj" else "w13_bias"
            return (f"{name[:m.start()]}.experts.{param}",
                    (_BIAS_SHARD[m.group(2)], int(m.group(1))))
        return super()._param_name(name)
