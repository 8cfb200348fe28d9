"""Token statistics for the penalties, kept per batch row instead of rebuilt every step.

Repetition, frequency and presence penalties need, per row, how often each token
occurs in the output and whether it occurs in the prompt. Flattening every token
list each step costs time that grows with the sequences; these tables are written
once per row when a request gets it (from its token lists) and then follow the
output by one accumulate of the step's sampled tokens:

- `token_stats[row, token]` (int32, dense): 2 x the token's count in the output,
  plus 1 if it occurs in the prompt; nonzero = seen. Dense so that the update is one
  `index_put_` and the whole-row read has fixed shapes (HPU graphs). One int32 per
  (row, token): 256 rows (max_num_seqs) x 49152 (SmolLM2's vocabulary) = 50 MB,
  allocated only when a penalized request is first sampled (a server whose
  requests never use penalties does not pay for it).
- `seen[row]`: the row's distinct seen tokens, appended as new ones appear, so the
  default (CPU) path touches only the seen (row, token) pairs, never a whole row.
  A host set mirrors them: recording a step's tokens reads nothing from the device.
"""
from __future__ import annotations

from itertools import chain
from typing import Optional, Sequence

import torch

from vllm.sample.host_copy import flat_tokens, host_to_device

PROMPT_BIT = 1
OUTPUT_STEP = 2
"""token_stats = OUTPUT_STEP * output count + PROMPT_BIT * (in the prompt)."""


class SeenTokens:
    """One row's distinct seen token ids (int64), in a device buffer that grows by
    doubling, with a host set of the same ids: whether a sampled token is new is
    decided on the host (no read of the device tables each step)."""

    def __init__(self, token_ids: Sequence[int], device: torch.device | str) -> None:
        """`token_ids`: distinct ids, on the host."""
        self.known = set(token_ids)
        self.num_tokens = len(self.known)
        self._buffer = torch.empty(max(16, 2 * self.num_tokens), dtype=torch.int64,
                                   device=device)
        if self.num_tokens:
            self._buffer[:self.num_tokens] = host_to_device(sorted(self.known),
                                                            torch.int64, device)

    def tokens(self) -> torch.Tensor:
        return self._buffer[:self.num_tokens]

    def extend(self, token_ids: list[int]) -> None:
        """Append ids not seen before (distinct)."""
        self.known.update(token_ids)
        end = self.num_tokens + len(token_ids)
        if end > self._buffer.numel():
            grown = self._buffer.new_empty(2 * end)
            grown[:self.num_tokens] = self.tokens()
            self._buffer = grown
        self._buffer[self.num_tokens:end] = host_to_device(token_ids, torch.int64,
                                                           self._buffer.device)
        self.num_tokens = end


class PenaltyTables:
    """`token_stats` and `seen` of the module doc, for `num_rows` rows. Only rows that
    were written (`write_row`) hold meaningful values; the owner tracks which."""

    def __init__(self, num_rows: int, vocab_size: int, device: torch.device | str) -> None:
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.token_stats = torch.zeros(num_rows, vocab_size, dtype=torch.int32,
                                       device=device)
        self.seen: list[Optional[SeenTokens]] = [None] * num_rows

    def write_row(self, row: int, prompt_token_ids: Sequence[int],
                  output_token_ids: Sequence[int]) -> None:
        """The row from scratch (tokens outside the vocabulary are ignored, as the
        sampler never sees them)."""
        stats = self.token_stats[row]
        stats.zero_()
        _, prompt = flat_tokens([prompt_token_ids], self.vocab_size, self.device)
        stats[prompt] = PROMPT_BIT
        _, output = flat_tokens([output_token_ids], self.vocab_size, self.device)
        stats.index_add_(0, output, torch.full_like(output, OUTPUT_STEP, dtype=torch.int32))
        in_vocab = [t for t in chain(prompt_token_ids, output_token_ids)
                    if 0 <= t < self.vocab_size]
        self.seen[row] = SeenTokens(in_vocab, self.device)

    def move_row(self, src: int, dst: int) -> None:
        self.token_stats[dst] = self.token_stats[src]
        self.seen[dst], self.seen[src] = self.seen[src], None

    def clear_row(self, row: int) -> None:
        self.seen[row] = None

    def add_tokens(self, rows: Sequence[int], token_ids: Sequence[int]) -> None:
        """One more output occurrence of token_ids[i] in row rows[i] (repeats add up)."""
        pairs = [(r, t) for r, t in zip(rows, token_ids) if 0 <= t < self.vocab_size]
        if not pairs:
            return
        index = host_to_device(pairs, torch.int64, self.device).T
        self.token_stats.index_put_(
            (index[0], index[1]),
            torch.full((len(pairs),), OUTPUT_STEP, dtype=torch.int32, device=self.device),
            accumulate=True)
        new: dict[int, list[int]] = {}
        for row, token in pairs:
            fresh = new.setdefault(row, [])
            if token not in self.seen[row].known and token not in fresh:
                fresh.append(token)
        for row, tokens in new.items():
            if tokens:
                self.seen[row].extend(tokens)
