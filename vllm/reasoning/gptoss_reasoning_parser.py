"""GPT-OSS (`openai_gptoss`): the harmony format's `analysis` channel is the reasoning.

The output is harmony messages (vllm/reasoning/harmony.py); the special tokens must
stay in the text, so the parser turns `skip_special_tokens` off for its requests.
Split: every `analysis` message's content is reasoning (several joined by a newline);
the answer is the `final` message's content and `commentary` preambles (messages to
no one) as plain text, with tool calls (`to=functions.NAME`) left in a normal harmony
form for the `openai` tool parser. Text without harmony structure is all answer.

Token side (structured outputs apply after the reasoning; `thinking_token_budget`
forces its end): the reasoning is over once `<|channel|>final<|message|>` opened the
answer, and not when that sequence belongs to an earlier turn of the prompt (a
terminator or a new `<|start|>` follows it).
"""
from __future__ import annotations

from typing import Any, Sequence

from vllm.reasoning.abs_reasoning_parser import ReasoningParser, _rfind
from vllm.reasoning.harmony import (CALL, CHANNEL, END, MESSAGE, RETURN, START,
                                    HarmonyMessage, held_suffix, is_harmony, parse_harmony)


class GptOssReasoningParser(ReasoningParser):
    start_token = f"{CHANNEL}analysis{MESSAGE}"
    end_token = f"{END}{START}assistant{CHANNEL}final{MESSAGE}"
    unterminated_is_reasoning = False

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.answer_open_ids = self._ids(f"{CHANNEL}final{MESSAGE}")
        self.closing_ids = {i for t in (END, CALL, RETURN, START) for i in self._ids(t)}

    def adjust_request(self, request: Any) -> Any:
        """Harmony's structure is special tokens: keep them in the text."""
        request.skip_special_tokens = False
        return request

    # ------------------------------------------------------------ token side
    def reasoning_ended_in(self, token_ids: Sequence[int]) -> bool:
        opened = _rfind(token_ids, self.answer_open_ids)
        if opened < 0:
            return False
        return not any(t in self.closing_ids for t in token_ids[opened + len(
            self.answer_open_ids):])

    def ended_after(self, token_ids: Sequence[int]) -> bool:
        n = len(self.answer_open_ids)
        return len(token_ids) >= n and list(token_ids[-n:]) == self.answer_open_ids

    # ------------------------------------------------------------- text side
    def split(self, text: str, final: bool) -> tuple[str, str]:
        if not is_harmony(text):
            return "", text if final else text[:len(text) - held_suffix(text)]
        reasoning: list[str] = []
        answer: list[str] = []
        for seg in parse_harmony(text, final):
            if not isinstance(seg, HarmonyMessage):
                answer.append(seg)
            elif seg.channel == "analysis" and seg.recipient is None:
                reasoning.append(seg.content)
            elif seg.recipient is not None:
                answer.append(seg.render_call())
            else:
                answer.append(seg.content)
        return "\n".join(reasoning), "".join(answer)

