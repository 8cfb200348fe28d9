"""What every vision-language model here shares: a text model it hands the tokens to.

LLaVA and Qwen2.5-VL wrap a causal LM (`self.language_model`); the runner calls the
wrapper as it calls a text model, and image embeddings arrive merged into
`inputs_embeds` (the runner's `gather_mm_embeddings` hook), so these calls only pass
through.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from vllm.sequence import IntermediateTensors


class LanguageModelDelegate:
    """The text-model half of a vision-language model's interface."""

    language_model: Any

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
