"""Hidden states -> next-token logits over the full vocabulary."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from vllm.distributed import tensor_model_parallel_all_gather
from vllm.model_executor.kernels import linear
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding


class LogitsProcessor(nn.Module):
    """Project with the LM head, gather the vocabulary shards, drop padding rows.

    Every TP rank returns the full `[N, vocab_size]` logits, so the sampler can run
    on any rank. `scale` multiplies the logits (some models scale them);
    `soft_cap` applies `cap * tanh(logits / cap)` (Gemma 2 style).
    """

    def __init__(self, vocab_size: int, scale: float = 1.0,
                 soft_cap: Optional[float] = None) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.scale = scale
        self.soft_cap = soft_cap

    def forward(self, lm_head: VocabParallelEmbedding,
                hidden_states: torch.Tensor) -> torch.Tensor:
        logits = linear(lm_head, hidden_states, lm_head.weight,
                        getattr(lm_head, "bias", None))
        if lm_head.tp_size > 1:
            logits = tensor_model_parallel_all_gather(logits, dim=-1)
        if logits.shape[-1] != self.vocab_size:
            logits = logits[..., :self.vocab_size]
        if self.soft_cap is not None:
            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap
        if self.scale != 1.0:
            logits = logits * self.scale
        return logits

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, scale={self.scale}, soft_cap={self.soft_cap}"
