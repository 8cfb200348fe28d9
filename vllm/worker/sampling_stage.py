"""The runner's sampling stage: from each pass's logits to the step's tokens.

What happens to a pass's sampling logits whatever the device lays out its inputs:
the logits processors that are not knobs of the sampler (the structured-output
bitmask, the user's custom processors: a processor that raises fails only its
requests), prompt logprobs from the pass's hidden states, then sampling (the argmax
fast path or the sampler; with draft tokens in the step, their verification) and
the bookkeeping of the sampled tokens (request states, the batch's penalty counts,
the logprobs asked for).

The model runner holds one stage and calls it at fixed points of its step
(`ModelRunnerBase.execute_model`); the stage shares the runner's request states and
persistent input batch and never lays out inputs or runs the model. This is the
flat form (CPU, GPU): the sampling rows of every pass gathered into one sampler
call. Platforms with fixed shapes subclass it (HPU: vllm/hpu/sampling_stage.py,
each pass sampled on its bucket's shape, and the warmup of every such shape).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch

from vllm.core.sched_output import SchedulerOutput
from vllm.sample.logits_processors.custom import CustomLogitsProcessors
from vllm.sample.logprobs import compute_prompt_logprobs
from vllm.sample.metadata import greedy_sample
from vllm.sample.ops.bitmask import apply_grammar_bitmask
from vllm.sample.sampler import Sampler
from vllm.worker.input_batch import InputBatch
from vllm.worker.request_state import CachedRequestState

if TYPE_CHECKING:
    from vllm.spec_decode.spec_runner import SpecDecodeRunner
    from vllm.worker.model_runner_base import ForwardPass, PassOutput

LogprobsRow = tuple[list[int], list[float], int]
PromptLogprobs = tuple[list[list[int]], list[list[float]], list[int]]
StepSamples = tuple[dict[str, list[int]], dict[str, list[LogprobsRow]]]
"""Request -> its sampled (or verified) tokens, and -> their logprobs if it asked."""
PendingPass = tuple["ForwardPass", "PassOutput", torch.Tensor]
"""A pass, its output and its sampling logits after the logits processors."""


class SamplingStage:
    """Logits processors, prompt logprobs and sampling of one runner (flat form)."""

    def __init__(self, requests: dict[str, CachedRequestState], input_batch: InputBatch,
                 custom_logitsprocs: Optional[CustomLogitsProcessors],
                 spec_decode: Optional["SpecDecodeRunner"]) -> None:
        self.requests = requests
        """The runner's request states (the same dict)."""
        self.input_batch = input_batch
        self.custom_logitsprocs = custom_logitsprocs
        """User logits processors (vLLM's API), or None (vllm/sample/logits_processors/)."""
        self.spec_decode = spec_decode
        self.sampler = Sampler()
        self.custom_static_width: Optional[int] = None
        """Set by platforms with fixed shapes: the batch-row width custom processors
        always see (custom.py)."""
        self.failed_requests: dict[str, str] = {}
        """Requests failed this step (a custom processor raised) -> why."""

    # ------------------------------------------------------------ the step
    def start_step(self) -> None:
        """A new step: no request has failed yet."""
        self.failed_requests = {}

    def batch_updated(self) -> None:
        """After the runner brought the persistent batch in line with the step: the
        custom processors follow its added, removed and moved rows."""
        if self.custom_logitsprocs is not None:
            self._fail_rows(self.custom_logitsprocs.update_state(self.input_batch.num_reqs))

    # ---------------------------------------------------- logits processors
    def apply_logits_processors(self, logits: torch.Tensor, req_ids: list[Optional[str]],
                                so: SchedulerOutput) -> torch.Tensor:
        """Logits-processor hook, called once per pass on its sampling logits (row i:
        request req_ids[i], None for a row that does not sample), before the sampler
        or the argmax; on every rank.

        Applies the structured-output bitmask (`so.grammar_bitmask`): forbidden tokens
        of constrained rows become -inf; then the custom logits processors. Free when
        no request of the step is constrained and none is configured.
        """
        if so.grammar_bitmask is not None:
            self._apply_grammar_bitmask(logits, req_ids, so)
        if self.custom_logitsprocs is not None:
            logits = self._apply_custom_logitsprocs(logits, req_ids)
        return logits

    def _apply_custom_logitsprocs(self, logits: torch.Tensor,
                                  req_ids: list[Optional[str]]) -> torch.Tensor:
        """The custom processors on a pass's logits, laid out by batch row (custom.py);
        requests they fail are recorded in `failed_requests`."""
        index = self.input_batch.req_id_to_index
        rows = [None if r is None else index[r] for r in req_ids]
        logits, failures = self.custom_logitsprocs.apply(
            logits, rows, self.input_batch.num_reqs, self.custom_static_width)
        self._fail_rows(failures)
        return logits

    def _fail_rows(self, failures: list[Any]) -> None:
        """Record the requests of the failures' batch rows as failed this step."""
        req_ids = self.input_batch.req_ids
        for failure in failures:
            for row in failure.rows:
                if row < len(req_ids):
                    self.failed_requests.setdefault(req_ids[row], failure.message)

    def _apply_grammar_bitmask(self, logits: torch.Tensor, req_ids: list[Optional[str]],
                               so: SchedulerOutput) -> None:
        """Mask the constrained rows in place (platforms with fixed shapes override)."""
        apply_grammar_bitmask(logits, [r or "" for r in req_ids],
                              so.structured_output_request_ids, so.grammar_bitmask)

    # ------------------------------------------------------ prompt logprobs
    def prompt_logprobs(self, model: torch.nn.Module, fwd: "ForwardPass",
                        hidden: torch.Tensor, so: SchedulerOutput,
                        result: dict[str, PromptLogprobs]) -> None:
        """Logprobs of the prompt tokens this pass predicts, for requests asking for them.

        Every rank runs this (the logits computation may be a TP collective).
        """
        for req_id, offset in zip(fwd.req_ids, fwd.row_offsets):
            state = self.requests[req_id]
            if not state.wants_prompt_logprobs:
                continue
            rows, targets, done = prompt_logprob_rows(
                state, state.num_computed_tokens, so.num_scheduled_tokens[req_id], offset)
            if rows:
                result[req_id] = self._prompt_logprobs_rows(
                    model, fwd, hidden, rows, targets, state.sampling_params.prompt_logprobs)
                state.num_prompt_logprobs_sent = (state.num_computed_tokens + rows[-1]
                                                  - offset + 1)
            else:
                result[req_id] = ([], [], [])
            if done:
                state.wants_prompt_logprobs = False

    def _prompt_logprobs_rows(self, model: torch.nn.Module, fwd: "ForwardPass",
                              hidden: torch.Tensor, rows: list[int], targets: list[int],
                              num_logprobs: int) -> PromptLogprobs:
        """Logprobs of `targets` (and the top `num_logprobs`) at hidden rows `rows`."""
        logits = model.compute_logits(
            hidden.index_select(0, torch.tensor(rows, device=hidden.device)))
        t = compute_prompt_logprobs(logits, torch.tensor(targets, device=logits.device),
                                    num_logprobs)
        return t.tolists()

    # ------------------------------------------------------------- sampling
    def sample_passes(self, pending: list[PendingPass]) -> StepSamples:
        """Sample the step's passes (each: its logits after the processors): the
        sampling rows of every pass gathered and joined, one sampler call."""
        if not pending:
            return {}, {}
        parts, req_ids = [], []
        for fwd, out, logits in pending:
            parts.append(logits if out.sample_rows is None
                         else logits.index_select(0, out.sample_rows))
            req_ids.extend(fwd.sample_req_ids)
        return self._sample(parts[0] if len(parts) == 1 else torch.cat(parts), req_ids)

    def _sample(self, logits: torch.Tensor, req_ids: list[str]) -> StepSamples:
        """Sample one token per row of `logits` (row i: request req_ids[i]), append it
        to the request's state; return the tokens and the asked-for logprobs. With
        draft tokens in the step, verify them instead (`_sample_with_drafts`)."""
        lp_lists = None
        md = self.input_batch.sampling_metadata(req_ids, logits.shape[-1], logits.device)
        if self.spec_decode is not None and self.spec_decode.num_drafts:
            return self._sample_with_drafts(logits, req_ids, md)
        if md is None:  # every row takes the argmax of its raw logits
            token_ids = greedy_sample(logits).tolist()
        else:
            # One read-back of the tokens and logprobs: the step's only device wait.
            token_ids, lp_lists = self.sampler(logits, md).tolists()
        return self._record_samples(req_ids, token_ids, lp_lists)

    def _record_samples(self, req_ids: list[str], token_ids: list[int],
                        lp_lists: Optional[tuple[list, list, list]]) -> StepSamples:
        """Append token_ids[i] to request req_ids[i] (its state and the batch's penalty
        counts); its logprobs (row i of `lp_lists`, cut to the K it asked for) when it
        asked."""
        self.input_batch.record_output_tokens(req_ids, token_ids)
        sampled: dict[str, list[int]] = {}
        logprobs: dict[str, list[LogprobsRow]] = {}
        for i, req_id in enumerate(req_ids):
            state = self.requests[req_id]
            state.append_token(token_ids[i])
            sampled[req_id] = [token_ids[i]]
            k = state.sampling_params.logprobs
            if lp_lists is not None and k is not None:
                logprobs[req_id] = [(lp_lists[0][i][:k + 1], lp_lists[1][i][:k + 1],
                                     lp_lists[2][i])]
        return sampled, logprobs

    # ------------------------------------------------ speculative decoding
    def _sample_with_drafts(self, logits: torch.Tensor, req_ids: list[str],
                            md: Any) -> StepSamples:
        """Verify the step's drafts (vllm/spec_decode/rejection_sampler.py): each
        request's accepted drafts and one more token are appended to its state."""
        order, result = self.spec_decode.verify(self.sampler, logits, req_ids, md)
        return self._record_verified(order, result)

    def _record_verified(self, order: list[str], result: Any) -> StepSamples:
        """Append each request's verified tokens (`RejectionOutput`, requests in
        `order`) to its state and the penalty counts; its logprobs if it asked."""
        sampled: dict[str, list[int]] = {}
        logprobs: dict[str, list[LogprobsRow]] = {}
        for i, req_id in enumerate(order):
            tokens = result.output_token_ids[i]
            for token_id in tokens:
                self.requests[req_id].append_token(token_id)
            self.input_batch.record_output_tokens([req_id] * len(tokens), tokens)
            sampled[req_id] = tokens
            k = self.requests[req_id].sampling_params.logprobs
            if result.logprobs is not None and k is not None:
                logprobs[req_id] = [(ids[:k + 1], lps[:k + 1], rank)
                                    for ids, lps, rank in result.logprobs[i]]
        return sampled, logprobs


def prompt_logprob_rows(state: CachedRequestState, start: int, num_new: int,
                        offset: int) -> tuple[list[int], list[int], bool]:
    """(hidden rows, next-token targets, prompt finished) for the prompt logprobs of
    the new tokens start .. start + num_new - 1 placed at rows offset...

    Position p predicts the prompt token at p + 1; positions whose logprobs were
    already sent (before a preemption) are skipped.
    """
    num_prompt = len(state.prompt_token_ids)
    first = max(start, state.num_prompt_logprobs_sent)
    end = min(start + num_new, num_prompt - 1)
    rows = list(range(offset + first - start, offset + max(first, end) - start))
    targets = state.prompt_token_ids[first + 1:end + 1]
    return rows, targets, start + num_new >= num_prompt
