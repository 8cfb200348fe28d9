"""Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration): dynamic-resolution vision encoder
(qwen2_5_vl_vision.py) + a Qwen2 language model with M-RoPE.

The processor resizes each image to a multiple of patch * merge pixels (within its
pixel limits), so images of different sizes yield different numbers of tokens:
(t * h * w) / merge^2 for a (t, h, w) patch grid, which is what its one
`<|image_pad|>` is expanded into. Those tokens' embeddings are the encoder's output
for the image (`embed_multimodal`, run once per image through the runner's encoder
cache) and their positions are 3-row M-RoPE positions (t, h, w) computed from the
grid (`get_mrope_input_positions`, vllm/multimodal/mrope.py); the runner hands the
model [3, rows] positions for every pass (`uses_mrope`).

Checkpoints come in two namings: the hub's (`model.*` for the language model,
`visual.*`, `lm_head.*`) and transformers 5's in-memory one (`model.language_model.*`,
`model.visual.*`, `lm_head.*`); both load.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable, Optional

import torch
from torch import nn

from vllm.model_executor.layers.rotary_mrope import MRotaryEmbedding
from vllm.model_executor.models.llava import text_vllm_config
from vllm.model_executor.models.qwen2 import (Qwen2Attention, Qwen2DecoderLayer,
                                              Qwen2ForCausalLM, Qwen2Model)
from vllm.model_executor.models.qwen2_5_vl_vision import Qwen2_5_VisionTransformer
from vllm.model_executor.models.utils import head_dim_of, rope_config
from vllm.multimodal.mrope import mrope_input_positions
from vllm.model_executor.models.vlm_base import LanguageModelDelegate, load_vlm_weights

logger = logging.getLogger(__name__)

_RENAMES = (("model.language_model.", "language_model.model."), ("model.visual.", "visual."),
            ("lm_head.", "language_model.lm_head."), ("model.", "language_model.model."))
"""Checkpoint prefix -> this module's, first match wins (`visual.*` needs none)."""


def mrope_section_of(config: Any) -> list[int]:
    """The text config's `mrope_section` (transformers 5: rope_parameters; 4.x:
    rope_scaling of type "mrope")."""
    for params in (getattr(config, "rope_parameters", None),
                   getattr(config, "rope_scaling", None)):
        if params and params.get("mrope_section"):
            return list(params["mrope_section"])
    raise ValueError("Qwen2.5-VL text config has no rope_parameters.mrope_section.")


class Qwen2_5_VLAttention(Qwen2Attention):
    fused_decode_ok = False  # the native layer call takes one position per token


class Qwen2_5_VLDecoderLayer(Qwen2DecoderLayer):
    attention_cls = Qwen2_5_VLAttention


class Qwen2_5_VLTextModel(Qwen2Model):
    layer_cls = Qwen2_5_VLDecoderLayer

    def build_rotary_emb(self, config: Any) -> MRotaryEmbedding:
        theta, scaling = rope_config(config)
        rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        if rope_type not in ("default", "mrope"):
            raise ValueError(f"Qwen2.5-VL with rope type {rope_type!r} is not supported "
                             "(only M-RoPE without scaling).")
        head_dim = head_dim_of(config)
        return MRotaryEmbedding(head_dim, head_dim, config.max_position_embeddings, theta,
                                mrope_section_of(config))


class Qwen2_5_VLTextForCausalLM(Qwen2ForCausalLM):
    model_cls = Qwen2_5_VLTextModel


class Qwen2_5_VLForConditionalGeneration(LanguageModelDelegate, nn.Module):
    """Vision encoder + M-RoPE language model (see the module docstring)."""

    supports_multimodal = True
    uses_mrope = True
    vision_cls: type[nn.Module] = Qwen2_5_VisionTransformer
    """The vision encoder (Qwen2-VL's subclass swaps in its own)."""
    text_cls: type[nn.Module] = Qwen2_5_VLTextForCausalLM
    """The language model (Qwen3-VL's subclass swaps in its own)."""

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        text = config.text_config
        if not hasattr(text, "tie_word_embeddings"):  # transformers 5 keeps it on the top
            text.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.visual = self.vision_cls(config.vision_config)
        self.language_model = self.text_cls(
            vllm_config=text_vllm_config(vllm_config), prefix="language_model")
        self.start_layer = self.language_model.start_layer
        self.end_layer = self.language_model.end_layer

    # ------------------------------------------------------ frontend helpers
    @staticmethod
    def image_token_id(hf_config: Any) -> int:
        return hf_config.image_token_id

    @staticmethod
    def load_hf_processor(path: str) -> Any:
        """The checkpoint's AutoProcessor. transformers' Qwen2.5-VL processor also
        builds a video processor, which needs torchvision; without it, the checkpoint's
        own image processor and tokenizer with the processor's placeholder expansion
        (vllm/multimodal/qwen_vl_processor.py)."""
        from transformers import AutoProcessor
        try:
            return AutoProcessor.from_pretrained(path)
        except ImportError as e:
            from vllm.multimodal.qwen_vl_processor import QwenVLImageProcessor
            logger.info("Qwen2.5-VL processor without its video half (%s): images only.",
                        str(e).strip().splitlines()[0])
            return QwenVLImageProcessor.from_pretrained(path)

    @staticmethod
    def chat_image_placeholder(hf_processor: Any) -> str:
        """What an image part of a chat message renders to (the chat template's own
        text for an image): the pad token between the vision start and end tokens."""
        return "<|vision_start|>" + hf_processor.image_token + "<|vision_end|>"

    @staticmethod
    def split_mm_data(hf_outputs: Any, num_items: int) -> list[dict[str, torch.Tensor]]:
        """Each image's patches [t*h*w, dim] and grid [1, 3] (the processor concatenates
        the patches of all images)."""
        grids = hf_outputs["image_grid_thw"]
        sizes = grids.prod(-1).tolist()
        pixels = hf_outputs["pixel_values"].split(sizes)
        return [{"pixel_values": pixels[i].contiguous(), "image_grid_thw": grids[i:i + 1]}
                for i in range(num_items)]

    @staticmethod
    def num_mm_tokens(hf_config: Any, item: dict[str, torch.Tensor]) -> int:
        merge = hf_config.vision_config.spatial_merge_size
        return int(item["image_grid_thw"].prod()) // (merge * merge)

    # --------------------------------------------------------------- runner
    def get_mrope_input_positions(self, prompt_token_ids: list[int],
                                  mm_features: list[Any]) -> tuple[torch.Tensor, int]:
        """([3, prompt tokens] positions, delta) of a prompt (vllm/multimodal/mrope.py)."""
        spans = [(f.offset, f.length, f.data["image_grid_thw"].view(-1).tolist())
                 for f in mm_features]
        return mrope_input_positions(len(prompt_token_ids), spans,
                                     self.config.vision_config.spatial_merge_size)

    def mm_item_size(self, item: dict[str, torch.Tensor]) -> int:
        """Encoder work of one image: its patches (what the HPU encoder buckets)."""
        return int(item["pixel_values"].shape[0])

    @staticmethod
    def max_mm_item_size(model_config: Any) -> int:
        """Patches of the largest image the checkpoint's image processor makes (its
        max_pixels: the processor shrinks larger images to fit)."""
        from transformers import AutoImageProcessor
        proc = AutoImageProcessor.from_pretrained(model_config.tokenizer_path
                                                  or model_config.model_path)
        max_pixels = getattr(proc, "max_pixels", None) or proc.size["longest_edge"]
        return int(max_pixels) // proc.patch_size ** 2

    def dummy_mm_item(self, num_patches: int) -> dict[str, torch.Tensor]:
        """A blank image of `num_patches` patches (a multiple of merge^2): a grid of
        one merge block's height (warmup of a patch-count bucket), float32 like the
        processor's pixels."""
        vc = self.config.vision_config
        merge = vc.spatial_merge_size
        if num_patches % (merge * merge):
            raise ValueError(f"num_patches {num_patches} is not a multiple of {merge * merge}.")
        dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
        return {"pixel_values": torch.zeros(num_patches, dim, dtype=torch.float32),
                "image_grid_thw": torch.tensor([[1, merge, num_patches // merge]])}

    def embed_multimodal(self, items: list[dict[str, torch.Tensor]],
                         pad_to: Optional[int] = None) -> list[torch.Tensor]:
        """One [tokens, hidden] tensor per image, all images in one encoder call;
        `pad_to` patches: the fixed-shape (masked) layout of that size."""
        grids = [it["image_grid_thw"].view(-1).tolist() for it in items]
        inputs = self.visual.layout([it["pixel_values"] for it in items], grids, pad_to)
        merged = self.visual(inputs)
        return list(merged[:sum(inputs.tokens_per_item)].split(inputs.tokens_per_item))

    # -------------------------------------------------------------- weights
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """`language_model.*` to the language model's loader, `visual.*` by name."""
        return load_vlm_weights(self, weights, _RENAMES)