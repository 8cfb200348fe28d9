"""`TransformersForMultimodalLM`: a decoder-only vision-language `transformers` model
(`*ForConditionalGeneration`) on our engine.

The library's model is built on the meta device with one attention implementation per
sub-config: the language model's is the backend's ("vllm": our paged attention, as in
causal.py, whose code makes the decoder ours: linears, embedding, LM head, MoE), every
other part (vision tower, projector) keeps the library's own modules and attends with
`sdpa`. Images arrive as the runner's multimodal items (the checkpoint's processor's
tensors, one image each): `embed_multimodal` runs the library's `get_image_features`
(tower + projector) and returns one [image tokens, hidden] tensor per image, which the
runner writes over the image's placeholder rows (`gather_mm_embeddings`); the forward
runs the library's language model on those `inputs_embeds`.

Generic only for fixed-resolution towers: each image is one entry of the processor's
batch (refused otherwise: processors that split images into a varying number of
crops), whose placeholder tokens are a run of the image token. Models with
multimodal rotary positions (M-RoPE) or bidirectional attention among image tokens
are refused (support.py), as are processors the installed packages cannot load.
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from vllm.model_executor.models.transformers.attention import ATTN_IMPLEMENTATION
from vllm.model_executor.models.transformers.causal import (TransformersForCausalLM,
                                                            build_on_meta)
from vllm.model_executor.models.transformers.modules import materialize_meta
from vllm.model_executor.models.transformers.support import (
    TransformersBackendUnsupported, refuse, resolve_transformers_mm_class)

logger = logging.getLogger(__name__)

VISION_ATTN_IMPLEMENTATION = "sdpa"
"""What every sub-config other than the text one attends with (the library's own)."""

_NOT_PER_IMAGE = frozenset({"input_ids", "attention_mask", "token_type_ids",
                            "mm_token_type_ids"})
"""Processor outputs that belong to the prompt, not to an image."""


def attn_implementations(config: Any) -> dict[str, str]:
    """Per sub-config attention: the text config's ours, the others' (and the top
    config's, "") sdpa."""
    impls = {"": VISION_ATTN_IMPLEMENTATION}
    for key in getattr(config, "sub_configs", None) or {}:
        impls[key] = VISION_ATTN_IMPLEMENTATION
    impls["text_config"] = ATTN_IMPLEMENTATION
    return impls


class TransformersForMultimodalLM(TransformersForCausalLM):
    """A `transformers` vision-language model: the library's vision tower and
    projector, and its language model with our linears, attention and LM head."""

    supports_multimodal = True

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        nn.Module.__init__(self)
        model_config = vllm_config.model_config
        config = model_config.hf_config
        hf_cls = resolve_transformers_mm_class(config)
        if getattr(vllm_config, "parallel_config", None) is not None and getattr(
                vllm_config.parallel_config, "pipeline_parallel_size", 1) > 1:
            raise refuse(config, "pipeline parallelism is not supported for multimodal "
                         "models; use --pipeline-parallel-size 1")
        hf_model = build_on_meta(hf_cls, config, model_config.torch_dtype,
                                 attn_implementations(config))
        self.config = hf_model.config
        self.text_config = self.config.get_text_config()
        self.base_model_prefix = hf_model.base_model_prefix
        outer = hf_model.base_model  # vision tower, projector, language model
        language_model = getattr(outer, "language_model", None)
        if language_model is None or not hasattr(outer, "get_image_features"):
            raise refuse(config, f"{hf_cls.__name__} has no `language_model` with "
                         "`get_image_features` beside it, which the backend needs")
        if getattr(language_model.config, "_attn_implementation", None) != ATTN_IMPLEMENTATION:
            raise refuse(config, f"{hf_cls.__name__}'s language model does not take its "
                         "attention implementation from `text_config`")
        setattr(self, self.base_model_prefix, outer)
        self._outer_children = frozenset(n for n, _ in outer.named_children())
        self._adopt_language_model(hf_model, f"{self.base_model_prefix}.language_model",
                                   self.text_config)
        materialize_meta(self, torch.get_default_device())
        logger.info("Transformers modeling backend: %s (language model on our paged "
                    "attention, vision tower on the library's %s).", hf_cls.__name__,
                    VISION_ATTN_IMPLEMENTATION)

    def _rename(self, name: str) -> str:
        """transformers 5's name for a checkpoint tensor: the older layout's
        `language_model.model.*` / `language_model.lm_head.*` and top-level parts
        (`vision_tower.*`, the projector) move under the base model as the library
        holds them; then the library's own renames."""
        prefix = self.base_model_prefix
        for old, new in (("language_model.model.", f"{prefix}.language_model."),
                         ("language_model.lm_head.", "lm_head.")):
            if name.startswith(old):
                return new + name[len(old):]
        head = name.split(".", 1)[0]
        if head in self._outer_children:
            return f"{prefix}.{name}"
        return super()._rename(name)

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.get_base().get_input_embeddings()(input_ids)

    # ------------------------------------------------------ frontend helpers
    @staticmethod
    def image_token_id(hf_config: Any) -> int:
        for name in ("image_token_id", "image_token_index"):
            tid = getattr(hf_config, name, None)
            if tid is not None:
                return int(tid)
        raise refuse(hf_config, "its config names no image token (image_token_id / "
                     "image_token_index)")

    @staticmethod
    def load_hf_processor(path: str) -> Any:
        """The checkpoint's AutoProcessor; a processor that needs a package not
        installed (torchvision) is refused naming it."""
        from transformers import AutoConfig, AutoProcessor
        try:
            return AutoProcessor.from_pretrained(path)
        except ImportError as e:
            raise refuse(AutoConfig.from_pretrained(path),
                         f"its processor cannot be loaded ({e})") from e

    @staticmethod
    def split_mm_data(hf_outputs: Any, num_items: int) -> list[dict[str, torch.Tensor]]:
        """The processor's per-image tensors, split by their first dimension (one
        image each); a processor that made more entries than images (crops) is
        refused."""
        per_image = {k: v for k, v in hf_outputs.items()
                     if k not in _NOT_PER_IMAGE and isinstance(v, torch.Tensor)}
        if "pixel_values" not in per_image:
            raise ValueError("the model's processor returned no pixel_values.")
        for key, value in per_image.items():
            if value.dim() == 0 or value.shape[0] != num_items:
                raise TransformersBackendUnsupported(
                    f"The processor's {key!r} has {value.shape[0] if value.dim() else 0} "
                    f"entries for {num_items} image(s): a model whose images split into a "
                    "varying number of crops cannot run on the Transformers modeling "
                    "backend (--model-impl transformers).")
        return [{k: v[i:i + 1].contiguous() for k, v in per_image.items()}
                for i in range(num_items)]

    @staticmethod
    def mm_token_counts(hf_outputs: Any, ids: list[int], num_items: int,
                        image_token_id: int) -> list[int]:
        """Placeholder tokens per image: the runs of the image token in the processed
        ids, one per image; runs that touch (adjacent images) share the tokens evenly,
        which a fixed-resolution tower's equal-shaped images do."""
        runs: list[int] = []
        prev = None
        for tok in ids:
            if tok == image_token_id:
                if prev == image_token_id:
                    runs[-1] += 1
                else:
                    runs.append(1)
            prev = tok
        if len(runs) == num_items:
            return runs
        total = sum(runs)
        pixels = hf_outputs["pixel_values"]
        if num_items and total % num_items == 0 and pixels.shape[0] == num_items:
            return [total // num_items] * num_items
        raise ValueError(f"The prompt holds {total} image tokens in {len(runs)} run(s) for "
                         f"{num_items} image(s); each image needs its own image "
                         "placeholder.")

    @staticmethod
    def num_mm_tokens(hf_config: Any, item: dict[str, torch.Tensor]) -> int:
        raise NotImplementedError("the Transformers backend counts image tokens from the "
                                  "processed prompt (mm_token_counts).")

    # --------------------------------------------------------------- runner
    def _vision_param(self) -> torch.Tensor:
        for name, param in self.named_parameters():
            if not name.startswith(self.lm_base_path + ".") and not name.startswith(
                    ("lm_head.", "attn_layers.")):
                return param
        return next(self.parameters())

    def dummy_mm_item(self) -> dict[str, torch.Tensor]:
        """One blank image at the vision config's resolution (warmup)."""
        vc = self.config.vision_config
        size = getattr(vc, "image_size", None)
        if size is None:
            raise ValueError(f"{type(vc).__name__} names no image_size for a warmup image.")
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        ref = self._vision_param()
        return {"pixel_values": torch.zeros(1, getattr(vc, "num_channels", 3), h, w,
                                            dtype=ref.dtype, device=ref.device)}

    def embed_multimodal(self, items: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """One [placeholder tokens, hidden] tensor per image: the library's
        `get_image_features` (tower and projector), batched over images of the same
        shapes."""
        if not items:
            return []
        ref = self._vision_param()
        shapes = {tuple((k, tuple(v.shape)) for k, v in sorted(it.items())) for it in items}
        groups = [items] if len(shapes) == 1 else [[it] for it in items]
        out: list[torch.Tensor] = []
        for group in groups:
            batch = {k: torch.cat([it[k] for it in group]).to(ref.device) for k in group[0]}
            for k, v in batch.items():
                if v.is_floating_point():
                    batch[k] = v.to(ref.dtype)
            out.extend(self._image_features(batch, len(group)))
        return out

    def _image_features(self, batch: dict[str, torch.Tensor], n: int) -> list[torch.Tensor]:
        hidden = self.text_config.hidden_size
        feats = self.get_submodule(self.base_model_prefix).get_image_features(**batch)
        feats = getattr(feats, "pooler_output", feats)
        if isinstance(feats, (list, tuple)) and len(feats) == n:
            return [f.reshape(-1, hidden) for f in feats]
        if isinstance(feats, (list, tuple)):
            feats = torch.cat([f.reshape(-1, hidden) for f in feats])
        if feats.dim() >= 3 and feats.shape[0] == n:
            return [f.reshape(-1, hidden) for f in feats.unbind(0)]
        return list(feats.reshape(-1, hidden).chunk(n))


__all__ = ["TransformersForMultimodalLM", "attn_implementations"]
