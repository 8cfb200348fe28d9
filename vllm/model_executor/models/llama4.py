"""Llama 4 Scout / Maverick, the language model (`Llama4ForCausalLM`; the text half of
`Llama4ForConditionalGeneration` checkpoints is `language_model.*`).

Attention, per layer (`no_rope_layers[i]`: 1 = RoPE):
- RoPE layers: interleaved-pair rotary, then (`use_qk_norm`) a weightless L2 norm of
  each head of q and k, and chunked local attention: the sequence is cut into chunks
  of `attention_chunk_size` positions and a query sees only its own chunk (causally);
- NoPE layers (every fourth): no rotary, global causal attention, and with
  `attn_temperature_tuning` the query scaled by
  `log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1` (long-context tuning).

Feed-forward: `moe_layers` hold a MoE block, the others a dense SwiGLU MLP of
`intermediate_size_mlp`. The MoE block: a router picks the top-1 expert by logit, its
sigmoid score scales the token *before* the expert (not its output), and a shared
expert adds its own SwiGLU output. Experts are stored stacked, [E, H, 2I] gate|up and
[E, I, H] down (transposed to the FusedMoE layout at load time).
"""
from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch import nn

from vllm.attention.layer import extract_layer_index
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding, get_rope
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.models.llama import (LlamaAttention, LlamaDecoderLayer,
                                              LlamaForCausalLM, LlamaMLP, LlamaModel)
from vllm.model_executor.models.mixtral import MoECausalLMMixin
from vllm.model_executor.models.qwen2_moe import SharedExpertMLP
from vllm.model_executor.models.transformers.moe import TransformersExperts
from vllm.model_executor.models.utils import head_dim_of, rope_config


def uses_rope(config: Any, layer_idx: int) -> bool:
    layers = getattr(config, "no_rope_layers", None)
    return bool(layers[layer_idx]) if layers else True


class Llama4Attention(LlamaAttention):
    """Rotary + L2 q/k norm + chunked attention, or NoPE + temperature tuning."""

    fused_decode_ok = False  # norms / scaling / chunking the native layer call lacks

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding, prefix: str = "") -> None:
        super().__init__(config, rotary_emb, prefix)
        idx = extract_layer_index(prefix)
        self.use_rope = uses_rope(config, idx)
        self.qk_norm_eps = (float(config.rms_norm_eps)
                            if getattr(config, "use_qk_norm", False) and self.use_rope
                            else None)
        self.temperature = (getattr(config, "attn_temperature_tuning", False)
                            and not self.use_rope)
        self.floor_scale = float(getattr(config, "floor_scale", 8192))
        self.attn_scale = float(getattr(config, "attn_scale", 0.1))
        chunk = getattr(config, "attention_chunk_size", None)
        if self.use_rope and chunk:
            self.attn.attention_chunk_size = int(chunk)

    def _l2(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        t = x.shape[0]
        xf = x.view(t, heads, self.head_dim).float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.qk_norm_eps)
        return xf.to(x.dtype).view(t, -1)

    def rotate_qk(self, positions: torch.Tensor, qkv: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.use_rope:
            q, k = self.rotary_emb(positions, q.contiguous(), k.contiguous())
        if self.qk_norm_eps is not None:
            q, k = self._l2(q, self.num_heads), self._l2(k, self.num_kv_heads)
        if self.temperature:
            scale = torch.log1p(torch.floor((positions.float() + 1.0) / self.floor_scale))
            q = (q.float() * (scale * self.attn_scale + 1.0)[:, None]).to(q.dtype)
        return q, k, v


class Llama4MoE(nn.Module):
    """Top-1 router scaling the expert's input, routed experts, a shared expert."""

    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        self.top_k = int(config.num_experts_per_tok)
        if self.top_k != 1:
            raise ValueError(f"Llama 4 MoE with num_experts_per_tok={self.top_k} is not "
                             "supported (its router scales the expert input: top-1 only).")
        hidden, experts = config.hidden_size, config.num_local_experts
        self.router = ReplicatedLinear(hidden, experts, bias=False, prefix=f"{prefix}.router")
        self.experts = TransformersExperts(experts, 1, hidden, config.intermediate_size,
                                           renormalize=False, reduce_results=True,
                                           prefix=f"{prefix}.experts")
        self.shared_expert = SharedExpertMLP(hidden, config.intermediate_size,
                                             prefix=f"{prefix}.shared_expert")
        self.tp_size = get_tensor_model_parallel_world_size()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.router(hidden_states)
        top, ids = logits.topk(1, dim=-1)
        scaled = hidden_states * torch.sigmoid(top.float()).to(hidden_states.dtype)
        routed = self.experts(scaled, ids, torch.ones_like(top))
        shared = self.shared_expert(hidden_states)
        if self.tp_size > 1:
            from vllm.distributed import tensor_model_parallel_all_reduce
            shared = tensor_model_parallel_all_reduce(shared)
        return routed + shared


class Llama4DecoderLayer(LlamaDecoderLayer):
    attention_cls = Llama4Attention

    def build_mlp(self, config: Any, prefix: str) -> nn.Module:
        moe_layers = getattr(config, "moe_layers", None) or []
        if extract_layer_index(prefix) in moe_layers:
            return Llama4MoE(config, prefix=prefix)
        return LlamaMLP(config.hidden_size, config.intermediate_size_mlp, config.hidden_act,
                        prefix=prefix)


class Llama4Model(LlamaModel):
    layer_cls = Llama4DecoderLayer

    def build_rotary_emb(self, config: Any) -> RotaryEmbedding:
        """Rotary over interleaved pairs (Llama 4 rotates complex pairs)."""
        head_dim = head_dim_of(config)
        theta, scaling = rope_config(config)
        return get_rope(head_dim, head_dim, config.max_position_embeddings, theta, scaling,
                        is_neox_style=False)


class Llama4ForCausalLM(MoECausalLMMixin, LlamaForCausalLM):
    model_cls = Llama4Model

    def _param_name(self, name: str) -> tuple[str, Optional[Union[str, int, tuple]]]:
        return super()._param_name(name.replace(".feed_forward.", ".mlp."))

    def load_weights(self, weights: Any) -> set[str]:
        """Stacked expert tensors go expert by expert into the FusedMoE layout."""
        return super().load_weights(_unstack_experts(weights))


def _unstack_experts(weights: Any):
    """`experts.gate_up_proj` [E, H, 2I] -> per-expert gate / up [I, H] tensors and
    `experts.down_proj` [E, I, H] -> per-expert down [H, I], named as FusedMoE's
    per-expert loader expects; every other tensor as it is."""
    for name, tensor in weights:
        if name.endswith(".experts.gate_up_proj"):
            base = name[:-len("gate_up_proj")]
            inter = tensor.shape[2] // 2
            for e in range(tensor.shape[0]):
                yield f"{base}{e}.gate_proj.weight", tensor[e, :, :inter].t()
                yield f"{base}{e}.up_proj.weight", tensor[e, :, inter:].t()
        elif name.endswith(".experts.down_proj"):
            base = name[:-len("down_proj")]
            for e in range(tensor.shape[0]):
                yield f"{base}{e}.down_proj.weight", tensor[e].t()
        else:
            yield name, tensor


class Llama4ForConditionalGeneration(nn.Module):
    """A Llama 4 multimodal checkpoint served as its language model alone.

    The vision encoder (early fusion) is not implemented here, so the model is built
    only with `--limit-mm-per-prompt '{"image": 0}'` (vLLM's way to run a multimodal
    model text-only); its vision and projector tensors are skipped at load time."""

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        from vllm.model_executor.models.llava import text_vllm_config
        from vllm.multimodal.processing import mm_limit
        model_config = vllm_config.model_config
        if mm_limit(model_config.limit_mm_per_prompt, "image") != 0:
            raise ValueError("Llama 4's vision encoder is not supported yet; serve the "
                             "language model alone with --limit-mm-per-prompt "
                             "'{\"image\": 0}' (LLM(limit_mm_per_prompt={\"image\": 0})).")
        self.config = model_config.hf_config
        self.language_model = Llama4ForCausalLM(vllm_config=text_vllm_config(vllm_config),
                                                prefix="language_model")
        self.start_layer = self.language_model.start_layer
        self.end_layer = self.language_model.end_layer

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.model.embed_tokens(input_ids)

    def forward(self, input_ids: Optional[torch.Tensor], positions: torch.Tensor,
                intermediate_tensors: Any = None,
                inputs_embeds: Optional[torch.Tensor] = None) -> Any:
        return self.language_model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.language_model.compute_logits(hidden_states)

    def make_empty_intermediate_tensors(self, *args: Any, **kwargs: Any) -> Any:
        return self.language_model.make_empty_intermediate_tensors(*args, **kwargs)

    def load_weights(self, weights: Any) -> set[str]:
        """`language_model.*` (or transformers 5's `model.language_model.*`) to the
        language model; the vision tower's and projector's tensors are skipped."""
        def text_only():
            for name, tensor in weights:
                if name.startswith("model.language_model."):
                    name = "model." + name[len("model.language_model."):]
                elif name.startswith("language_model."):
                    name = name[len("language_model."):]
                elif name.startswith("lm_head."):
                    pass
                else:
                    continue  # vision_model.*, multi_modal_projector.*
                yield name, tensor
        loaded = self.language_model.load_weights(text_only())
        return {f"language_model.{n}" for n in loaded}
