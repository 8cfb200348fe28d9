"""Kimi-K2 (Thinking): `<think>...</think>` written by the model; a tool-call section that
starts before `</think>` also ends the reasoning (and stays in the answer for the
`kimi_k2` tool parser). Without `<think>` the output is all answer."""
from __future__ import annotations

from vllm.reasoning.abs_reasoning_parser import ReasoningParser


class KimiK2ReasoningParser(ReasoningParser):
    unterminated_is_reasoning = False
    implicit_ends = ("<|tool_calls_section_begin|>",)
