"""The rejection sampler: verify drafts so the output is distributed as the target's.

A request with k drafts d_0..d_{k-1} has k + 1 logits rows: row j is the target's
prediction after the known tokens and d_0..d_{j-1}. Drafts are proposed greedily
(n-gram lookup, a draft model's argmax), i.e. the draft distribution q_j is one-hot
on d_j, so the standard rule of speculative sampling (Leviathan et al., Chen et
al.) reads, with p_j the target's processed distribution at row j (temperature,
top-k/p, min-p, masks: `Sampler.compute_probs`):

- accept d_j with probability min(1, p_j(d_j) / q_j(d_j)) = p_j(d_j);
- at the first rejection emit a token from norm(max(p_j - q_j, 0)), i.e. p_j with
  d_j removed and renormalized, and stop;
- when all k are accepted emit a bonus token from p_k.

Each emitted token is then distributed exactly as p_j given the tokens before it.
Greedy rows accept while the draft equals the target's argmax and emit the argmax
at the first mismatch (or the bonus row): token for token what decoding without
speculation gives. Seeded requests draw every uniform from their own generator, in
row order, so they are reproducible. Logprobs are the target's raw logprobs (before
any processing, as the sampler's) at each emitted token's row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from vllm.sample.logprobs import LogprobsLists, compute_logprobs, gather_logprobs
from vllm.sample.metadata import SamplingMetadata, greedy_sample
from vllm.sample.sampler import Sampler, random_sample

NO_DRAFT = -1
"""The draft token id of a request's last (bonus) row."""


@dataclass
class RejectionOutput:
    output_token_ids: list[list[int]]
    """Per request: its accepted drafts, then the recovered or bonus token."""
    num_accepted: list[int]
    """Per request: drafts accepted (len(output) - 1)."""
    logprobs: Optional[list[list[tuple[list[int], list[float], int]]]] = None
    """Per request, per emitted token: (ids [token, top-k...], logprobs, rank); None
    when no row asked for logprobs."""


def rejection_sample(sampler: Sampler, logits: torch.Tensor,
                     metadata: Optional[SamplingMetadata], draft_token_ids: torch.Tensor,
                     num_drafts: Sequence[int]) -> RejectionOutput:
    """Verify the drafts of a batch: `logits` [R, V] holds each request's
    num_drafts[i] + 1 rows in order, `draft_token_ids` [R] the draft each row checks
    (NO_DRAFT on bonus rows); `metadata` has one row per logits row (None: every row
    takes the argmax of its raw logits)."""
    if metadata is None:
        row_tokens = greedy_sample(logits)
        accepted = row_tokens == draft_token_ids
        return _assemble(row_tokens, accepted, num_drafts, None)
    raw_logprobs = None
    if metadata.max_num_logprobs is not None:
        raw_logprobs = compute_logprobs(logits)
    row_tokens, accepted = _verify_rows(sampler, logits, metadata, draft_token_ids)
    logprobs = None
    if raw_logprobs is not None:
        logprobs = gather_logprobs(raw_logprobs, metadata.max_num_logprobs,
                                   row_tokens).tolists()
    return _assemble(row_tokens, accepted, num_drafts, logprobs)


def _verify_rows(sampler: Sampler, logits: torch.Tensor, md: SamplingMetadata,
                 drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(token each row emits if reached, whether its draft is accepted), per row."""
    logits = sampler.apply_logit_processing(logits.to(torch.float32), md,
                                            sampler.static_shapes)
    greedy = None if md.all_random else greedy_sample(logits)
    if md.all_greedy:
        return greedy, greedy == drafts
    has_draft = drafts != NO_DRAFT
    safe_drafts = drafts.clamp(min=0).unsqueeze(1)
    probs = sampler.compute_probs(logits, md)
    draft_probs = probs.gather(1, safe_drafts).squeeze(1)
    accepted = has_draft & (_uniforms(probs.shape[0], has_draft, md.generators)
                            < draft_probs)
    # Where a draft is rejected, resample from p with the draft removed; bonus rows
    # (no draft) sample from p itself.
    residual = probs.scatter(1, safe_drafts, 0.0)
    residual = torch.where(has_draft.unsqueeze(1), residual, probs)
    recovered = random_sample(residual, md.generators)
    row_tokens = torch.where(accepted, drafts, recovered)
    if greedy is not None:
        row_tokens = torch.where(md.greedy_mask, greedy, row_tokens)
        accepted = torch.where(md.greedy_mask, greedy == drafts, accepted)
    return row_tokens, accepted


def _uniforms(num_rows: int, has_draft: torch.Tensor,
              generators: dict[int, torch.Generator]) -> torch.Tensor:
    """One U[0, 1) per row that checks a draft: seeded rows from their generator (in
    row order), the others from the global one."""
    u = torch.rand(num_rows, device=has_draft.device)
    draft_rows = has_draft.tolist()
    for row, gen in sorted(generators.items()):
        if draft_rows[row]:
            u[row] = torch.rand(1, generator=gen, device=gen.device).to(u.device)[0]
    return u


def _assemble(row_tokens: torch.Tensor, accepted: torch.Tensor, num_drafts: Sequence[int],
              logprobs: Optional[LogprobsLists]) -> RejectionOutput:
    """Cut each request's rows at its first rejected draft."""
    tokens = row_tokens.tolist()
    ok = accepted.tolist()
    out = RejectionOutput([], [], [] if logprobs is not None else None)
    row = 0
    for k in num_drafts:
        n = 0
        while n < k and ok[row + n]:
            n += 1
        out.output_token_ids.append(tokens[row:row + n + 1])
        out.num_accepted.append(n)
        if logprobs is not None:
            out.logprobs.append([(logprobs[0][r], logprobs[1][r], logprobs[2][r])
                                 for r in range(row, row + n + 1)])
        row += k + 1
    return out
