"""GLM-4.5 / 4.6 (`glm45`): `<think>...</think>` written by the model; an output without
`<think>` (thinking off) is all answer."""
from __future__ import annotations

from vllm.reasoning.abs_reasoning_parser import ReasoningParser


class Glm4MoeModelReasoningParser(ReasoningParser):
    unterminated_is_reasoning = False
