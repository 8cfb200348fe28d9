"""ERNIE-4.5 (thinking): `<think>...</think>` (the start tag may be in the prompt), then the
answer, which the model may wrap in `<response>` ... `</response>` (taken off)."""
from __future__ import annotations

from vllm.reasoning.abs_reasoning_parser import ReasoningParser


class Ernie45ReasoningParser(ReasoningParser):
    unterminated_is_reasoning = True
    answer_tags = ("<response>", "</response>")
