"""What the LayerNorm decoders with one fused `query_key_value` share (Falcon, GPT-NeoX).

Their checkpoints store q, k and v in one tensor whose row layout differs per family
(per head `[q, k, v]`, or per KV group `[q..., k, v]`). Each family gives a
`split_qkv(tensor) -> (q, k, v)` that reads its layout; the attention below holds a
regular `QKVParallelLinear`, so TP sharding (KV heads replicated when there are fewer
of them than ranks) and the q/k/v views are the same as Llama's.

Layers take and return the hidden states (no residual travelling beside them: these
families add the residual inside the block, some in parallel with the MLP).
"""
from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from vllm.attention import Attention
from vllm.distributed import get_pp_group
from vllm.model_executor.layers.linear import (ColumnParallelLinear, QKVParallelLinear,
                                               RowParallelLinear)
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding, get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.models.utils import (PPMissingLayer, attach_lm_head, check_loaded,
                                              default_weight_loader, make_layers,
                                              partial_rotary_factor_of, rope_config)
from vllm.model_executor.kernels import drop_weight_copies
from vllm.sequence import IntermediateTensors


SplitQKV = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def split_per_head(num_heads: int, num_kv_heads: int, head_dim: int) -> SplitQKV:
    """Rows grouped per KV head as `[q * (heads / kv_heads), k, v]` (Falcon's new
    decoder architecture; with kv_heads == heads this is the `[q, k, v]`-per-head
    layout of BLOOM, GPT-NeoX and the first Falcons). Works on weights [rows, in]
    and biases [rows]."""
    groups = num_heads // num_kv_heads

    def split(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = t.reshape(num_kv_heads, groups + 2, head_dim, *t.shape[1:])
        q = g[:, :groups].reshape(num_heads * head_dim, *t.shape[1:])
        k = g[:, groups].reshape(num_kv_heads * head_dim, *t.shape[1:])
        v = g[:, groups + 1].reshape(num_kv_heads * head_dim, *t.shape[1:])
        return q, k, v
    return split


def split_blocks(num_heads: int, num_kv_heads: int, head_dim: int) -> SplitQKV:
    """Rows as `[all q heads, all k heads, all v heads]` (Falcon-7B's multi-query)."""
    sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
    return lambda t: tuple(t.split(sizes, dim=0))  # type: ignore[return-value]


def gelu_of(act: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The MLP activation of an HF name ('gelu' exact, 'gelu_new' / 'gelu_pytorch_tanh'
    / 'gelu_fast' tanh); other names are refused."""
    if act == "gelu":
        return F.gelu
    if act in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return lambda x: F.gelu(x, approximate="tanh")
    raise ValueError(f"activation {act!r} is not supported; expected one of 'gelu', "
                     "'gelu_new', 'gelu_pytorch_tanh', 'gelu_fast'.")


class FusedQKVAttention(nn.Module):
    """query_key_value -> rotary -> paged attention -> dense (TP: heads split)."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 rotary_emb: RotaryEmbedding, bias: bool, split_qkv: SplitQKV,
                 prefix: str = "") -> None:
        super().__init__()
        self.query_key_value = QKVParallelLinear(hidden_size, head_dim, num_heads,
                                                 num_kv_heads, bias=bias,
                                                 prefix=f"{prefix}.query_key_value")
        self.dense = RowParallelLinear(num_heads * head_dim, hidden_size, bias=bias,
                                       prefix=f"{prefix}.dense")
        qkv = self.query_key_value
        self.q_size, self.kv_size = qkv.q_size, qkv.kv_size
        self.rotary_emb = rotary_emb
        self.split_qkv = split_qkv
        self.attn = Attention(qkv.num_heads, head_dim, head_dim ** -0.5, qkv.num_kv_heads,
                              prefix=f"{prefix}.attn")
        for p in self.query_key_value.parameters():
            p.weight_loader = self._load_fused

    def _load_fused(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        """The checkpoint's fused tensor, in the family's layout, as q / k / v parts."""
        for sid, part in zip("qkv", self.split_qkv(loaded)):
            self.query_key_value.weight_loader(param, part, sid)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        q, k, v = self.query_key_value(hidden_states).split(
            [self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        return self.dense(self.attn(q, k, v))


class GeluMLP(nn.Module):
    """dense_h_to_4h -> GELU -> dense_4h_to_h."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str, bias: bool,
                 prefix: str = "") -> None:
        super().__init__()
        self.dense_h_to_4h = ColumnParallelLinear(hidden_size, intermediate_size, bias=bias,
                                                  prefix=f"{prefix}.dense_h_to_4h")
        self.dense_4h_to_h = RowParallelLinear(intermediate_size, hidden_size, bias=bias,
                                               prefix=f"{prefix}.dense_4h_to_h")
        self.act = gelu_of(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(self.act(self.dense_h_to_4h(x)))


class GPTStyleModel(nn.Module):
    """Embedding (first PP stage), this stage's blocks, final LayerNorm (last stage).

    Subclasses set the module names of their checkpoints (`embed_name`, `layers_name`,
    `norm_name`) and build a block with `make_block(prefix)`.
    """

    embed_name = "word_embeddings"
    layers_name = "h"
    norm_name = "ln_f"

    def __init__(self, config: Any, prefix: str) -> None:
        super().__init__()
        self.config = config
        pp = get_pp_group()
        self.is_first_stage, self.is_last_stage = pp.is_first_rank, pp.is_last_rank
        embed = (VocabParallelEmbedding(config.vocab_size, config.hidden_size,
                                        prefix=f"{prefix}.{self.embed_name}")
                 if self.is_first_stage else PPMissingLayer())
        setattr(self, self.embed_name, embed)
        # One rotary module shared by all layers (one cos/sin cache).
        self.rotary_emb = self.build_rotary_emb(config)
        self.start_layer, self.end_layer, layers = make_layers(
            config.num_hidden_layers, self.make_block, f"{prefix}.{self.layers_name}")
        setattr(self, self.layers_name, layers)
        self._own_layers = list(layers)[self.start_layer:self.end_layer]
        norm = (nn.LayerNorm(config.hidden_size, eps=self.layer_norm_eps())
                if self.is_last_stage else PPMissingLayer())
        setattr(self, self.norm_name, norm)

    def build_rotary_emb(self, config: Any) -> RotaryEmbedding:
        """Neox-style rotary over the first `partial_rotary_factor` of each head."""
        head_dim = config.hidden_size // config.num_attention_heads
        theta, scaling = rope_config(config)
        return get_rope(head_dim, int(head_dim * partial_rotary_factor_of(config)),
                        config.max_position_embeddings, theta, scaling)

    def layer_norm_eps(self) -> float:
        return float(self.config.layer_norm_epsilon)

    def make_block(self, prefix: str) -> nn.Module:
        raise NotImplementedError

    @property
    def embedding(self) -> nn.Module:
        return getattr(self, self.embed_name)

    def forward(self, input_ids: Optional[torch.Tensor], positions: torch.Tensor,
                intermediate_tensors: Optional[IntermediateTensors] = None,
                inputs_embeds: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, IntermediateTensors]:
        if self.is_first_stage:
            hidden = inputs_embeds if inputs_embeds is not None else self.embedding(input_ids)
        else:
            if intermediate_tensors is None:
                raise ValueError("a later pipeline stage needs intermediate_tensors.")
            hidden = intermediate_tensors["hidden_states"]
        for layer in self._own_layers:
            hidden = layer(positions, hidden)
        if not self.is_last_stage:
            return IntermediateTensors({"hidden_states": hidden})
        return getattr(self, self.norm_name)(hidden)


class GPTStyleForCausalLM(nn.Module):
    """Decoder under `base_name` + LM head under `head_name`; loads HF checkpoints."""

    model_cls: type[GPTStyleModel] = GPTStyleModel
    base_name = "transformer"
    head_name = "lm_head"

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        base = self.model_cls(config, prefix=self.base_name)
        setattr(self, self.base_name, base)
        self.start_layer, self.end_layer = base.start_layer, base.end_layer
        attach_lm_head(self, config, self.head_name, base.is_first_stage, base.is_last_stage,
                       base.embedding if self.tie_word_embeddings else None)
        if self.head_name != "lm_head":
            setattr(self, self.head_name, self.lm_head)
            del self.lm_head

    @property
    def base(self) -> GPTStyleModel:
        return getattr(self, self.base_name)

    @property
    def head(self) -> nn.Module:
        return getattr(self, self.head_name)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                intermediate_tensors: Optional[IntermediateTensors] = None,
                inputs_embeds: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, IntermediateTensors]:
        return self.base(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not self.base.is_last_stage:
            raise RuntimeError("compute_logits runs on the last pipeline stage only.")
        return self.logits_processor(self.head, hidden_states)

    def make_empty_intermediate_tensors(self, batch_size: int, dtype: torch.dtype,
                                        device: Union[str, torch.device]) -> IntermediateTensors:
        shape = (batch_size, self.config.hidden_size)
        return IntermediateTensors({"hidden_states": torch.zeros(shape, dtype=dtype,
                                                                 device=device)})

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy HF-named tensors into this rank's parameters (the fused qkv through its
        family's layout). With tied embeddings the head's own tensor is skipped (a last
        PP stage without the embedding loads the embedding's). Tensors of other stages
        are skipped; ValueError if a parameter received nothing."""
        drop_weight_copies(self)
        params = dict(self.named_parameters())
        embed = f"{self.base_name}.{self.base.embed_name}.weight"
        head = f"{self.head_name}.weight"
        loaded: set[str] = set()
        ignored: list[str] = []
        for name, tensor in weights:
            if "rotary_emb." in name or name.endswith((".attention.bias",
                                                       ".attention.masked_bias")):
                continue  # buffers of old checkpoints
            if self.tie_word_embeddings and name == head:
                continue
            if self.tie_word_embeddings and name == embed and embed not in params \
                    and head in params:
                name = head
            if name not in params:
                if not self._on_other_stage(name):
                    ignored.append(name)
                continue
            param = params[name]
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        return check_loaded(params, loaded, ignored)

    def _on_other_stage(self, name: str) -> bool:
        m = re.match(rf"{self.base_name}\.{self.base.layers_name}\.(\d+)\.", name)
        if m:
            return not self.start_layer <= int(m.group(1)) < self.end_layer
        if name.startswith(f"{self.base_name}.{self.base.embed_name}."):
            return not self.base.is_first_stage
        if name.startswith((f"{self.base_name}.{self.base.norm_name}.", self.head_name)):
            return not self.base.is_last_stage
        return False
