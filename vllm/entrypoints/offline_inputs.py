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
                   num_prompts: int) -> Optional[list[int]]:
    """vLLM's `priority`: one per prompt (an int: the same for all); None when not
    given. Values other than 0 need --scheduling-policy priority (the engine refuses
    them otherwise, as vLLM)."""
    if priority is None:
        return None
    if isinstance(priority, int):
        return [priority] * num_prompts
    values = list(priority)
    if len(values) != num_prompts:
        raise ValueError(f"The lengths of prompts ({num_prompts}) and priority "
                         f"({len(values)}) must be the same.")
    return values


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
