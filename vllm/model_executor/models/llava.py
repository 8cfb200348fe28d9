"""LLaVA-1.5 (LlavaForConditionalGeneration): CLIP vision tower + MLP projector + a
decoder-only language model.

Each image becomes `patches` embeddings in the language model's space (the feature
layer's patch states, the class token dropped by the "default" strategy, through
linear-act-linear), which replace the embeddings of its `patches` placeholder tokens
(the processor expanded one `<image>` into that many). The runner asks for them via
`embed_multimodal` (once per image: its encoder cache) and merges them into
`get_input_embeddings` (ModelRunnerBase.gather_mm_embeddings); the forward then runs
the language model on those embeddings.

Checkpoints come in two namings: old (`language_model.model.*`,
`language_model.lm_head.*`, `vision_tower.*`, `multi_modal_projector.*`) and
transformers 5's (`model.language_model.*`, `lm_head.*`, `model.vision_tower.*`,
`model.multi_modal_projector.*`); both load.
"""
from __future__ import annotations

import copy
from typing import Any, Iterable

import torch
from torch import nn

from vllm.model_executor.models.clip import CLIPVisionTower, vision_activation
from vllm.model_executor.models.vlm_base import LanguageModelDelegate, load_vlm_weights

_TEXT_ARCHS = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
               "qwen2": "Qwen2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
"""Language model class by text_config.model_type, when it names no architecture."""

_NEW_TO_OLD_PREFIXES = (("model.language_model.", "language_model.model."),
                        ("lm_head.", "language_model.lm_head."),
                        ("model.vision_tower.", "vision_tower."),
                        ("model.multi_modal_projector.", "multi_modal_projector."))


def text_vllm_config(vllm_config: Any) -> Any:
    """A shallow copy of the engine config whose model config's hf_config is the text
    config: what the language model class is built from."""
    mc = copy.copy(vllm_config.model_config)
    mc.hf_config = vllm_config.model_config.hf_text_config
    out = copy.copy(vllm_config)
    out.model_config = mc
    return out


def build_language_model(vllm_config: Any, prefix: str) -> nn.Module:
    from vllm.model_executor.models.registry import ModelRegistry
    text = vllm_config.model_config.hf_text_config
    archs = list(getattr(text, "architectures", None) or [])
    archs.append(_TEXT_ARCHS.get(getattr(text, "model_type", ""), "LlamaForCausalLM"))
    cls, _ = ModelRegistry.resolve_model_cls(archs)
    return cls(vllm_config=text_vllm_config(vllm_config), prefix=prefix)


class LlavaMultiModalProjector(nn.Module):

    def __init__(self, vision_width: int, text_width: int, act: str, bias: bool) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(vision_width, text_width, bias=bias)
        self.act = vision_activation(act)
        self.linear_2 = nn.Linear(text_width, text_width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaForConditionalGeneration(LanguageModelDelegate, nn.Module):
    """Vision tower + projector + language model (see the module docstring)."""

    supports_multimodal = True

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        strategy = getattr(config, "vision_feature_select_strategy", "default")
        if strategy not in ("default", "full"):
            raise ValueError(f"vision_feature_select_strategy {strategy!r} is not supported.")
        self.drop_cls = strategy == "default"
        layers = config.vision_feature_layer
        layers = list(layers) if isinstance(layers, (list, tuple)) else [layers]
        vc = config.vision_config
        self.vision_tower = CLIPVisionTower(vc, layers)
        self.multi_modal_projector = LlavaMultiModalProjector(
            vc.hidden_size * len(layers), config.text_config.hidden_size,
            config.projector_hidden_act, getattr(config, "multimodal_projector_bias", True))
        self.language_model = build_language_model(vllm_config, "language_model")
        self.start_layer = self.language_model.start_layer
        self.end_layer = self.language_model.end_layer

    # ------------------------------------------------------ frontend helpers
    @staticmethod
    def split_mm_data(hf_outputs: Any, num_items: int) -> list[dict[str, torch.Tensor]]:
        """The processor's batch of fixed-size images, one [1, C, H, W] per image."""
        pixels = hf_outputs["pixel_values"]
        return [{"pixel_values": pixels[i:i + 1].contiguous()} for i in range(num_items)]

    @staticmethod
    def num_mm_tokens(hf_config: Any, item: dict[str, torch.Tensor]) -> int:
        """Placeholder tokens of one image: its patches (plus the class token with
        the "full" strategy)."""
        patch = hf_config.vision_config.patch_size
        h, w = item["pixel_values"].shape[-2:]
        full = getattr(hf_config, "vision_feature_select_strategy", "default") == "full"
        return (h // patch) * (w // patch) + int(full)

    # --------------------------------------------------------------- runner
    def dummy_mm_item(self) -> dict[str, torch.Tensor]:
        """One blank image at the tower's resolution (warmup: the processor resizes
        every image to it, so it has the shapes of all of them)."""
        vc = self.config.vision_config
        weight = self.multi_modal_projector.linear_1.weight
        return {"pixel_values": torch.zeros(1, vc.num_channels, vc.image_size, vc.image_size,
                                            dtype=weight.dtype, device=weight.device)}

    def embed_multimodal(self, items: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """One [placeholder tokens, hidden] tensor per image, batched through the tower."""
        device = self.multi_modal_projector.linear_1.weight.device
        pixels = torch.cat([it["pixel_values"] for it in items]).to(device)
        feats = self.vision_tower(pixels)
        if self.drop_cls:
            feats = feats[:, 1:]
        return list(self.multi_modal_projector(feats).unbind(0))

    # -------------------------------------------------------------- weights
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Route each tensor: `language_model.*` to the language model's loader, the
        tower's and projector's by name (tower tensors it does not build are skipped)."""
        return load_vlm_weights(
            self, weights, _NEW_TO_OLD_PREFIXES,
            skip=lambda name: name.startswith("vision_tower.") and
            not self.vision_tower.owns_weight(name[len("vision_tower."):]))