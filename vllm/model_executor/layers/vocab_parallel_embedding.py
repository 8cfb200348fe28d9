"""Token embedding and LM head, split over tensor-parallel ranks by vocabulary rows."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm.distributed import (get_tensor_model_parallel_rank,
                              get_tensor_model_parallel_world_size,
                              tensor_model_parallel_all_reduce)


class VocabParallelEmbedding(nn.Module):
    """Embedding table whose rows (token ids) are split evenly over TP ranks.

    The vocabulary is padded up to a multiple of the TP size, so every rank holds
    `ceil(vocab / tp)` rows; padding rows stay zero and are never looked up. With
    TP > 1 each rank embeds only the ids it owns (zeros elsewhere) and an
    all-reduce sums the partial results.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 params_dtype: Optional[torch.dtype] = None, prefix: str = "") -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.prefix = prefix
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.num_embeddings_per_partition = -(-num_embeddings // self.tp_size)
        self.vocab_start_index = self.tp_rank * self.num_embeddings_per_partition
        self.vocab_end_index = min(self.vocab_start_index + self.num_embeddings_per_partition,
                                   num_embeddings)
        self.num_embeddings_padded = self.num_embeddings_per_partition * self.tp_size
        shard = self.num_embeddings_per_partition
        dtype = params_dtype or torch.get_default_dtype()
        self.weight = nn.Parameter(torch.empty(shard, embedding_dim, dtype=dtype),
                                   requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,
                      shard_id=None) -> None:
        if loaded_weight.shape != (self.num_embeddings, self.embedding_dim):
            raise ValueError(f"shape mismatch loading {self.prefix}: checkpoint "
                             f"{tuple(loaded_weight.shape)}, expected "
                             f"{(self.num_embeddings, self.embedding_dim)}.")
        n = self.vocab_end_index - self.vocab_start_index
        param.data[:n].copy_(loaded_weight.narrow(0, self.vocab_start_index, n))
        param.data[n:].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        in_range = (input_ids >= self.vocab_start_index) & (input_ids < self.vocab_end_index)
        local_ids = (input_ids - self.vocab_start_index) * in_range
        out = F.embedding(local_ids, self.weight) * in_range.unsqueeze(-1).to(self.weight.dtype)
        return tensor_model_parallel_all_reduce(out)

    def extra_repr(self) -> str:
        return (f"num_embeddings={self.num_embeddings_per_partition}/{self.num_embeddings}, "
                f"embedding_dim={self.embedding_dim}, tp_size={self.tp_size}")


class ParallelLMHead(VocabParallelEmbedding):
    """Output projection to the vocabulary, sharded like the embedding.

    Its weight is used by `LogitsProcessor`, never through `forward`. With tied
    word embeddings, `tie_weights(embed_tokens)` makes both modules share one
    parameter (on a pipeline stage that holds both).
    """

    packable_weight = True
    """The runner may attach a packed copy of the weight (see cpu_gemm)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False,
                 params_dtype: Optional[torch.dtype] = None, prefix: str = "") -> None:
        super().__init__(num_embeddings, embedding_dim, params_dtype, prefix)
        if bias:
            self.bias = nn.Parameter(torch.zeros(self.num_embeddings_per_partition,
                                                 dtype=self.weight.dtype), requires_grad=False)
            self.bias.weight_loader = self._bias_loader
        else:
            self.register_parameter("bias", None)

    def _bias_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,
                     shard_id=None) -> None:
        n = self.vocab_end_index - self.vocab_start_index
        param.data[:n].copy_(loaded_weight.narrow(0, self.vocab_start_index, n))
        param.data[n:].zero_()

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> "ParallelLMHead":
        self.weight = embed_tokens.weight
        return self

    def forward(self, *args, **kwargs):
        raise RuntimeError("ParallelLMHead's weight is applied by LogitsProcessor; "
                           "do not call it directly.")
