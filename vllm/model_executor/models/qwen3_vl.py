"""Qwen3-VL (Qwen3VLForConditionalGeneration): Qwen2.5-VL's frontend and M-RoPE
positions, a new vision tower, and a Qwen3 language model fed at several depths.

The processor, the placeholder expansion, the per-request M-RoPE positions and the
HPU patch buckets are Qwen2.5-VL's (qwen2_5_vl.py). What differs:

- Vision tower (`Qwen3_VisionTransformer`): the patch embedding has a bias; a learned
  square table of `num_position_embeddings` position embeddings is resampled to each
  image's patch grid (bilinear, corners aligned: each patch sums four table rows with
  weights the host computes, `Qwen3VisionInputs.pos_index` / `pos_weight`) and added
  to the patch embeddings; LayerNorm blocks with a `linear_fc1 -> act -> linear_fc2`
  MLP attend over each whole frame (no windows), with Qwen2.5-VL's 2D rotary and its
  per-image / padded-and-masked attention layouts.
- DeepStack: the outputs of the `deepstack_visual_indexes` blocks pass through mergers
  of their own (`deepstack_merger_list`, LayerNorm over the merged patches) and are
  added to the language model's hidden states after its first decoder layers, on the
  image tokens' rows only. The encoder returns, per image token, the main embedding and
  then the deepstack ones side by side ([tokens, hidden * (1 + k)]), so the encoder
  cache and the runner's merge into the pass's input embeddings carry them unchanged:
  the model's input embeddings are that wide too (`get_input_embeddings`: zeros past
  the first `hidden` columns, so text rows add nothing), and the language model splits
  them (`Qwen3LLMModel.forward`). A pass is one [rows, hidden * (1 + k)] tensor: the
  same shape whatever its images, which the HPU's fixed-shape prompt passes need.
- Language model: Qwen3 (per-head q/k RMSNorm) with interleaved M-RoPE: the t/h/w
  position rows take turns over the rotary frequencies (rotary_mrope.py), as
  transformers' Qwen3-VL always does.

Weight names follow transformers' Qwen3VLForConditionalGeneration (`model.visual.*`,
`model.language_model.*`, `lm_head.*`; the hub's older names load too).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from vllm.model_executor.layers.rotary_mrope import MRotaryEmbedding
from vllm.model_executor.models.clip import vision_activation
from vllm.model_executor.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration
from vllm.model_executor.models.qwen2_5_vl_vision import (AttnSegments,
                                                          Qwen2_5_VisionAttention,
                                                          Qwen2_5_VisionRotary, VisionInputs,
                                                          _grid_positions, build_vision_inputs)
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM, Qwen3Model
from vllm.model_executor.models.utils import head_dim_of, rope_config
from vllm.sequence import IntermediateTensors

_WHOLE_IMAGE = 1 << 30
"""A window wider than any image: one attention segment per frame."""

DEFAULT_MROPE_SECTION = [24, 20, 20]
"""transformers' Qwen3-VL default when the text config names none."""


# ------------------------------------------------------------------ vision tower
@dataclass
class Qwen3VisionInputs(VisionInputs):
    """Qwen2.5-VL's encoder inputs plus the position-table resampling taps."""
    pos_index: torch.Tensor = None  # type: ignore[assignment]
    """[P, 4] rows of the learned position table each patch mixes (padding: 0)."""
    pos_weight: torch.Tensor = None  # type: ignore[assignment]
    """[P, 4] float32 bilinear weights of those rows (padding: 0)."""


def _axis_taps(index: torch.Tensor, size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(taps [n, 2], weights [n, 2]) of positions `index` on an axis of `size` patches
    resampled from `side` table rows, corners aligned (first and last patch sit on the
    first and last row)."""
    src = index.to(torch.float32) * (side - 1) / max(size - 1, 1)
    low = torch.floor(src)
    frac = src - low
    low = low.long()
    taps = torch.stack((low, low + 1), dim=-1).clamp(0, side - 1)
    return taps, torch.stack((1 - frac, frac), dim=-1)


def position_table_taps(grids: Sequence[Sequence[int]], merge: int, side: int,
                        pad_to: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """([P, 4] table rows, [P, 4] weights) resampling a side x side position table to
    each image's (t, h, w) patch grid, patches in the processor's order (merge block by
    merge block, repeated per frame); zero rows for padding up to `pad_to`."""
    index, weight = [], []
    for t, h, w in grids:
        pos = torch.from_numpy(_grid_positions(t, h, w, merge))  # [t*h*w, 2] (row, col)
        row_taps, row_w = _axis_taps(pos[:, 0], h, side)
        col_taps, col_w = _axis_taps(pos[:, 1], w, side)
        index.append((row_taps[:, :, None] * side + col_taps[:, None, :]).reshape(-1, 4))
        weight.append((row_w[:, :, None] * col_w[:, None, :]).reshape(-1, 4))
    index_t, weight_t = torch.cat(index), torch.cat(weight)
    if pad_to is not None and pad_to > index_t.shape[0]:
        extra = pad_to - index_t.shape[0]
        index_t = torch.cat([index_t, index_t.new_zeros(extra, 4)])
        weight_t = torch.cat([weight_t, weight_t.new_zeros(extra, 4)])
    return index_t, weight_t


class Qwen3_VisionPatchEmbed(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        k = (config.temporal_patch_size, config.patch_size, config.patch_size)
        self.embed_dim = config.hidden_size
        self.proj = nn.Conv3d(config.in_channels, config.hidden_size, kernel_size=k, stride=k,
                              bias=True)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[P, C*T*p*p] -> [P, hidden]: a kernel as large as the patch is one matmul."""
        weight = self.proj.weight
        return F.linear(patches.to(weight.dtype), weight.view(self.embed_dim, -1),
                        self.proj.bias)


class Qwen3_VisionMLP(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=True)
        self.act = vision_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class Qwen3_VisionBlock(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=1e-6)
        self.attn = Qwen2_5_VisionAttention(config)
        self.mlp = Qwen3_VisionMLP(config)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                segments: AttnSegments) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope, segments)
        return x + self.mlp(self.norm2(x))


class Qwen3_VisionPatchMerger(nn.Module):
    """merge^2 neighbouring patches -> one language-model token. The final merger
    normalizes each patch before concatenating; the DeepStack mergers normalize the
    concatenation (`postshuffle_norm`)."""

    def __init__(self, config: Any, postshuffle_norm: bool = False) -> None:
        super().__init__()
        self.merged = config.hidden_size * config.spatial_merge_size ** 2
        self.postshuffle_norm = postshuffle_norm
        self.norm = nn.LayerNorm(self.merged if postshuffle_norm else config.hidden_size,
                                 eps=1e-6)
        self.linear_fc1 = nn.Linear(self.merged, self.merged)
        self.linear_fc2 = nn.Linear(self.merged, config.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.postshuffle_norm:
            x = self.norm(x.view(-1, self.merged))
        else:
            x = self.norm(x).view(-1, self.merged)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class Qwen3_VisionTransformer(nn.Module):
    """Patches of one or more images -> per merged token, the final merger's output and
    then each DeepStack merger's, concatenated: [P / merge^2, out_hidden * (1 + k)].
    The same `layout` / `forward(inputs)` contract as Qwen2.5-VL's encoder."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.merge = config.spatial_merge_size
        self.patch_embed = Qwen3_VisionPatchEmbed(config)
        self.pos_embed = nn.Embedding(config.num_position_embeddings, config.hidden_size)
        self.num_grid_per_side = int(config.num_position_embeddings ** 0.5)
        rope = getattr(config, "rope_parameters", None) or {}
        self.rotary_pos_emb = Qwen2_5_VisionRotary(config.hidden_size // config.num_heads,
                                                   float(rope.get("rope_theta", 10000.0)))
        self.blocks = nn.ModuleList(Qwen3_VisionBlock(config) for _ in range(config.depth))
        self.merger = Qwen3_VisionPatchMerger(config)
        self.deepstack_visual_indexes = list(getattr(config, "deepstack_visual_indexes", []))
        self.deepstack_merger_list = nn.ModuleList(
            Qwen3_VisionPatchMerger(config, postshuffle_norm=True)
            for _ in self.deepstack_visual_indexes)

    def layout(self, pixel_values: Sequence[torch.Tensor], grids: Sequence[Sequence[int]],
               pad_to: Optional[int] = None) -> Qwen3VisionInputs:
        device = self.merger.linear_fc1.weight.device
        base = build_vision_inputs(pixel_values, grids, self.merge, _WHOLE_IMAGE, pad_to,
                                   device)
        index, weight = position_table_taps(grids, self.merge, self.num_grid_per_side,
                                            pad_to)
        return Qwen3VisionInputs(**vars(base), pos_index=index.to(device),
                                 pos_weight=weight.to(device))

    def forward(self, inputs: Qwen3VisionInputs) -> torch.Tensor:
        x = self.patch_embed(inputs.patches)
        pos = (self.pos_embed(inputs.pos_index) * inputs.pos_weight[:, :, None]).sum(1)
        x = x + pos.to(x.dtype)
        rope = self.rotary_pos_emb(inputs.rope_positions)
        outs: list[torch.Tensor] = []
        for i, block in enumerate(self.blocks):
            x = block(x, rope, inputs.full)
            if i in self.deepstack_visual_indexes:
                merger = self.deepstack_merger_list[self.deepstack_visual_indexes.index(i)]
                outs.append(merger(x))
        merged = torch.cat([self.merger(x)] + outs, dim=-1)
        return merged.index_select(0, inputs.restore)


# ---------------------------------------------------------------- language model
def build_interleaved_mrope(config: Any) -> MRotaryEmbedding:
    """Qwen3-VL's text rotary: plain-theta M-RoPE, rows interleaved over frequencies."""
    theta, scaling = rope_config(config)
    params = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling",
                                                                      None) or {})
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type not in ("default", "mrope"):
        raise ValueError(f"Qwen3-VL with rope type {rope_type!r} is not supported "
                         "(only M-RoPE without scaling).")
    head_dim = head_dim_of(config)
    return MRotaryEmbedding(head_dim, head_dim, config.max_position_embeddings, theta,
                            list(params.get("mrope_section") or DEFAULT_MROPE_SECTION),
                            mrope_interleaved=True)


class Qwen3LLMModel(Qwen3Model):
    """Qwen3 with interleaved M-RoPE; input embeddings wider than `hidden_size` carry
    DeepStack features, added after decoder layer i (i < num_deepstack) from columns
    hidden * (1 + i) .. hidden * (2 + i)."""

    num_deepstack = 0
    """Set by the wrapper from the vision config."""

    def build_rotary_emb(self, config: Any) -> MRotaryEmbedding:
        return build_interleaved_mrope(config)

    def forward(self, input_ids: Optional[torch.Tensor], positions: torch.Tensor,
                intermediate_tensors: Optional[IntermediateTensors] = None,
                inputs_embeds: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, IntermediateTensors]:
        width = self.config.hidden_size
        if (inputs_embeds is None or inputs_embeds.shape[-1] == width
                or not self.is_first_stage):
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)
        hidden = inputs_embeds[:, :width].contiguous()
        residual: Optional[torch.Tensor] = None
        for i, layer in enumerate(self._own_layers):
            hidden, residual = layer(positions, hidden, residual)
            if i < self.num_deepstack:  # as transformers: onto the layer's full output
                hidden = hidden + residual + inputs_embeds[:, width * (1 + i):width * (2 + i)]
                residual = None
        if residual is None:
            residual = torch.zeros_like(hidden)
        if not self.is_last_stage:
            return IntermediateTensors({"hidden_states": hidden, "residual": residual})
        hidden, _ = self.norm(hidden, residual)
        return hidden


class Qwen3LLMForCausalLM(Qwen3ForCausalLM):
    model_cls = Qwen3LLMModel


# ------------------------------------------------------------------------ model
class Qwen3VLForConditionalGeneration(Qwen2_5_VLForConditionalGeneration):
    """Qwen3-VL's vision tower and DeepStack language model behind Qwen2.5-VL's
    frontend hooks (see the module docstring)."""

    vision_cls = Qwen3_VisionTransformer
    text_cls = Qwen3LLMForCausalLM

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        config = vllm_config.model_config.hf_config
        if hasattr(config, "tie_word_embeddings"):  # transformers ties by the top config
            config.text_config.tie_word_embeddings = bool(config.tie_word_embeddings)
        super().__init__(vllm_config, prefix)
        text = self.language_model.model
        self.num_deepstack = len(self.visual.deepstack_visual_indexes)
        text.num_deepstack = self.num_deepstack
        if self.num_deepstack and text.is_first_stage and not text.is_last_stage \
                and text.end_layer < self.num_deepstack:
            raise NotImplementedError(
                f"Qwen3-VL adds DeepStack features after its first {self.num_deepstack} "
                f"decoder layers; the first pipeline stage holds only {text.end_layer}.")
        self.hidden_size = self.config.text_config.hidden_size

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T, hidden * (1 + k)]: the tokens' embeddings, then zero DeepStack columns
        (image rows get theirs from the encoder output written over them)."""
        embeds = self.language_model.model.embed_tokens(input_ids)
        if not self.num_deepstack:
            return embeds
        return torch.cat([embeds, embeds.new_zeros(embeds.shape[0],
                                                   self.hidden_size * self.num_deepstack)], -1)

    def split_deepstack(self, embeds: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One image's encoder output -> (main embeddings, DeepStack features per layer)."""
        parts = embeds.split(self.hidden_size, dim=-1)
        return parts[0], list(parts[1:])
