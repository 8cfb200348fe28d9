"""Seed-OSS: reasoning in `<seed:think>` ... `</seed:think>`; text before the end tag is
reasoning even without the start tag (DeepSeek-R1's reading)."""
from __future__ import annotations

from vllm.reasoning.abs_reasoning_parser import ReasoningParser


class SeedOSSReasoningParser(ReasoningParser):
    start_token = "<seed:think>"
    end_token = "</seed:think>"
    unterminated_is_reasoning = True
