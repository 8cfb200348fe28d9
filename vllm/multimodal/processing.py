"""Frontend half of multimodal input: the model's own transformers processor.

The processor (AutoProcessor of the checkpoint) resizes and normalizes the images and
expands each image placeholder of the prompt into as many image tokens as the vision
encoder yields for it. Its output is cut here into one `MultiModalFeature` per image
(which tensors belong to which image and how many tokens each one fills are the model
class's business: `split_mm_data`, and `num_mm_tokens` per image or `mm_token_counts`
from the expanded ids), placed in order over the model's
image tokens in the expanded ids (or by the model's `mm_placeholder_ranges`, for an
image whose placeholder block holds other tokens too: Mistral 3's row breaks).
This runs in the API process; the features travel to the core with the Request.
"""
from __future__ import annotations

from typing import Any, Optional

from vllm.multimodal.hasher import hash_image
from vllm.multimodal.inputs import MultiModalFeature, placeholder_ranges

SUPPORTED_MODALITIES = ("image",)
DEFAULT_LIMIT_PER_PROMPT = 1
"""Images per prompt when --limit-mm-per-prompt does not say (vLLM's default)."""


def _pil():
    from PIL import Image
    return Image


def mm_limit(limits: Optional[dict[str, int]], modality: str) -> int:
    """Most items of `modality` one prompt may carry (--limit-mm-per-prompt)."""
    return (limits or {}).get(modality, DEFAULT_LIMIT_PER_PROMPT)


def normalize_images(mm_data: Any, limits: Optional[dict[str, int]]) -> list[Any]:
    """The list of PIL images of `multi_modal_data`; ValueError naming what is wrong."""
    if not isinstance(mm_data, dict):
        raise ValueError("multi_modal_data must be a dict such as {'image': image}.")
    for key in mm_data:
        if key not in SUPPORTED_MODALITIES:
            raise ValueError(f"multi_modal_data: modality {key!r} is not supported; "
                             f"supported: {', '.join(SUPPORTED_MODALITIES)}.")
    images = mm_data.get("image")
    if images is None:
        return []
    images = list(images) if isinstance(images, (list, tuple)) else [images]
    image_cls = _pil().Image
    for i, image in enumerate(images):
        if not isinstance(image, image_cls):
            raise ValueError(f"multi_modal_data['image'][{i}] must be a PIL.Image.Image, "
                             f"got {type(image).__name__}.")
    limit = mm_limit(limits, "image")
    if len(images) > limit:
        raise ValueError(f"At most {limit} image(s) may be provided in one prompt; got "
                         f"{len(images)} (raise it with --limit-mm-per-prompt "
                         "'{\"image\": N}').")
    return images


class MultiModalProcessor:
    """Prompt + images -> expanded token ids + one feature per image."""

    def __init__(self, model_config: Any) -> None:
        from vllm.model_executor.models.registry import ModelRegistry
        self.model_config = model_config
        self.model_cls, _ = ModelRegistry.resolve_model_cls(model_config.architectures,
                                                            model_config)
        if not hasattr(self.model_cls, "split_mm_data"):
            raise ValueError(f"{model_config.architectures} has a vision config but no "
                             "multimodal implementation here; --limit-mm-per-prompt "
                             "'{\"image\": 0}' serves its language model alone.")
        self.image_token_id = self.model_cls.image_token_id(model_config.hf_config)
        self.limits = model_config.limit_mm_per_prompt
        self._hf_processor = None

    @property
    def hf_processor(self) -> Any:
        """The checkpoint's AutoProcessor, loaded on first use."""
        if self._hf_processor is None:
            path = self.model_config.tokenizer_path or self.model_config.model_path
            loader = getattr(self.model_cls, "load_hf_processor", None)
            if loader is None:
                from transformers import AutoProcessor
                loader = AutoProcessor.from_pretrained
            self._hf_processor = loader(path)
        return self._hf_processor

    @property
    def image_placeholder(self) -> str:
        """The text a chat message's image part becomes (the processor expands its
        image token): the model's own (`chat_image_placeholder`) or the token alone."""
        own = getattr(self.model_cls, "chat_image_placeholder", None)
        if own is not None:
            return own(self.hf_processor)
        return getattr(self.hf_processor, "image_token", None) or "<image>"

    def process(self, prompt_text: str, mm_data: Any) -> tuple[list[int], list[MultiModalFeature]]:
        """(token ids, features); ValueError for bad or mismatched input."""
        images = normalize_images(mm_data, self.limits)
        if not images:
            ids = self.hf_processor.tokenizer.encode(prompt_text)
            return ids, []
        images = [im.convert("RGB") if im.mode != "RGB" else im for im in images]
        try:
            out = self.hf_processor(text=[prompt_text], images=images, return_tensors="pt")
        except (ValueError, TypeError, OSError) as e:
            raise ValueError(f"multi_modal_data: the model's processor rejected the "
                             f"input: {e}") from e
        ids = out["input_ids"][0].tolist()
        per_item = self.model_cls.split_mm_data(out, len(images))
        counts = getattr(self.model_cls, "mm_token_counts", None)
        lengths = (counts(out, ids, len(images), self.image_token_id) if counts else
                   [self.model_cls.num_mm_tokens(self.model_config.hf_config, d)
                    for d in per_item])
        own_ranges = getattr(self.model_cls, "mm_placeholder_ranges", None)
        runs = (own_ranges(ids, self.model_config.hf_config, lengths, per_item) if own_ranges
                else placeholder_ranges(ids, self.image_token_id, lengths))
        return ids, [MultiModalFeature(modality="image", identifier=hash_image(im),
                                       offset=off, length=n, data=data)
                     for im, (off, n), data in zip(images, runs, per_item)]
