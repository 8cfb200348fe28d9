"""Step-3: the model writes only `</think>`; everything before it is reasoning."""
from __future__ import annotations

from vllm.reasoning.abs_reasoning_parser import ReasoningParser


class Step3ReasoningParser(ReasoningParser):
    unterminated_is_reasoning = True
