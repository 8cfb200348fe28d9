"""DeepSeek-R1: the chat template opens `<think>`, so the output starts inside the
reasoning; everything before `</think>` is reasoning, even when it never ends."""
from __future__ import annotations

from vllm.reasoning.abs_reasoning_parser import ReasoningParser


class DeepSeekR1ReasoningParser(ReasoningParser):
    unterminated_is_reasoning = True
