"""What every tool-call parser shares: the result types and the streaming algorithm.

A parser only says how its model writes calls: where the tool-call part of the text
starts (`split`) and how to read the calls in it (`parse_calls`), also from a prefix
of the text while it streams. `ToolCallStreamer` turns the growing text into OpenAI's
deltas: content first, then per call one delta with id, type and name, then argument
fragments whose concatenation is the arguments' JSON text.
"""
from __future__ import annotations

import json
import logging
import string
import random
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from vllm.entrypoints.openai.protocol import (DeltaFunctionCall, DeltaToolCall, FunctionCall,
                                              ToolCall, random_uuid)

logger = logging.getLogger(__name__)


@dataclass
class PartialCall:
    """One call as far as it is known: the name once complete, the arguments so far."""
    name: Optional[str]
    arguments: Any = None
    """The parsed arguments (a dict, possibly partial while streaming)."""
    complete: bool = False
    arguments_text: Optional[str] = None
    """The arguments' JSON text as the model wrote it, when the parser has it verbatim."""
    call_id: Optional[str] = None
    """The call's id when the model writes one (Kimi-K2's `functions.NAME:0`)."""

    def arguments_json(self) -> str:
        if self.arguments_text is not None:
            return self.arguments_text
        return json.dumps(self.arguments if self.arguments is not None else {},
                          ensure_ascii=False)


@dataclass
class ExtractedToolCallInformation:
    tools_called: bool
    tool_calls: list[ToolCall] = field(default_factory=list)
    content: Optional[str] = None


class ToolParser:
    """Base of the per-model parsers (one file each); subclasses set `start_marker` or
    override `split`, and implement `parse_calls`."""

    start_marker: str = ""
    """Text that opens the tool-call part."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        # The state vLLM's parsers keep, for plugins written against vLLM's base class.
        self.model_tokenizer = tokenizer
        self.prev_tool_call_arr: list[dict[str, Any]] = []
        self.current_tool_id = -1
        self.current_tool_name_sent = False
        self.streamed_args_for_tool: list[str] = []

    @property
    def vocab(self) -> dict[str, int]:
        return self.tokenizer.get_vocab()

    def extract_tool_calls_streaming(self, previous_text: str, current_text: str,
                                     delta_text: str, previous_token_ids: Any,
                                     current_token_ids: Any, delta_token_ids: Any,
                                     request: Any) -> Any:
        """vLLM's streaming hook (a DeltaMessage or None). Built-in parsers stream through
        `split`/`parse_calls` instead; a plugin that overrides this is called with it."""
        raise NotImplementedError

    def adjust_request(self, request: Any) -> Any:
        """Markers such as [TOOL_CALLS] are special tokens: keep them in the text."""
        request.skip_special_tokens = False
        return request

    def strict_structure(self, name: str) -> Optional[tuple[str, str, str]]:
        """(trigger, begin, end) around one call's arguments JSON, for holding `strict`
        tools to their schemas under tool_choice "auto" (a structural tag: free text,
        and after the trigger one of the calls); None where the format has no such
        fixed frame (strict is then not enforced with "auto")."""
        return None

    def strict_format(self, tools: Sequence[tuple[str, dict]]) -> Optional[dict]:
        """For formats without one fixed frame per call (`strict_structure` None): an
        xgrammar structural-tag format (structural_tags.py) holding calls of `tools`
        (name, arguments schema) to their schemas, text free around them; None where the
        format cannot be expressed (strict is then not enforced with "auto")."""
        return None

    def make_tool_call_id(self) -> str:
        return f"chatcmpl-tool-{random_uuid()}"

    # -------------------------------------------------------- model format
    def split(self, text: str, final: bool) -> tuple[str, Optional[str]]:
        """(content, tool-call text or None). Unless `final`, a tail of the content that
        may be the start of the marker is withheld."""
        at = text.find(self.start_marker)
        if at >= 0:
            return text[:at], text[at + len(self.start_marker):]
        if final:
            return text, None
        return text[:len(text) - _partial_suffix_len(text, self.start_marker)], None

    def parse_calls(self, tool_text: str, final: bool) -> list[PartialCall]:
        """The calls in the tool-call text; raise ValueError when final text is not
        valid (the whole output is then returned as content)."""
        raise NotImplementedError

    # -------------------------------------------------------------- result
    def extract_tool_calls(self, model_output: str, request: Any = None
                           ) -> ExtractedToolCallInformation:
        """Calls and remaining content of a finished output."""
        content, tool_text = self.split(model_output, final=True)
        if tool_text is None:
            return ExtractedToolCallInformation(False, content=model_output)
        try:
            calls = [c for c in self.parse_calls(tool_text, final=True) if c.name]
        except (ValueError, TypeError, SyntaxError) as e:
            logger.debug("Tool call text did not parse (%s); returning it as content.", e)
            return ExtractedToolCallInformation(False, content=model_output)
        if not calls:
            return ExtractedToolCallInformation(False, content=model_output)
        calls = _limit(calls, request)
        return ExtractedToolCallInformation(
            True, [ToolCall(id=c.call_id or self.make_tool_call_id(),
                            function=FunctionCall(name=c.name, arguments=c.arguments_json()))
                   for c in calls], content=content if content.strip() else None)


def _limit(calls: list[PartialCall], request: Any) -> list[PartialCall]:
    """parallel_tool_calls=false keeps only the first call."""
    if request is not None and getattr(request, "parallel_tool_calls", True) is False:
        return calls[:1]
    return calls


def _partial_suffix_len(text: str, marker: str) -> int:
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def stable_prefix(arguments_json: str) -> str:
    """The part of partial arguments' JSON that later text cannot change: closing quotes
    and brackets added by the partial parse are cut off."""
    return arguments_json.rstrip('"]} ')


@dataclass
class _CallState:
    id: str
    sent_args: str = ""


class ToolCallStreamer:
    """One choice's streaming state: feed content text, get (content delta, tool deltas)."""

    def __init__(self, parser: ToolParser, request: Any = None) -> None:
        self.parser = parser
        self.request = request
        self.text = ""
        self.sent_content = 0
        self.calls: list[_CallState] = []

    @property
    def tools_called(self) -> bool:
        return bool(self.calls)

    def feed(self, delta_text: str, final: bool = False
             ) -> tuple[str, list[DeltaToolCall]]:
        if _overrides_streaming(self.parser):
            return self._feed_vllm_style(delta_text)
        self.text += delta_text
        content, tool_text = self.parser.split(self.text, final)
        content_delta = content[self.sent_content:]
        self.sent_content = max(self.sent_content, len(content))
        if tool_text is None:
            return content_delta, []
        try:
            calls = self.parser.parse_calls(tool_text, final)
        except (ValueError, TypeError, SyntaxError):
            if not final:
                return content_delta, []
            logger.warning("Streamed tool call text did not parse at the end: %r", tool_text)
            calls = []
        calls = _limit([c for c in calls if c.name], self.request)
        if final and not calls and not self.calls:
            # No call after all (malformed, or an empty block): the withheld tool text is
            # content, as in the non-streamed answer.
            content_delta += self.text[self.sent_content:]
            self.sent_content = len(self.text)
            return content_delta, []
        return content_delta, self._tool_deltas(calls, final)

    def _feed_vllm_style(self, delta_text: str) -> tuple[str, list[DeltaToolCall]]:
        """A plugin parser written against vLLM's streaming hook: it gets the texts
        (token ids are not tracked here: empty lists)."""
        previous, self.text = self.text, self.text + delta_text
        msg = self.parser.extract_tool_calls_streaming(previous, self.text, delta_text,
                                                       [], [], [], self.request)
        if msg is None:
            return "", []
        deltas = list(getattr(msg, "tool_calls", None) or [])
        for d in deltas:
            while len(self.calls) <= d.index:
                self.calls.append(_CallState(d.id or self.parser.make_tool_call_id()))
        return getattr(msg, "content", None) or "", deltas

    def _tool_deltas(self, calls: list[PartialCall], final: bool) -> list[DeltaToolCall]:
        """At most one entry per call index (clients read a chunk's entry for an index
        as that call's news): a new call's header carries its first arguments."""
        deltas = []
        for i, call in enumerate(calls):
            header = None
            if i == len(self.calls):
                self.calls.append(_CallState(call.call_id or self.parser.make_tool_call_id()))
                header = DeltaToolCall(index=i, id=self.calls[i].id, type="function",
                                       function=DeltaFunctionCall(name=call.name,
                                                                  arguments=""))
                deltas.append(header)
            state = self.calls[i]
            text = call.arguments_json()
            if not (final or call.complete) and call.arguments_text is None:
                text = stable_prefix(text)
            if len(text) > len(state.sent_args) and text.startswith(state.sent_args):
                fragment = text[len(state.sent_args):]
                if header is not None:
                    header.function.arguments = fragment
                else:
                    deltas.append(DeltaToolCall(index=i, function=DeltaFunctionCall(
                        arguments=fragment)))
                state.sent_args = text
            elif final and text != state.sent_args:
                logger.warning("Streamed arguments of tool call %d diverged from the final "
                               "ones (%r vs %r).", i, state.sent_args, text)
        return deltas


def _overrides_streaming(parser: ToolParser) -> bool:
    return (type(parser).extract_tool_calls_streaming
            is not ToolParser.extract_tool_calls_streaming)


def mistral_tool_call_id() -> str:
    """Mistral's tokenizer expects 9 alphanumeric characters."""
    return "".join(random.choices(string.ascii_letters + string.digits, k=9))
