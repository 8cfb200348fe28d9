"""The harmony response format (GPT-OSS), read from text with its special tokens kept.

A harmony message is `<|start|>ROLE[ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT]
[ <|constrain|>TYPE | TYPE]<|message|>CONTENT` closed by `<|end|>`, `<|call|>` (a tool
call: generation stops there) or `<|return|>` (the final answer: generation stops).
The prompt ends with `<|start|>assistant`, so the output's first message has no
`<|start|>`. Channels: `analysis` (the chain of thought), `commentary` (tool calls,
addressed `to=functions.NAME`, and user-visible preambles) and `final` (the answer).

`parse_harmony` cuts text into messages and the loose text between them (what a
reasoning parser leaves of an output: the answer), as far as it is known while
streaming: a header is taken only once its `<|message|>` arrived, and a tail that may be
the start of a special token is held back unless `final`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Union

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, RETURN, CALL = "<|constrain|>", "<|return|>", "<|call|>"
TERMINATORS = (END, CALL, RETURN)
HEADER_STARTS = (START, CHANNEL)
SPECIAL_TOKENS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)

_RECIPIENT = re.compile(r"\bto=(\S+?)(?=\s|<\||$)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_][\w.-]*)")


@dataclass
class HarmonyMessage:
    role: str
    channel: str
    recipient: Optional[str]
    content_type: Optional[str]
    content: str
    closed: bool
    """Its terminator arrived (or the text is final)."""

    @property
    def tool_name(self) -> Optional[str]:
        """The function a `to=functions.NAME` message calls."""
        if self.recipient and self.recipient.startswith("functions."):
            return self.recipient[len("functions."):]
        return None

    def render_call(self) -> str:
        """This tool call in one normal form (what the `openai` tool parser reads after a
        reasoning parser took the analysis out): header, content, and `<|call|>` once
        closed."""
        ctype = f" {CONSTRAIN}{self.content_type}" if self.content_type else ""
        return (f"{CHANNEL}{self.channel} to={self.recipient}{ctype}{MESSAGE}{self.content}"
                + (CALL if self.closed else ""))


Segment = Union[str, HarmonyMessage]


def held_suffix(text: str) -> int:
    """Length of the tail of `text` that may be the start of a special token."""
    for n in range(min(len(text), max(len(t) for t in SPECIAL_TOKENS) - 1), 0, -1):
        tail = text[-n:]
        if any(t.startswith(tail) for t in SPECIAL_TOKENS):
            return n
    return 0


def _parse_header(header: str) -> tuple[str, str, Optional[str], Optional[str]]:
    """(role, channel, recipient, content type) of the text between a message's start
    and its `<|message|>`."""
    if header.startswith(START):
        header = header[len(START):]
    role = re.split(r"\s|<\|", header, maxsplit=1)[0] if not header.startswith(CHANNEL) else ""
    match = _CHANNEL.search(header)
    channel = match.group(1) if match else ""
    recipient = _RECIPIENT.search(header)
    ctype = None
    if CONSTRAIN in header:
        words = header.split(CONSTRAIN, 1)[1].split()
        ctype = words[0] if words else None
    elif match:
        rest = _RECIPIENT.sub("", header[match.end():]).split()
        ctype = rest[0] if rest else None
    return role, channel, recipient.group(1) if recipient else None, ctype


def _next_header(text: str, at: int) -> int:
    found = [i for i in (text.find(h, at) for h in HEADER_STARTS) if i >= 0]
    return min(found) if found else -1


def parse_harmony(text: str, final: bool) -> list[Segment]:
    """Loose text and messages of `text`, in order (see the module docstring)."""
    segments: list[Segment] = []
    at = 0
    while at < len(text):
        head = _next_header(text, at)
        if head < 0:
            loose = text[at:]
            if not final:
                loose = loose[:len(loose) - held_suffix(loose)]
            if loose:
                segments.append(loose)
            break
        if head > at:
            segments.append(text[at:head])
        body = text.find(MESSAGE, head)
        if body < 0:
            if final:  # a header that never got its message: leave it as text
                segments.append(text[head:])
            break
        role, channel, recipient, ctype = _parse_header(text[head:body])
        start = body + len(MESSAGE)
        ends = [(i, t) for i, t in ((text.find(t, start), t) for t in TERMINATORS) if i >= 0]
        nxt = _next_header(text, start)
        if ends and (nxt < 0 or min(ends)[0] <= nxt):
            end, token = min(ends)
            segments.append(HarmonyMessage(role, channel, recipient, ctype, text[start:end],
                                           True))
            at = end + len(token)
            continue
        if nxt >= 0:  # the next message began without this one's terminator
            segments.append(HarmonyMessage(role, channel, recipient, ctype, text[start:nxt],
                                           True))
            at = nxt
            continue
        content = text[start:]
        if not final:
            content = content[:len(content) - held_suffix(content)]
        segments.append(HarmonyMessage(role, channel, recipient, ctype, content, final))
        break
    return segments


def is_harmony(text: str) -> bool:
    return any(h in text for h in HEADER_STARTS)
