"""Mistral (Magistral): reasoning between the `[THINK]` and `[/THINK]` special tokens,
written by the model; an output that does not open `[THINK]` is all answer."""
from __future__ import annotations

from vllm.reasoning.abs_reasoning_parser import ReasoningParser


class MistralReasoningParser(ReasoningParser):
    start_token = "[THINK]"
    end_token = "[/THINK]"
    unterminated_is_reasoning = False
