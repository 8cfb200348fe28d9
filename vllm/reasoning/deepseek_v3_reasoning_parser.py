"""DeepSeek-V3.1 / V3.2 (`deepseek_v3`): a hybrid model. With the template's `thinking`
switch on, the prompt opens `<think>` and the output reads as DeepSeek-R1's; off (the
default, as vLLM), the output is all answer."""
from __future__ import annotations

from typing import Any, Optional

from vllm.reasoning.abs_reasoning_parser import ReasoningParser
from vllm.reasoning.deepseek_r1_reasoning_parser import DeepSeekR1ReasoningParser


class DeepSeekV3ReasoningParser(DeepSeekR1ReasoningParser):

    def for_request(self, request: Any) -> Optional[ReasoningParser]:
        kwargs = getattr(request, "chat_template_kwargs", None) or {}
        return self if (kwargs.get("thinking") or kwargs.get("enable_thinking")) else None
