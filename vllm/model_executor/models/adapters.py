"""Decoders as embedding models (vLLM's `--convert embed`): Qwen3-Embedding style.

The decoder runs as usual (causal attention, paged KV cache); instead of the LM head,
a pooler takes the last token's final hidden state (or the pooling the model's
sentence-transformers files name) as the embedding. Embedding checkpoints saved from the
bare decoder (`Qwen3Model`) name their tensors without the `model.` prefix; both
spellings load.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from vllm.model_executor.layers.pooler import Pooler
from vllm.model_executor.models.utils import PPMissingLayer


def as_embedding_model(cls: type[nn.Module]) -> type[nn.Module]:
    """A subclass of the causal LM `cls` without an LM head, with a last-token pooler."""

    class EmbeddingModel(cls):  # type: ignore[misc, valid-type]
        is_pooling_model = True

        def __init__(self, vllm_config: Any, prefix: str = "") -> None:
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            if vllm_config.parallel_config.pipeline_parallel_size > 1:
                raise ValueError("convert='embed' runs without pipeline parallelism "
                                 "(pipeline_parallel_size must be 1).")
            self.lm_head = PPMissingLayer()  # never used: no logits
            self.tie_word_embeddings = False
            self.pooler = Pooler.from_config(vllm_config.model_config, "embed", "LAST")

        def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
            raise ValueError("This model runs as an embedding model (--convert embed): it "
                             "computes no logits.")

        def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
            return super().load_weights(
                (name if name.startswith("model.") else f"model.{name}", tensor)
                for name, tensor in weights if not name.startswith("lm_head."))

    EmbeddingModel.__name__ = EmbeddingModel.__qualname__ = \
        cls.__name__.replace("ForCausalLM", "") + "EmbeddingModel"
    return EmbeddingModel
