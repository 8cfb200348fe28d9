"""Granite 3.2+ (`granite`): plain-text markers, "Here is my thought process:" then
"Here is my response:" (also written "Here's ..."); without them the output is answer."""
from __future__ import annotations

from vllm.reasoning.abs_reasoning_parser import ReasoningParser

PAIRS = (("Here is my thought process:", "Here is my response:"),
         ("Here's my thought process:", "Here's my response:"))


class GraniteReasoningParser(ReasoningParser):
    start_token, end_token = PAIRS[0]
    unterminated_is_reasoning = False

    def split(self, text: str, final: bool) -> tuple[str, str]:
        head = text.lstrip()
        for start, end in PAIRS:
            if head.startswith(start):
                reasoning, content = self._split_with(text, final, start, end)
                return reasoning.strip() if final else reasoning.lstrip(), content.lstrip()
        if not final and any(start.startswith(head) for start, _ in PAIRS):
            return "", ""
        return "", text
