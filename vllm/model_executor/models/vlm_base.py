"""What every vision-language model here shares: a text model it hands the tokens to.

LLaVA and Qwen2.5-VL wrap a causal LM (`self.language_model`); the runner calls the
wrapper as it calls a text model, and image embeddings arrive merged into
`inputs_embeds` (the runner's `gather_mm_embeddings` hook), so these calls only pass
through.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Sequence

import torch

from vllm.sequence import IntermediateTensors


class LanguageModelDelegate:
    """The text-model half of a vision-language model's interface."""

    language_model: Any

    @staticmethod
    def image_token_id(hf_config: Any) -> int:
        """The token an image's placeholder run is made of (transformers 4 / 5 names)."""
        tid = getattr(hf_config, "image_token_id", None)
        return tid if tid is not None else hf_config.image_token_index

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.model.embed_tokens(input_ids)

    def forward(self, input_ids: Optional[torch.Tensor], positions: torch.Tensor,
                intermediate_tensors: Optional[IntermediateTensors] = None,
                inputs_embeds: Optional[torch.Tensor] = None) -> Any:
        """`positions`: [T], or [3, T] M-RoPE rows for a model with M-RoPE."""
        return self.language_model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.language_model.compute_logits(hidden_states)

    def make_empty_intermediate_tensors(self, *args: Any, **kwargs: Any) -> Any:
        return self.language_model.make_empty_intermediate_tensors(*args, **kwargs)


def load_vlm_weights(model: Any, weights: Iterable[tuple[str, torch.Tensor]],
                     renames: Sequence[tuple[str, str]],
                     rename: Optional[Callable[[str], str]] = None,
                     skip: Optional[Callable[[str], bool]] = None) -> set[str]:
    """A vision-language model's `load_weights`: each checkpoint name through the first
    matching `(old prefix, new prefix)` of `renames` (the two namings of transformers 4
    and 5) and then `rename`; `language_model.*` to the language model's own loader, the
    rest (vision tower, projector) copied by name, except what `skip` says this model
    does not build. An unknown tensor and a vision parameter left empty are errors."""
    own = dict(model.named_parameters())
    loaded: set[str] = set()
    text_weights: list[tuple[str, torch.Tensor]] = []
    for name, tensor in weights:
        for old, new in renames:
            if name.startswith(old):
                name = new + name[len(old):]
                break
        if rename is not None:
            name = rename(name)
        if name.startswith("language_model."):
            text_weights.append((name[len("language_model."):], tensor))
            continue
        if skip is not None and skip(name):
            continue
        if name not in own:
            raise ValueError(f"Checkpoint tensor {name!r} has no parameter in "
                             f"{type(model).__name__}.")
        own[name].data.copy_(tensor)
        loaded.add(name)
    loaded |= {f"language_model.{n}" for n in model.language_model.load_weights(text_weights)}
    missing = sorted(n for n in own if n not in loaded and not n.startswith("language_model."))
    if missing:
        raise ValueError(f"Checkpoint is missing vision weights: {missing[:8]}")
    return loaded
