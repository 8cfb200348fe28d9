"""What every `<think>`-style reasoning parser shares: text split, streaming, end check."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence


def partial_suffix_len(text: str, marker: str) -> int:
    """Length of the longest proper prefix of `marker` that `text` ends with.

    A stream must hold such a tail back: the next delta may complete the marker.
    """
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class ReasoningParser:
    """Reasoning delimited by `start_token` ... `end_token` at the start of the output.

    Subclasses say what an output without an end marker means (`unterminated_is_reasoning`)
    and whether the prompt itself opens the reasoning part.
    """

    start_token = "<think>"
    end_token = "</think>"
    unterminated_is_reasoning = True
    """Text with no end marker is all reasoning (True) or all answer (False)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.start_token_ids = self._ids(self.start_token)
        self.end_token_ids = self._ids(self.end_token)

    def _ids(self, marker: str) -> list[int]:
        """The marker's token ids: its own id when it is one vocabulary entry."""
        vocab = self.tokenizer.get_vocab() if hasattr(self.tokenizer, "get_vocab") else {}
        if marker in vocab:
            return [vocab[marker]]
        return list(self.tokenizer.encode(marker, add_special_tokens=False))

    # ------------------------------------------------------------ token side
    def reasoning_ended_in(self, token_ids: Sequence[int]) -> bool:
        """Whether reasoning is over after `token_ids`: the last marker closes it.

        Used on the prompt (a template may open `<think>` or already close it) and then,
        token by token, by `ended_after` on the output.
        """
        last_end = _rfind(token_ids, self.end_token_ids)
        last_start = _rfind(token_ids, self.start_token_ids)
        if last_end < 0 and last_start < 0:
            # No marker at all: the output opens with reasoning only for parsers whose
            # template opens it in the prompt (DeepSeek-R1 style).
            return not self.unterminated_is_reasoning
        return last_end > last_start

    def ended_after(self, token_ids: Sequence[int]) -> bool:
        """Whether `token_ids` (the output so far) ends with the end marker."""
        n = len(self.end_token_ids)
        return n > 0 and len(token_ids) >= n and list(token_ids[-n:]) == self.end_token_ids

    # ------------------------------------------------------------- text side
    def extract_reasoning(self, model_output: str) -> tuple[Optional[str], Optional[str]]:
        """(reasoning, content) of a finished output; None for a part that is absent."""
        reasoning, content = self.split(model_output, final=True)
        return reasoning or None, content or None

    implicit_ends: tuple[str, ...] = ()
    """Text that ends the reasoning without an end marker and starts the answer (Kimi-K2's
    tool-call section); it stays in the answer."""
    answer_tags: Optional[tuple[str, str]] = None
    """Tags some models wrap the answer in (`<answer>` ... `</answer>`), taken off."""

    def adjust_request(self, request: Any) -> Any:
        """The request as this parser needs it generated (harmony keeps the special
        tokens in the text); most parsers take it as it is."""
        return request

    def for_request(self, request: Any) -> Optional["ReasoningParser"]:
        """The parser for one request: None where the request turns reasoning off (a
        hybrid model's template switch); most parsers serve every request as they are."""
        return self

    def split(self, text: str, final: bool) -> tuple[str, str]:
        """(reasoning, content) of `text`; unless `final`, a tail that may still grow into
        a marker is withheld so both parts only ever grow as text is appended."""
        reasoning, content = self._split_with(text, final, self.start_token, self.end_token)
        return reasoning, self._unwrap(content, final)

    def _split_with(self, text: str, final: bool, start: str, end_token: str
                    ) -> tuple[str, str]:
        head = text.lstrip()
        opened = bool(start) and head.startswith(start)
        if opened:
            body = head[len(start):]
        elif not final and start and start.startswith(head):
            return "", ""  # nothing yet, or the start marker is still arriving
        else:
            body = text
        end = body.find(end_token)
        implicit = [i for i in (body.find(m) for m in self.implicit_ends) if i >= 0]
        if implicit and (end < 0 or min(implicit) < end):
            return body[:min(implicit)], body[min(implicit):]
        if end >= 0:
            return body[:end], body[end + len(end_token):]
        if not final:
            held = max(partial_suffix_len(body, m) for m in (end_token, *self.implicit_ends))
            body = body[:len(body) - held]
        if opened or self.unterminated_is_reasoning:
            return body, ""
        return "", body

    def _unwrap(self, content: str, final: bool) -> str:
        """The answer without `answer_tags` (a prefix of the final one while streaming)."""
        if self.answer_tags is None or not content:
            return content
        open_tag, close_tag = self.answer_tags
        head = content.lstrip()
        if head.startswith(open_tag):
            content = head[len(open_tag):].lstrip("\n")
        elif not final and open_tag.startswith(head):
            return ""
        at = content.find(close_tag)
        if at >= 0:
            return content[:at].rstrip("\n")
        if not final:
            content = content[:len(content) - partial_suffix_len(content, close_tag)]
            return content.rstrip("\n")  # a newline before the close tag is layout
        return content


@dataclass
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""


class ReasoningStreamer:
    """Per-choice streaming state: turns growing text into reasoning / content deltas."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.text = ""
        self.sent_reasoning = 0
        self.sent_content = 0

    def feed(self, delta_text: str, final: bool = False) -> ReasoningDelta:
        self.text += delta_text
        reasoning, content = self.parser.split(self.text, final)
        out = ReasoningDelta(reasoning[self.sent_reasoning:], content[self.sent_content:])
        self.sent_reasoning = max(self.sent_reasoning, len(reasoning))
        self.sent_content = max(self.sent_content, len(content))
        return out

    @property
    def reasoning_ended(self) -> bool:
        return self.parser.end_token in self.text


def _rfind(seq: Sequence[int], pattern: list[int]) -> int:
    n = len(pattern)
    if n == 0:
        return -1
    for i in range(len(seq) - n, -1, -1):
        if list(seq[i:i + n]) == pattern:
            return i
    return -1
