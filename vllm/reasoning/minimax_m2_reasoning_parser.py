"""MiniMax-M2: the template opens `<think>`, so the output starts inside the reasoning and
everything before `</think>` is reasoning (DeepSeek-R1's reading)."""
from __future__ import annotations

from vllm.reasoning.abs_reasoning_parser import ReasoningParser


class MiniMaxM2ReasoningParser(ReasoningParser):
    unterminated_is_reasoning = True
