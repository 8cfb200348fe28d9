"""The sampler: logits of the last position of each request -> next token ids (+ logprobs).

Order (vLLM V1): raw logprobs (if requested) -> float32 -> the knobs that edit the
logits (allowed_token_ids, min_tokens, bad_words, logit_bias, penalties) -> argmax for
greedy rows; for the others temperature -> min_p -> top_k / top_p -> random sample.
Which knobs exist and what each does is the table in logits_processors/.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from vllm.sample.host_copy import device_to_host
from vllm.sample.logprobs import (LogprobsLists, LogprobsTensors, compute_logprobs,
                                  gather_logprobs)
from vllm.sample.logits_processors import apply_logits, apply_probs
from vllm.sample.metadata import SamplingMetadata, greedy_sample


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [N] int64
    logprobs_tensors: Optional[LogprobsTensors]  # None when no row asked for logprobs

    def tolists(self) -> tuple[list[int], Optional[LogprobsLists]]:
        """(sampled token ids, logprobs) on the host, read back with one wait for the
        device (the step's only synchronisation, see host_copy.py)."""
        lp = self.logprobs_tensors
        if lp is None:
            return device_to_host([self.sampled_token_ids])[0].tolist(), None
        ids, lp_ids, lp_values, ranks = device_to_host(
            [self.sampled_token_ids, lp.logprob_token_ids, lp.logprobs,
             lp.selected_token_ranks])
        return ids.tolist(), LogprobsTensors(lp_ids, lp_values, ranks).tolists()


class Sampler(nn.Module):
    """Stateless: all per-request state (history, generators) comes in the metadata.

    The logits tensor belongs to the sampler once passed: it may be modified in place.
    With `static_shapes` (HPU) top-k / top-p take the full-sort path and penalties
    the whole-row path, whose shapes depend only on the logits' and the metadata's
    (the default paths look at a window first and sort the rows it did not resolve,
    or find the seen tokens: data-dependent shapes).

    On a GPU `forward` never waits for the device: every data-dependent decision
    is taken from host-side metadata, host values are copied asynchronously
    (host_copy.py), and the caller reads the result back once (`tolists`).
    """

    def __init__(self, static_shapes: bool = False,
                 avoid_host_syncs: Optional[bool] = None) -> None:
        """`avoid_host_syncs`: take the sync-free paths (None: on any non-CPU device;
        on CPU the data-dependent paths are cheaper)."""
        super().__init__()
        self.static_shapes = static_shapes
        self.avoid_host_syncs = avoid_host_syncs

    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        if logits.dim() != 2 or logits.shape[0] != metadata.num_rows:
            raise ValueError(f"logits must be [{metadata.num_rows}, vocab], got "
                             f"{tuple(logits.shape)}")
        raw_logprobs = None
        if metadata.max_num_logprobs is not None:
            # Logprobs of the model's own distribution, before any processing.
            raw_logprobs = compute_logprobs(logits)
        if metadata.needs_logit_processing or not metadata.all_greedy:
            logits = logits.to(torch.float32)
            logits = self.apply_logit_processing(logits, metadata, self.static_shapes)
        sampled = self.sample(logits, metadata)
        logprobs_tensors = None
        if raw_logprobs is not None:
            logprobs_tensors = gather_logprobs(raw_logprobs, metadata.max_num_logprobs,
                                               sampled)
        return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=logprobs_tensors)

    @staticmethod
    def apply_logit_processing(logits: torch.Tensor, md: SamplingMetadata,
                               static_shapes: bool = False) -> torch.Tensor:
        """Constraints, biases and penalties: everything the greedy argmax also sees
        (penalties on whole rows with `static_shapes`, same values)."""
        return apply_logits(logits, md, static_shapes)

    def sample(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        greedy = None if md.all_random else greedy_sample(logits)
        if md.all_greedy:
            return greedy
        probs = self.compute_probs(logits, md)
        sampled = random_sample(probs, md.generators)
        if greedy is None:
            return sampled
        return torch.where(md.greedy_mask, greedy, sampled)

    def compute_probs(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """The distribution random rows sample from: processed float32 logits (in place)
        -> temperature -> min_p -> top-k / top-p -> softmax. Speculative decoding's
        rejection sampler verifies drafts against exactly this."""
        logits = apply_probs(logits, md, self)
        return torch.softmax(logits, dim=-1, dtype=torch.float32)

    def avoids_host_syncs(self, logits: torch.Tensor) -> bool:
        """Whether to take the sync-free paths for these logits (see `__init__`)."""
        if self.avoid_host_syncs is not None:
            return self.avoid_host_syncs
        return logits.device.type != "cpu"


def random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Sample one token per row as argmax(probs / q), q ~ Exp(1) (no host sync needed).

    P(argmax = i) = p_i / sum(p), the same law as torch.multinomial. q is drawn as
    -log(u), u ~ U[0, 1), which is several times cheaper than `exponential_` on CPU;
    argmax(p / -log u) = argmin(p / log u). Seeded rows draw u from their own
    generator, so their samples do not depend on their batch mates; the other rows
    share one draw from the global generator.
    """
    u = torch.empty_like(probs)
    if len(generators) < probs.shape[0]:
        u.uniform_()
    for row, gen in generators.items():
        u[row].uniform_(generator=gen)
    # log u < 0 (u < 1); u = 0 gives -inf and a ratio of -0: that token is not picked.
    return probs.div_(u.log_()).argmin(dim=-1)
