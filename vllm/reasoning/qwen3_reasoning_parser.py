"""Qwen3: the model writes `<think>...</think>` itself when thinking is on; an output
without `</think>` (thinking off, or no reasoning) is all answer."""
from __future__ import annotations

from vllm.reasoning.abs_reasoning_parser import ReasoningParser


class Qwen3ReasoningParser(ReasoningParser):
    unterminated_is_reasoning = False
