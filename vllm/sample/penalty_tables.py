"""Token counts for the penalties, kept per batch row instead of rebuilt every step.

Repetition, frequency and presence penalties need, per row, how often each token
occurs in the output and whether it occurs in the prompt. Flattening every token
list each step costs time that grows with the sequences; these tables are written
once per row when a request gets it (from its token lists) and then follow the
output by one accumulate of the step's sampled tokens.

Dense `[rows, vocab]` rather than sparse: the update is one `index_put_`, the read a
row gather of fixed shape (what the HPU graphs need), and the memory is bounded:
int32 counts + a bool prompt mask are 5 bytes per (row, token), e.g. 256 rows
(max_num_seqs) x 49152 (SmolLM2's vocabulary) = 63 MB. The tables are allocated
only when a penalized request is first sampled, so a server whose requests never
use penalties does not pay for them.
"""
from __future__ import annotations

from typing import Sequence

import torch

from vllm.sample.metadata import flat_tokens


class PenaltyTables:
    """`output_counts[row, token]` (int32) and `prompt_mask[row, token]` (bool).

    Only rows that were written (`write_row`) hold meaningful values; the owner keeps
    track of which rows those are.
    """

    def __init__(self, num_rows: int, vocab_size: int, device: torch.device | str) -> None:
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.output_counts = torch.zeros(num_rows, vocab_size, dtype=torch.int32,
                                         device=device)
        self.prompt_mask = torch.zeros(num_rows, vocab_size, dtype=torch.bool, device=device)

    def write_row(self, row: int, prompt_token_ids: Sequence[int],
                  output_token_ids: Sequence[int]) -> None:
        """The row from scratch: counts of the output, presence of the prompt
        (tokens outside the vocabulary are ignored, as the sampler never sees them)."""
        self.output_counts[row].zero_()
        self.prompt_mask[row].zero_()
        _, prompt = flat_tokens([prompt_token_ids], self.vocab_size, self.device)
        self.prompt_mask[row, prompt] = True
        _, output = flat_tokens([output_token_ids], self.vocab_size, self.device)
        self.output_counts[row].index_add_(
            0, output, torch.ones_like(output, dtype=torch.int32))

    def copy_row(self, src: int, dst: int) -> None:
        self.output_counts[dst] = self.output_counts[src]
        self.prompt_mask[dst] = self.prompt_mask[src]

    def add_tokens(self, rows: Sequence[int], token_ids: Sequence[int]) -> None:
        """One more output occurrence of token_ids[i] in row rows[i] (repeats add up)."""
        pairs = [(r, t) for r, t in zip(rows, token_ids) if 0 <= t < self.vocab_size]
        if not pairs:
            return
        index = torch.tensor(pairs, dtype=torch.int64).T.to(self.device)
        ones = torch.ones(len(pairs), dtype=torch.int32, device=self.device)
        self.output_counts.index_put_((index[0], index[1]), ones, accumulate=True)
