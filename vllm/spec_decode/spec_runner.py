"""The model runner's half of speculative decoding (one instance per runner).

Per step, around the platform's layout and forward:

1. `place_drafts` (from `ModelRunnerBase.update_draft_tokens`): each request's
   scheduled drafts go after its known tokens in `token_ids`, so the platform lays
   them out like any other new token; `num_drafts` tells it which requests verify
   drafts (they get logits at their last k + 1 rows);
2. `remove_drafts` after the forward, on every rank: drafts never stay in a state;
3. `verify` (driver): the rejection sampler on those rows; the runner appends the
   emitted tokens;
4. `propose` (driver): the next step's drafts, returned in `ModelRunnerOutput.
   spec_token_ids`; the scheduler decides how many of them it schedules.

A request gets drafts only when the target's distribution at each verification row
is known up front: no knob of the sampling table whose effect depends on the output
so far (`holds_drafts_back`: penalties, min_tokens still in force, a bad word of
several tokens), which the drafts would change row by row. Such requests decode one
token per step, exactly as without speculation. Structured outputs are served: the
scheduler keeps only drafts the grammar accepts and sends one bitmask row per
verification row (the grammar advanced over the drafts before it, then rolled back).
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Protocol

import torch

from vllm.sample.sampler import Sampler
from vllm.sample.logits_processors import holds_drafts_back
from vllm.spec_decode.config import SpeculativeConfig
from vllm.spec_decode.draft_model_proposer import DraftModelProposer
from vllm.spec_decode.ngram_proposer import NgramProposer
from vllm.spec_decode.rejection_sampler import NO_DRAFT, RejectionOutput, rejection_sample

logger = logging.getLogger(__name__)


class Proposer(Protocol):
    def propose_batch(self, states: list[Any], max_drafts: list[int]) -> list[list[int]]:
        """Drafts (up to k, at most max_drafts[i]) after each request state's
        `token_ids`."""


class SpecDecodeRunner:

    def __init__(self, vllm_config: Any, device: torch.device) -> None:
        config: SpeculativeConfig = vllm_config.speculative_config
        self.config = config
        self.max_model_len = vllm_config.model_config.max_model_len
        self.proposer: Proposer
        self.draft_model: Optional[DraftModelProposer] = None
        """The proposer when it is a model (it needs loading and a KV cache)."""
        if config.use_draft_model:
            self.proposer = self.draft_model = DraftModelProposer(
                vllm_config, config.num_speculative_tokens,
                vllm_config.cache_config.block_size, device)
        else:
            self.proposer = NgramProposer(config.num_speculative_tokens,
                                          config.prompt_lookup_min, config.prompt_lookup_max)
        self.num_drafts: dict[str, int] = {}
        """Requests verifying drafts this step -> how many."""
        self._drafts: dict[str, list[int]] = {}

    # ------------------------------------------------------------- the step
    def place_drafts(self, so: Any, requests: dict[str, Any]) -> None:
        if self.draft_model is not None:
            for req_id in so.finished_req_ids:
                self.draft_model.forget(req_id)
            for cached in so.scheduled_cached_reqs:
                if cached.resumed_from_preemption:
                    self.draft_model.forget(cached.req_id)
        self._drafts = {r: list(d) for r, d in so.scheduled_spec_decode_tokens.items() if d}
        self.num_drafts = {r: len(d) for r, d in self._drafts.items()}
        for req_id, drafts in self._drafts.items():
            requests[req_id].token_ids.extend(drafts)

    def remove_drafts(self, requests: dict[str, Any]) -> None:
        for req_id, k in self.num_drafts.items():
            del requests[req_id].token_ids[-k:]

    def verify(self, sampler: Sampler, logits: torch.Tensor, req_ids: list[str],
               metadata: Any) -> tuple[list[str], RejectionOutput]:
        """The rejection sampler on a step's sampling rows (row i: request req_ids[i],
        a request's k + 1 verification rows in a row; rows of `logits` past them are
        fixed-shape padding): (requests in order, result)."""
        order: list[str] = []
        drafts: list[int] = []
        for i, req_id in enumerate(req_ids):
            if i == 0 or req_ids[i - 1] != req_id:
                order.append(req_id)
                drafts.extend(self._drafts.get(req_id, ()))
                drafts.append(NO_DRAFT)
        if len(drafts) != len(req_ids):
            raise RuntimeError(f"speculative decoding: {len(req_ids)} sampling rows for "
                               f"{len(drafts)} draft and bonus tokens")
        drafts += [NO_DRAFT] * (logits.shape[0] - len(drafts))
        draft_ids = torch.tensor(drafts, dtype=torch.int64, device=logits.device)
        num_drafts = [self.num_drafts.get(r, 0) for r in order]
        return order, rejection_sample(sampler, logits, metadata, draft_ids, num_drafts)

    def propose(self, requests: dict[str, Any], sampled: dict[str, list[int]]
                ) -> dict[str, list[int]]:
        """Drafts for the next step of each request that just sampled (see the module
        docstring for which may have drafts)."""
        ids = [r for r, tokens in sampled.items()
               if tokens and self.can_speculate(requests[r])]
        if not ids:
            return {}
        states = [requests[r] for r in ids]
        rooms = [self.max_model_len - len(st.token_ids) - 1 for st in states]
        drafts = self.proposer.propose_batch(states, rooms)
        return {r: d for r, d in zip(ids, drafts) if d}

    @staticmethod
    def can_speculate(state: Any) -> bool:
        return not holds_drafts_back(state.sampling_params, len(state.output_token_ids))
