"""Log probabilities of sampled (or prompt) tokens, their ranks and the top-K alternatives."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch


class LogprobsLists(NamedTuple):
    """`LogprobsTensors` moved to Python lists (what the engine core hands the frontend)."""
    logprob_token_ids: list[list[int]]
    logprobs: list[list[float]]
    selected_token_ranks: list[int]

    def slice(self, start: int, end: int) -> "LogprobsLists":
        return LogprobsLists(self.logprob_token_ids[start:end], self.logprobs[start:end],
                             self.selected_token_ranks[start:end])


@dataclass
class LogprobsTensors:
    """Per row: column 0 is the selected token, columns 1..K the top-K by logprob.

    `selected_token_ranks[i]` is 1 + the number of vocabulary entries whose logprob is
    strictly greater than the selected token's (so the argmax has rank 1).
    """
    logprob_token_ids: torch.Tensor  # [N, K+1] int64
    logprobs: torch.Tensor  # [N, K+1] float32
    selected_token_ranks: torch.Tensor  # [N] int64

    def tolists(self) -> LogprobsLists:
        return LogprobsLists(self.logprob_token_ids.tolist(), self.logprobs.tolist(),
                             self.selected_token_ranks.tolist())

    def slice(self, start: int, end: int) -> "LogprobsTensors":
        return LogprobsTensors(self.logprob_token_ids[start:end], self.logprobs[start:end],
                               self.selected_token_ranks[start:end])

    @staticmethod
    def concat(parts: list["LogprobsTensors"]) -> "LogprobsTensors":
        """Join rows of several chunks (prompt logprobs computed chunk by chunk)."""
        return LogprobsTensors(torch.cat([p.logprob_token_ids for p in parts]),
                               torch.cat([p.logprobs for p in parts]),
                               torch.cat([p.selected_token_ranks for p in parts]))


def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax in float32, whatever the logits' dtype."""
    return torch.log_softmax(logits, dim=-1, dtype=torch.float32)


def gather_logprobs(logprobs: torch.Tensor, num_logprobs: int,
                    token_ids: torch.Tensor) -> LogprobsTensors:
    """Pick the selected token's logprob and rank, and the top `num_logprobs` entries."""
    selected = token_ids.to(torch.int64).unsqueeze(-1)
    selected_logprobs = logprobs.gather(-1, selected)
    ranks = (logprobs > selected_logprobs).sum(-1) + 1
    if num_logprobs > 0:
        top_logprobs, top_ids = torch.topk(logprobs, num_logprobs, dim=-1)
        ids = torch.cat([selected, top_ids], dim=1)
        values = torch.cat([selected_logprobs, top_logprobs], dim=1)
    else:
        ids, values = selected, selected_logprobs
    return LogprobsTensors(ids, values, ranks)


def compute_prompt_logprobs(logits: torch.Tensor, target_token_ids: torch.Tensor,
                            num_logprobs: int) -> LogprobsTensors:
    """Logprobs of each prompt token given the tokens before it.

    Row i of `logits` is the model's prediction at prompt position i, and
    `target_token_ids[i]` the prompt token at position i + 1.
    """
    return gather_logprobs(compute_logprobs(logits), num_logprobs, target_token_ids)
