"""OLMo-3 (Think): `<think>...</think>`; the template may open `<think>` in the prompt, so
text before `</think>` is reasoning with or without the start tag."""
from __future__ import annotations

from vllm.reasoning.abs_reasoning_parser import ReasoningParser


class Olmo3ReasoningParser(ReasoningParser):
    unterminated_is_reasoning = True
