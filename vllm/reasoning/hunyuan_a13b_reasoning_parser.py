"""Hunyuan-A13B: `<think>\n...\n</think>\n<answer>\n...\n</answer>`; the reasoning is the
think part and the answer the inside of `<answer>` (tags and their newlines taken off)."""
from __future__ import annotations

from vllm.reasoning.abs_reasoning_parser import ReasoningParser


class HunyuanA13BReasoningParser(ReasoningParser):
    unterminated_is_reasoning = False
    answer_tags = ("<answer>", "</answer>")

    def split(self, text: str, final: bool) -> tuple[str, str]:
        reasoning, content = super().split(text, final)
        return reasoning.strip("\n") if final else reasoning.lstrip("\n"), content
