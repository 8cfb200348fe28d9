"""BLOOM: a pre-LayerNorm decoder with ALiBi attention instead of position embeddings.

- the word embeddings are followed by a LayerNorm (`word_embeddings_layernorm`);
- `query_key_value` is one fused projection whose output is laid out per head as
  [q, k, v] (`[num_heads, 3, head_dim]`), so a TP rank's contiguous slice of output
  rows is exactly its heads' q, k and v;
- ALiBi slopes as transformers computes them (`get_alibi_slopes`), each rank taking
  its heads' slopes;
- tanh-GELU MLP (`dense_h_to_4h`, `dense_4h_to_h`), biases everywhere, LayerNorms;
- `apply_residual_connection_post_layernorm` picks the residual (the normed input
  when set, the block input otherwise);
- the LM head is tied to the word embeddings.

Checkpoints name tensors `transformer.h.{i}...`; older ones (bigscience/bloom-560m)
drop the `transformer.` prefix, which `load_weights` adds back.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from vllm.attention import Attention
from vllm.attention.ops.alibi import get_alibi_slopes
from vllm.distributed import get_pp_group
from vllm.distributed.parallel_state import (get_tensor_model_parallel_rank,
                                             get_tensor_model_parallel_world_size)
from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear, divide
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.models.utils import (PPMissingLayer, attach_lm_head, check_loaded,
                                              default_weight_loader,
                                              make_layers)
from vllm.model_executor.kernels import drop_weight_copies
from vllm.sequence import IntermediateTensors


class BloomAttention(nn.Module):
    """Fused per-head qkv projection -> ALiBi paged attention -> dense."""

    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        hidden, total_heads = config.hidden_size, config.n_head
        tp_size, tp_rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        self.head_dim = divide(hidden, total_heads, "hidden_size per head")
        self.num_heads = divide(total_heads, tp_size, "attention heads per TP rank")
        self.query_key_value = ColumnParallelLinear(hidden, 3 * hidden, bias=True,
                                                    prefix=f"{prefix}.query_key_value")
        self.dense = RowParallelLinear(hidden, hidden, bias=True, prefix=f"{prefix}.dense")
        first = tp_rank * self.num_heads
        slopes = get_alibi_slopes(total_heads)[first:first + self.num_heads]
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim ** -0.5,
                              prefix=f"{prefix}.attn", alibi_slopes=slopes)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv = self.query_key_value(hidden_states)
        qkv = qkv.view(qkv.shape[0], self.num_heads, 3, self.head_dim)
        q, k, v = (qkv[:, :, i].reshape(qkv.shape[0], -1) for i in range(3))
        return self.dense(self.attn(q, k, v))


class BloomMLP(nn.Module):

    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        hidden = config.hidden_size
        self.dense_h_to_4h = ColumnParallelLinear(hidden, 4 * hidden, bias=True,
                                                  prefix=f"{prefix}.dense_h_to_4h")
        self.dense_4h_to_h = RowParallelLinear(4 * hidden, hidden, bias=True,
                                               prefix=f"{prefix}.dense_4h_to_h")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x), approximate="tanh"))


class BloomBlock(nn.Module):

    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        eps = config.layer_norm_epsilon
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=eps)
        self.self_attention = BloomAttention(config, prefix=f"{prefix}.self_attention")
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=eps)
        self.mlp = BloomMLP(config, prefix=f"{prefix}.mlp")
        self.residual_from_norm = bool(config.apply_residual_connection_post_layernorm)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        normed = self.input_layernorm(hidden_states)
        residual = normed if self.residual_from_norm else hidden_states
        hidden_states = self.self_attention(normed) + residual
        normed = self.post_attention_layernorm(hidden_states)
        residual = normed if self.residual_from_norm else hidden_states
        return self.mlp(normed) + residual


class BloomModel(nn.Module):
    """Embedding + its LayerNorm (first PP stage), this stage's blocks, final LayerNorm
    (last stage)."""

    def __init__(self, config: Any, prefix: str = "transformer") -> None:
        super().__init__()
        pp = get_pp_group()
        self.is_first_stage, self.is_last_stage = pp.is_first_rank, pp.is_last_rank
        hidden, eps = config.hidden_size, config.layer_norm_epsilon
        if self.is_first_stage:
            self.word_embeddings = VocabParallelEmbedding(config.vocab_size, hidden,
                                                          prefix=f"{prefix}.word_embeddings")
            self.word_embeddings_layernorm = nn.LayerNorm(hidden, eps=eps)
        else:
            self.word_embeddings = PPMissingLayer()
            self.word_embeddings_layernorm = PPMissingLayer()
        self.start_layer, self.end_layer, self.h = make_layers(
            config.n_layer, lambda p: BloomBlock(config, prefix=p), f"{prefix}.h")
        self.ln_f = nn.LayerNorm(hidden, eps=eps) if self.is_last_stage else PPMissingLayer()

    def forward(self, input_ids: Optional[torch.Tensor],
                intermediate_tensors: Optional[IntermediateTensors] = None,
                inputs_embeds: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, IntermediateTensors]:
        if self.is_first_stage:
            hidden = inputs_embeds if inputs_embeds is not None else self.word_embeddings(input_ids)
            hidden = self.word_embeddings_layernorm(hidden)
        else:
            if intermediate_tensors is None:
                raise ValueError("a later pipeline stage needs intermediate_tensors.")
            hidden = intermediate_tensors["hidden_states"]
        for layer in self.h[self.start_layer:self.end_layer]:
            hidden = layer(hidden)
        if not self.is_last_stage:
            return IntermediateTensors({"hidden_states": hidden})
        return self.ln_f(hidden)


class BloomForCausalLM(nn.Module):
    """BLOOM decoder + tied LM head; loads HF checkpoints (see `load_weights`)."""

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.transformer = BloomModel(config, prefix="transformer")
        self.start_layer, self.end_layer = self.transformer.start_layer, self.transformer.end_layer
        attach_lm_head(self, config, "lm_head", self.transformer.is_first_stage,
                       self.transformer.is_last_stage, self.transformer.word_embeddings)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                intermediate_tensors: Optional[IntermediateTensors] = None,
                inputs_embeds: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, IntermediateTensors]:
        """Hidden states [T, hidden] on the last PP stage. `positions` are unused: ALiBi
        takes its positions from the attention metadata."""
        return self.transformer(input_ids, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not self.transformer.is_last_stage:
            raise RuntimeError("compute_logits runs on the last pipeline stage only.")
        return self.logits_processor(self.lm_head, hidden_states)

    def make_empty_intermediate_tensors(self, batch_size: int, dtype: torch.dtype,
                                        device: Union[str, torch.device]) -> IntermediateTensors:
        shape = (batch_size, self.config.hidden_size)
        return IntermediateTensors({"hidden_states": torch.zeros(shape, dtype=dtype,
                                                                 device=device)})

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy HF-named tensors into this rank's parameters.

        `lm_head.weight` is tied to the word embeddings; on a last PP stage without
        the embedding, the LM head loads `word_embeddings.weight` itself. Tensors of
        other stages are skipped; ValueError if a parameter received nothing.
        """
        drop_weight_copies(self)
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        ignored: list[str] = []
        for name, tensor in weights:
            if not name.startswith(("transformer.", "lm_head.")):
                name = f"transformer.{name}"
            if name == "transformer.word_embeddings.weight" and "lm_head.weight" in params \
                    and not self.transformer.is_first_stage:
                name = "lm_head.weight"
            elif name.startswith("lm_head."):
                continue  # tied: the embedding is the LM head
            if name not in params:
                if not self._on_other_stage(name):
                    ignored.append(name)
                continue
            param = params[name]
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        return check_loaded(params, loaded, ignored)

    def _on_other_stage(self, name: str) -> bool:
        parts = name.split(".")
        if len(parts) > 2 and parts[1] == "h" and parts[2].isdigit():
            return not self.start_layer <= int(parts[2]) < self.end_layer
        if parts[1].startswith("word_embeddings"):
            return not self.transformer.is_first_stage
        if parts[1] == "ln_f":
            return not self.transformer.is_last_stage
        return False
