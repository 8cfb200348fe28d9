"""Images of chat requests, server side: the placeholder each image part becomes, the
per-prompt limit, and loading the URLs (vllm/multimodal/media.py) off the event loop.

Limits are checked before anything is fetched; every failure is the client's 400
naming `messages`, and the server keeps serving.
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

from vllm.entrypoints.openai.errors import BadRequestError
from vllm.multimodal.media import load_image_url
from vllm.multimodal.processing import mm_limit


class ChatImages:

    def __init__(self, model_config: Any) -> None:
        self.model_config = model_config
        self.enabled = bool(getattr(model_config, "is_multimodal_model", False))
        self._processor: Any = None

    @property
    def processor(self) -> Any:
        """The model's MultiModalProcessor (vllm/multimodal/processing.py), loaded once."""
        if self._processor is None:
            from vllm.multimodal.processing import MultiModalProcessor
            self._processor = MultiModalProcessor(self.model_config)
        return self._processor

    @property
    def placeholder(self) -> Optional[str]:
        """The model's image placeholder text (None: a text-only model, whose chat
        requests may not carry images)."""
        return self.processor.image_placeholder if self.enabled else None

    def expanded_ids(self, text: str, images: list[Any]) -> list[int]:
        """The prompt's token ids with each image's placeholder expanded, as the engine
        will see them (what /tokenize reports)."""
        try:
            return self.processor.process(text, {"image": images})[0]
        except ValueError as e:
            raise BadRequestError(str(e), param="messages") from e

    async def load(self, refs: list[Any]) -> list[Any]:
        """PIL images of the request's image references, in order."""
        limit = mm_limit(self.model_config.limit_mm_per_prompt, "image")
        if len(refs) > limit:
            raise BadRequestError(f"At most {limit} image(s) may be provided in one prompt; "
                                  f"got {len(refs)}.", param="messages")
        root = self.model_config.allowed_local_media_path
        try:
            return list(await asyncio.gather(*(
                asyncio.to_thread(load_image_url, ref, root) for ref in refs)))
        except ValueError as e:
            raise BadRequestError(str(e), param="messages") from e
