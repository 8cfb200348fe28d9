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
from vllm.model_executor.models.vlm_base import load_vlm_weights


_VLM_RENAMES = (("model.language_model.", "language_model."),
                ("model.vision_model.", "vision_model."),
                ("model.multi_modal_projector.", "multi_modal_projector."),
                ("lm_head.", "language_model.lm_head."))
"""transformers 5's in-memory prefixes -> this module's (the saved naming needs none but
the LM head's)."""


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
    """Llama 4 with images (early fusion): the vision encoder's tokens fill each image's
    `<|patch|>` runs (vllm/model_executor/models/llama4_vision.py,
    vllm/multimodal/llama4_processor.py). An image's placeholder block also holds its
    start / end, tile separator and `<|image|>` tokens: the block is one placeholder run
    here (`mm_placeholder_ranges`) and its encoder output carries those tokens' text
    embeddings at their places. With `--limit-mm-per-prompt '{"image": 0}'` the vision
    parts are neither built nor loaded (the language model alone)."""

    supports_multimodal = True

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        from vllm.model_executor.models.llava import text_vllm_config
        from vllm.multimodal.processing import mm_limit
        model_config = vllm_config.model_config
        config = self.config = model_config.hf_config
        self.with_vision = mm_limit(model_config.limit_mm_per_prompt, "image") > 0
        if self.with_vision:
            from vllm.model_executor.models.llama4_vision import Llama4VisionModel
            self.vision_model = Llama4VisionModel(config.vision_config)
            self.multi_modal_projector = Llama4MultiModalProjector(config)
        vc = config.vision_config
        self.patches_per_tile = (vc.image_size // vc.patch_size) ** 2
        self.language_model = Llama4ForCausalLM(vllm_config=text_vllm_config(vllm_config),
                                                prefix="language_model")
        self.start_layer = self.language_model.start_layer
        self.end_layer = self.language_model.end_layer

    # ------------------------------------------------------ frontend helpers
    @staticmethod
    def image_token_id(hf_config: Any) -> int:
        return hf_config.image_token_index

    @staticmethod
    def load_hf_processor(path: str) -> Any:
        from vllm.multimodal.llama4_processor import Llama4ImageProcessor
        return Llama4ImageProcessor.from_pretrained(path)

    @staticmethod
    def chat_image_placeholder(hf_processor: Any) -> str:
        return hf_processor.image_token

    @staticmethod
    def split_mm_data(hf_outputs: Any, num_items: int) -> list[dict[str, torch.Tensor]]:
        """Each image's tiles [T, 3, S, S] (the global one last), its tile grid [1, 2]
        and the image tokens' ids."""
        items, start = [], 0
        for i in range(num_items):
            rows, cols = (int(v) for v in hf_outputs["aspect_ratios"][i])
            count = rows * cols + (1 if rows * cols > 1 else 0)
            items.append({"pixel_values": hf_outputs["pixel_values"][start:start + count],
                          "aspect_ratio": hf_outputs["aspect_ratios"][i:i + 1].clone(),
                          "image_special_ids": hf_outputs["image_special_ids"].clone()})
            start += count
        return items

    @staticmethod
    def tokens_per_tile(hf_config: Any) -> int:
        vc = hf_config.vision_config
        return int((vc.image_size // vc.patch_size) ** 2 * vc.pixel_shuffle_ratio ** 2)

    @staticmethod
    def num_mm_tokens(hf_config: Any, item: dict[str, torch.Tensor]) -> int:
        """The whole block: start, the tiles' runs and separators, `<|image|>`, the
        global run, end."""
        rows, cols = (int(v) for v in item["aspect_ratio"].view(-1))
        run = Llama4ForConditionalGeneration.tokens_per_tile(hf_config)
        tiled = rows * (cols * run + cols - 1 + 1) if rows * cols > 1 else 0
        return 1 + tiled + 1 + run + 1

    @staticmethod
    def mm_placeholder_ranges(token_ids: list[int], hf_config: Any, lengths: list[int],
                              items: list[dict[str, torch.Tensor]]) -> list[tuple[int, int]]:
        """Each image's block, from its `<|image_start|>` on."""
        ranges, pos = [], 0
        for n, item in zip(lengths, items):
            start_id = int(item["image_special_ids"][0])
            try:
                start = token_ids.index(start_id, pos)
            except ValueError:
                raise ValueError(f"The prompt has image placeholders for fewer than its "
                                 f"{len(lengths)} images.") from None
            if start + n > len(token_ids):
                raise ValueError("An image's placeholder block is cut short in the prompt.")
            ranges.append((start, n))
            pos = start + n
        return ranges

    # --------------------------------------------------------------- runner
    def mm_item_size(self, item: dict[str, torch.Tensor]) -> int:
        """Encoder work of one image in patches (its tiles'), what the HPU buckets."""
        return int(item["pixel_values"].shape[0]) * self.patches_per_tile

    @staticmethod
    def max_mm_item_size(model_config: Any) -> int:
        from vllm.multimodal.llama4_processor import Llama4ImageProcessor
        proc = Llama4ImageProcessor.from_pretrained(model_config.tokenizer_path
                                                    or model_config.model_path)
        vc = model_config.hf_config.vision_config
        return (proc.max_tiles + 1) * (vc.image_size // vc.patch_size) ** 2

    def dummy_mm_item(self, num_patches: int) -> dict[str, torch.Tensor]:
        """A blank image of as many tiles as fit `num_patches` (one row of tiles and the
        global one)."""
        vc = self.config.vision_config
        tiles = max(1, num_patches // self.patches_per_tile)
        ratio = [[1, 1]] if tiles == 1 else [[1, tiles - 1]]
        size = vc.image_size
        return {"pixel_values": torch.zeros(tiles, vc.num_channels, size, size),
                "aspect_ratio": torch.tensor(ratio),
                "image_special_ids": torch.zeros(6, dtype=torch.long)}

    def embed_multimodal(self, items: list[dict[str, torch.Tensor]],
                         pad_to: Optional[int] = None) -> list[torch.Tensor]:
        """One [block tokens, hidden] tensor per image, all tiles in one encoder call;
        `pad_to` patches: blank tiles up to that many patches (a fixed shape)."""
        weight = self.multi_modal_projector.linear_1.weight
        tiles = torch.cat([it["pixel_values"] for it in items]).to(weight.device)
        real = tiles.shape[0]
        if pad_to is not None and pad_to // self.patches_per_tile > real:
            tiles = torch.cat([tiles, tiles.new_zeros(pad_to // self.patches_per_tile - real,
                                                      *tiles.shape[1:])])
        feats = self.multi_modal_projector(self.vision_model(tiles))[:real]
        outputs, at = [], 0
        for item in items:
            count = int(item["pixel_values"].shape[0])
            outputs.append(self._block_rows(item, feats[at:at + count]))
            at += count
        return outputs

    def _block_rows(self, item: dict[str, torch.Tensor], feats: torch.Tensor) -> torch.Tensor:
        """The image's block in prompt order: text embeddings of its special tokens,
        its tiles' features in their runs."""
        start, end, image, _, tile_x, tile_y = (
            self.get_input_embeddings(item["image_special_ids"].to(feats.device))
            .to(feats.dtype)[:, None])
        rows, cols = (int(v) for v in item["aspect_ratio"].view(-1))
        parts = [start]
        if rows * cols > 1:
            for r in range(rows):
                for c in range(cols):
                    parts.append(feats[r * cols + c])
                    parts.append(tile_x if c < cols - 1 else tile_y)
        parts += [image, feats[-1], end]
        return torch.cat(parts)

    # --------------------------------------------------------------- model
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
        language model; `vision_model.*` / `multi_modal_projector.*` by name (skipped
        when the model serves text only)."""
        return load_vlm_weights(self, weights, _VLM_RENAMES,
                                skip=lambda name: not self.with_vision)


class Llama4MultiModalProjector(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(config.vision_config.vision_output_dim,
                                  config.text_config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_1(x)

