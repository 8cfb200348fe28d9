"""Poolers: one vector per prompt from its hidden states (embeddings, class scores).

A pooling model's `forward` returns hidden states like any model; its `pooler` then
reduces each prompt's rows to one row (CLS: the first token, LAST: the last, MEAN: the
average over the prompt), runs the model's head on those rows when it has one (a
cross-encoder's classifier), and finishes each request by its `PoolingParams`:
embeddings are cut to `dimensions` (Matryoshka) and L2-normalized, class logits go
through softmax (sigmoid with one label) when `use_activation` is set. Everything after
the reduction runs in float32 on the pooled rows only.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vllm.pooling_params import PoolingParams

Head = Callable[[torch.Tensor], torch.Tensor]

TOKEN_TYPE_SHIFT = 30
"""A cross-encoder's second-segment tokens reach the model as `id | 1 << 30` (vLLM's
encoding): the input stays one int tensor of the usual shape on every platform, and
the BERT embeddings split type and id again. Vocabularies are far below 2**30."""


def pool_rows(hidden: torch.Tensor, pooling_type: str, row_offsets: Sequence[int],
              num_tokens: Sequence[int]) -> torch.Tensor:
    """[num_requests, hidden]: each request's rows (offset .. offset + n - 1) reduced."""
    if pooling_type == "MEAN":
        return torch.stack([hidden[o:o + n].float().mean(dim=0)
                            for o, n in zip(row_offsets, num_tokens)])
    if pooling_type == "CLS":
        rows = list(row_offsets)
    elif pooling_type == "LAST":
        rows = [o + n - 1 for o, n in zip(row_offsets, num_tokens)]
    else:
        raise ValueError(f"Unknown pooling type {pooling_type!r}.")
    return hidden.index_select(0, torch.tensor(rows, device=hidden.device))


def finish_pooled(row: torch.Tensor, task: str, params: PoolingParams) -> torch.Tensor:
    """One request's pooled float32 row after its params: the API's vector."""
    if task == "embed":
        if params.dimensions is not None:
            row = row[:params.dimensions]
        return F.normalize(row, p=2, dim=-1) if params.use_activation else row
    if not params.use_activation:
        return row
    return torch.sigmoid(row) if row.numel() == 1 else torch.softmax(row, dim=-1)


class Pooler(nn.Module):
    """Reduce and apply the head (`pooled`: flat rows; `pooled_padded`: a padded
    bucket); the runner then finishes each request with `finish_pooled`."""

    def __init__(self, pooling_type: str, task: str, head: Optional[Head] = None) -> None:
        super().__init__()
        if task not in ("embed", "classify"):
            raise ValueError(f"Unknown pooling task {task!r}.")
        self.pooling_type = pooling_type
        self.task = task
        self.head = head

    @classmethod
    def from_config(cls, model_config: Any, task: str, default_type: str,
                    head: Optional[Head] = None) -> "Pooler":
        """The pooler the model config asks for (its pooler_config's pooling_type, else
        `default_type`)."""
        pooler_config = getattr(model_config, "pooler_config", None)
        pooling_type = getattr(pooler_config, "pooling_type", None) or default_type
        return cls(pooling_type, task, head)

    def pooled(self, hidden: torch.Tensor, row_offsets: Sequence[int],
               num_tokens: Sequence[int]) -> torch.Tensor:
        """[num_requests, out] float32: reduced rows through the head (no activation)."""
        rows = pool_rows(hidden, self.pooling_type, row_offsets, num_tokens)
        if self.head is not None:
            rows = self.head(rows)
        return rows.float()

    def pooled_padded(self, hidden: torch.Tensor, lengths: torch.Tensor, batch: int,
                      seq: int) -> torch.Tensor:
        """[batch, out] float32 from a padded bucket's hidden states [batch * seq, hidden]
        (entry i: rows i * seq .. + lengths[i]): fixed shapes for a fixed bucket, so a
        static-shape device (HPU) compiles it once per bucket. Entries of length 0
        (padding) give finite garbage the caller drops."""
        h = hidden.view(batch, seq, hidden.shape[-1])
        lens = lengths.to(hidden.device).long()
        if self.pooling_type == "CLS":
            rows = h[:, 0]
        elif self.pooling_type == "LAST":
            last = (lens - 1).clamp(min=0)
            rows = h.gather(1, last.view(batch, 1, 1).expand(batch, 1, h.shape[-1]))[:, 0]
        else:  # MEAN over each entry's valid rows
            valid = torch.arange(seq, device=h.device)[None, :] < lens[:, None]
            total = (h.float() * valid[..., None]).sum(dim=1)
            rows = total / lens.clamp(min=1)[:, None]
        if self.head is not None:
            rows = self.head(rows.to(hidden.dtype) if self.pooling_type == "MEAN" else rows)
        return rows.float()
