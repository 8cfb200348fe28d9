"""The pooling step of a model runner (`--runner pooling`): hidden states -> one vector
per prompt, no sampling.

Every platform lays the step out as usual (`_prepare_inputs`: flat rows on CPU/GPU,
bucketed padded batches on HPU) and runs the model (`_execute_pass`); nobody samples,
so no logits are computed. Each pooling request's prompt is whole in one pass (the
pooling config disables chunked prefill and prefix caching, vllm/config.py), so its
rows `row_offsets[i] .. + num_tokens[i]` are its whole prompt; the model's `pooler`
(model_executor/layers/pooler.py) reduces them, and the driver rank returns the vectors
in `ModelRunnerOutput.pooler_output`, after which the scheduler finishes the requests.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from vllm.core.sched_output import ModelRunnerOutput, SchedulerOutput
from vllm.model_executor.layers.pooler import TOKEN_TYPE_SHIFT, finish_pooled

if TYPE_CHECKING:
    from vllm.worker.model_runner_base import ForwardPass, ModelRunnerBase


def execute_pooling(runner: "ModelRunnerBase", so: SchedulerOutput
                    ) -> Optional[ModelRunnerOutput]:
    """One pooling step (see the module docstring); None on non-driver ranks."""
    pooled: dict[str, torch.Tensor] = {}
    for fwd in runner._prepare_inputs(so):
        fwd.sample_req_ids = []  # no logits: the pooler reads the hidden states
        mark_token_types(runner, fwd)
        fwd.lora_mapping = runner.prepare_lora_mapping(fwd)
        fwd.inputs_embeds = runner.gather_mm_embeddings(fwd)
        try:
            out = runner._execute_pass(fwd)
        finally:
            if fwd.lora_mapping is not None:
                runner.lora_manager.clear_mapping()
        if out is not None:
            pooled.update(pool_pass(runner, fwd, out.hidden_states))
    if not runner.is_driver:
        return None
    req_ids = list(so.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=[[] for _ in req_ids],
                             pooler_output=pooled)


def mark_token_types(runner: "ModelRunnerBase", fwd: "ForwardPass") -> None:
    """Second-segment tokens of cross-encoder pairs -> `id | 1 << TOKEN_TYPE_SHIFT`
    (the pair's split point is in its PoolingParams, from the score frontend)."""
    flat = fwd.input_ids.view(-1)
    for i, req_id in enumerate(fwd.req_ids):
        start = runner.requests[req_id].pooling_params.compressed_token_type_ids()
        if start is not None and start < fwd.num_tokens[i]:
            rows = slice(fwd.row_offsets[i] + start, fwd.row_offsets[i] + fwd.num_tokens[i])
            flat[rows] |= 1 << TOKEN_TYPE_SHIFT


def pool_pass(runner: "ModelRunnerBase", fwd: "ForwardPass", hidden: torch.Tensor
              ) -> dict[str, torch.Tensor]:
    """The vectors of the pass's requests whose prompt it completes (all of them, as
    prompts are not chunked), as small CPU tensors (cheap to send between processes)."""
    picked = []
    for i, req_id in enumerate(fwd.req_ids):
        state = runner.requests[req_id]
        if state.pooling_params is None:
            raise ValueError(f"request {req_id!r} has no pooling_params: a pooling model "
                             "serves only pooling requests.")
        if state.num_computed_tokens + fwd.num_tokens[i] >= len(state.prompt_token_ids):
            picked.append(i)
    if not picked:
        return {}
    rows = runner.pooled_rows(fwd, hidden, picked).to("cpu")
    pooler = runner.model.pooler
    return {fwd.req_ids[i]: finish_pooled(rows[j], pooler.task,
                                          runner.requests[fwd.req_ids[i]].pooling_params).clone()
            for j, i in enumerate(picked)}
