"""What the offline API (LLM.generate / chat / enqueue) checks and sets on its way to
the engine, shared by llm.py and offline_queue.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

from vllm.sampling_params import RequestOutputKind, SamplingParams


@dataclass(frozen=True)
class ChatOptions:
    """LLM.chat's rendering arguments, passed once for every conversation."""
    chat_template: Optional[str]
    content_format: str
    add_generation_prompt: bool
    continue_final_message: bool
    tools: Optional[list[dict[str, Any]]]
    chat_template_kwargs: dict[str, Any]
    tokenization_kwargs: Optional[dict[str, Any]]


def check_priority(priority: Optional[Union[int, Sequence[int]]],
                   num_prompts: Optional[int] = None) -> None:
    """vLLM's `priority` (one per prompt): only 0 here, as this engine schedules first
    come, first served (vLLM too refuses other values without --scheduling-policy
    priority)."""
    if priority is None:
        return
    values = [priority] if isinstance(priority, int) else list(priority)
    if num_prompts is not None and not isinstance(priority, int) and len(values) != num_prompts:
        raise ValueError(f"The lengths of prompts ({num_prompts}) and priority "
                         f"({len(values)}) must be the same.")
    if any(p != 0 for p in values):
        raise ValueError("priority: only 0 is supported (FCFS scheduling).")


def cumulative(params: Any) -> Any:
    """The params with RequestOutputKind.CUMULATIVE (a copy when they said otherwise:
    the caller's object is left as it was). The offline calls return each request's
    final output, complete, whatever kind the params name (vLLM forces FINAL_ONLY);
    cumulative outputs on the way let the offline metrics see every token's time."""
    if not isinstance(params, SamplingParams) or params.output_kind is RequestOutputKind.CUMULATIVE:
        return params
    params = params.clone()
    params.output_kind = RequestOutputKind.CUMULATIVE
    return params
