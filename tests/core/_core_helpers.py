"""Synthetic requests and configs for the core unit tests: no model, no tokenizer."""
from __future__ import annotations

from types import SimpleNamespace

from vllm.config import StructuredOutputsConfig
from vllm.core.sched_output import ModelRunnerOutput, SchedulerOutput
from vllm.core.scheduler import Scheduler
from vllm.request import Request
from vllm.sampling_params import SamplingParams


def make_config(block_size: int = 4, max_num_seqs: int = 8, max_num_batched_tokens: int = 64,
                max_model_len: int = 256, enable_chunked_prefill: bool = True,
                enable_prefix_caching: bool = True, policy: str = "fcfs") -> SimpleNamespace:
    """The fields of VllmConfig the scheduler and engine core read."""
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs,
                                         max_num_batched_tokens=max_num_batched_tokens,
                                         enable_chunked_prefill=enable_chunked_prefill,
                                         async_scheduling=False, policy=policy),
        model_config=SimpleNamespace(max_model_len=max_model_len, vocab_size=1000),
        cache_config=SimpleNamespace(block_size=block_size,
                                     enable_prefix_caching=enable_prefix_caching,
                                     num_gpu_blocks=None),
        device_config=SimpleNamespace(device="cpu"), lora_config=None,
        structured_outputs_config=StructuredOutputsConfig())


def make_scheduler(num_blocks: int = 64, **config) -> Scheduler:
    return Scheduler(make_config(**config), num_blocks)


def make_request(req_id: str, prompt_len: int = 8, max_tokens: int = 16, first_token: int = 100,
                 **params) -> Request:
    return Request(request_id=req_id,
                   prompt_token_ids=list(range(first_token, first_token + prompt_len)),
                   sampling_params=SamplingParams(max_tokens=max_tokens, **params),
                   eos_token_id=None, max_tokens=max_tokens)


def fake_runner_output(so: SchedulerOutput, scheduler: Scheduler,
                       token_id: int = 7) -> ModelRunnerOutput:
    """What a runner returns: one token for each request whose new tokens reach the end
    of its known tokens, nothing for a prefill chunk."""
    req_ids = list(so.num_scheduled_tokens)
    sampled = []
    for req_id in req_ids:
        request = scheduler.requests[req_id]
        done = request.num_computed_tokens + so.num_scheduled_tokens[req_id]
        sampled.append([token_id] if done >= request.num_tokens else [])
    return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled)


def step(scheduler: Scheduler, token_id: int = 7) -> SchedulerOutput:
    """One schedule + update round with a fake runner; returns the SchedulerOutput."""
    so = scheduler.schedule()
    if not so.is_empty:
        scheduler.update_from_output(so, fake_runner_output(so, scheduler, token_id))
    return so
