"""Llama-family decoder (Llama 2/3, SmolLM, Mistral), the base of the Qwen models.

Inputs are flattened token-major: `input_ids[T]`, `positions[T]` for all the
sequences of a step. Each class below has one hook (`attention_cls`, `layer_cls`,
`model_cls`, `projection_biases`, `rotate_qk`) so Qwen2/Qwen3 only state their
differences.

KV cache indexing: every `Attention` is built with a prefix containing
`layers.{i}.` where i is the GLOBAL decoder-layer index (also on later pipeline
stages). The model runner passes the forward context a list indexed by that global
index: on stage s only entries [start_layer, end_layer) are read, so the others may
be anything (e.g. empty tensors).
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Optional, Union

import torch
from torch import nn

from vllm.attention import Attention
from vllm.attention.layer import extract_layer_index
from vllm.distributed import get_pp_group
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.decoder_stack import DecoderStack
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear,
                                               RowParallelLinear)
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding, get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.models.utils import (PPMissingLayer, attach_lm_head, check_loaded,
                                              default_weight_loader, head_dim_of, make_layers,
                                              partial_rotary_factor_of, rope_config,
                                              sliding_window_of)
from vllm.model_executor.kernels import drop_weight_copies
from vllm.sequence import IntermediateTensors


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)), gate and up in one matmul."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str,
                 bias: bool = False, prefix: str = "") -> None:
        super().__init__()
        if hidden_act != "silu":
            raise ValueError(f"hidden_act={hidden_act!r} is not supported; only 'silu'.")
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2,
                                                       bias=bias, prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias,
                                           prefix=f"{prefix}.down_proj")
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaAttention(nn.Module):
    """qkv projection -> rotary -> paged attention -> output projection."""

    fused_decode_ok = True
    """Decode steps may run this layer natively (vllm/cpu/fused_decode.py): rotate_qk
    is plain."""

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding, prefix: str = "") -> None:
        super().__init__()
        self.head_dim = head_dim_of(config)
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        qkv_bias, o_bias = self.projection_biases(config)
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, total_heads,
                                          total_kv_heads, bias=qkv_bias,
                                          prefix=f"{prefix}.qkv_proj")
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, config.hidden_size,
                                        bias=o_bias, prefix=f"{prefix}.o_proj")
        self.rotary_emb = rotary_emb
        window = sliding_window_of(config, extract_layer_index(prefix)) if prefix else None
        if window is not None:
            self.fused_decode_ok = False  # the native layer call attends to everything
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim ** -0.5,
                              self.num_kv_heads, prefix=f"{prefix}.attn",
                              per_layer_sliding_window=window)

    @staticmethod
    def projection_biases(config: Any) -> tuple[bool, bool]:
        """(bias of qkv_proj, bias of o_proj)."""
        bias = bool(getattr(config, "attention_bias", False))
        return bias, bias

    def rotate_qk(self, positions: torch.Tensor, qkv: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Split the fused projection into q, k, v and rotate q and k.

        q and k sit side by side in `qkv`; on CPU the native kernel rotates both in
        one pass, in place, and the results are views of `qkv`.
        """
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        return q, k, v

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        q, k, v = self.rotate_qk(positions, self.qkv_proj(hidden_states))
        return self.o_proj(self.attn(q, k, v))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block; the residual travels beside the hidden states (fused adds)."""

    attention_cls: type[LlamaAttention] = LlamaAttention

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding, prefix: str = "") -> None:
        super().__init__()
        self.self_attn = self.attention_cls(config, rotary_emb, prefix=f"{prefix}.self_attn")
        self.mlp = self.build_mlp(config, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def build_mlp(self, config: Any, prefix: str) -> nn.Module:
        """The feed-forward block (MoE models return their sparse block here)."""
        return LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act,
                        bias=bool(getattr(config, "mlp_bias", False)), prefix=prefix)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class LlamaModel(nn.Module):
    """Embedding, this stage's decoder layers, final norm (embedding only on the first
    pipeline stage, norm only on the last)."""

    layer_cls: type[LlamaDecoderLayer] = LlamaDecoderLayer

    def __init__(self, vllm_config: Any, prefix: str = "model") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.embedding_multiplier = 1.0
        """Scales the input embeddings (Granite's multiplier, Gemma's sqrt(hidden))."""
        pp = get_pp_group()
        self.is_first_stage, self.is_last_stage = pp.is_first_rank, pp.is_last_rank
        self.embed_tokens = (VocabParallelEmbedding(config.vocab_size, config.hidden_size,
                                                    prefix=f"{prefix}.embed_tokens")
                             if self.is_first_stage else PPMissingLayer())
        # One rotary module per model, shared by all its layers (one cos/sin cache).
        self.rotary_emb = self.build_rotary_emb(config)
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers, lambda p: self.make_layer(config, p), f"{prefix}.layers")
        # A plain list (not registered) so the forward loop does no ModuleList slicing.
        self._own_layers = list(self.layers)[self.start_layer:self.end_layer]
        # Decode-only steps as one kernel call per layer where the platform has one.
        self.fused_layers = DecoderStack(self._own_layers)
        self.norm = (RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
                     if self.is_last_stage else PPMissingLayer())

    def build_rotary_emb(self, config: Any) -> RotaryEmbedding:
        head_dim = head_dim_of(config)
        theta, scaling = rope_config(config)
        return get_rope(head_dim, int(head_dim * partial_rotary_factor_of(config)),
                        config.max_position_embeddings, theta, scaling)

    def make_layer(self, config: Any, prefix: str) -> nn.Module:
        """Decoder layer at `prefix` (models with per-layer rotary tables override)."""
        return self.layer_cls(config, self.rotary_emb, prefix=prefix)

    def forward(self, input_ids: Optional[torch.Tensor], positions: torch.Tensor,
                intermediate_tensors: Optional[IntermediateTensors] = None,
                inputs_embeds: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, IntermediateTensors]:
        if self.is_first_stage:
            hidden = inputs_embeds if inputs_embeds is not None else self.embed_tokens(input_ids)
            if self.embedding_multiplier != 1.0:
                hidden = hidden * self.embedding_multiplier
            residual = None
        else:
            if intermediate_tensors is None:
                raise ValueError("a later pipeline stage needs intermediate_tensors.")
            hidden = intermediate_tensors["hidden_states"]
            residual = intermediate_tensors["residual"]
        done = self.fused_layers(positions, hidden, residual) if self._own_layers else None
        if done is not None:
            hidden, residual = done
        else:
            for layer in self._own_layers:
                hidden, residual = layer(positions, hidden, residual)
        if not self.is_last_stage:
            return IntermediateTensors({"hidden_states": hidden, "residual": residual})
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    """Decoder + LM head; loads HF checkpoints (see `load_weights`)."""

    model_cls: type[LlamaModel] = LlamaModel
    # Fused parameter -> the checkpoint tensors it is made of (vLLM's attribute name).
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                              "gate_up_proj": ["gate_proj", "up_proj"]}
    _stacked_params = (("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"),
                       ("qkv_proj", "v_proj", "v"), ("gate_up_proj", "gate_proj", 0),
                       ("gate_up_proj", "up_proj", 1))

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.model = self.model_cls(vllm_config, prefix=f"{prefix}.model" if prefix else "model")
        # Global indices of this stage's decoder layers (the runner sizes KV caches by them).
        self.start_layer, self.end_layer = self.model.start_layer, self.model.end_layer
        attach_lm_head(self, config, f"{prefix}.lm_head" if prefix else "lm_head",
                       self.model.is_first_stage, self.model.is_last_stage,
                       self.model.embed_tokens if self.tie_word_embeddings else None)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                intermediate_tensors: Optional[IntermediateTensors] = None,
                inputs_embeds: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, IntermediateTensors]:
        """Hidden states [T, hidden] on the last PP stage, else IntermediateTensors."""
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, vocab_size], the full vocabulary on every TP rank."""
        if not self.model.is_last_stage:
            raise RuntimeError("compute_logits runs on the last pipeline stage only.")
        return self.logits_processor(self.lm_head, hidden_states)

    def make_empty_intermediate_tensors(self, batch_size: int, dtype: torch.dtype,
                                        device: Union[str, torch.device]) -> IntermediateTensors:
        """Buffers a later PP stage receives into (shape [batch_size, hidden])."""
        shape = (batch_size, self.config.hidden_size)
        return IntermediateTensors({k: torch.zeros(shape, dtype=dtype, device=device)
                                    for k in ("hidden_states", "residual")})

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy HF-named checkpoint tensors into this rank's (sharded, fused) parameters.

        q/k/v_proj go into qkv_proj and gate/up_proj into gate_up_proj; rotary
        buffers saved by old checkpoints are skipped; with tied embeddings
        `lm_head.weight` is ignored (and `embed_tokens` feeds the LM head on a last
        stage that has no embedding). Tensors of other pipeline stages are skipped.
        Raises ValueError if a parameter of this rank received nothing.
        """
        drop_weight_copies(self)  # packs are copies of the old values
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        ignored: list[str] = []
        for name, tensor in weights:
            if "rotary_emb." in name or (self.tie_word_embeddings and
                                         name.startswith("lm_head.")):
                continue
            target, shard_id = self._param_name(name)
            if target not in params:
                if (self.tie_word_embeddings and target == "model.embed_tokens.weight"
                        and "lm_head.weight" in params):
                    target = "lm_head.weight"
                elif self._on_other_stage(target):
                    continue
                else:
                    ignored.append(name)
                    continue
            param = params[target]
            loader = getattr(param, "weight_loader", default_weight_loader)
            if shard_id is None:
                loader(param, tensor)
            elif isinstance(shard_id, tuple):  # e.g. (shard, expert id) of an MoE weight
                loader(param, tensor, *shard_id)
            else:
                loader(param, tensor, shard_id)
            loaded.add(target)
        return check_loaded(params, loaded, ignored)

    def _param_name(self, name: str) -> tuple[str, Optional[Union[str, int, tuple]]]:
        """(parameter name, shard id for its weight_loader, or None) of a checkpoint
        tensor."""
        for param_name, shard_name, shard_id in self._stacked_params:
            if f".{shard_name}." in name:
                return name.replace(f".{shard_name}.", f".{param_name}."), shard_id
        return name, None

    def _on_other_stage(self, name: str) -> bool:
        m = re.match(r"model\.layers\.(\d+)\.", name)
        if m:
            return not self.model.start_layer <= int(m.group(1)) < self.model.end_layer
        if name.startswith("model.embed_tokens."):
            return not self.model.is_first_stage
        if name.startswith(("model.norm.", "lm_head.")):
            return not self.model.is_last_stage
        return False
