"""Chat output parsing: reasoning, then tool calls, per choice, whole or streamed.

`ToolPlan` turns a request's `tools` / `tool_choice` / `parallel_tool_calls` into what
the server does: nothing (none), parse the model's own format (auto, with
--enable-auto-tool-choice and --tool-call-parser), or constrain the output by a JSON
schema built from the tools (required: a list of {name, parameters}; named: that
function's parameters) and read the calls from it. `ChoiceParser` applies the
reasoning parser first; only the answer after the reasoning is read for tool calls.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Optional

from vllm.entrypoints.openai.errors import BadRequestError
from vllm.entrypoints.openai.protocol import (ChatCompletionRequest, DeltaToolCall, ToolCall)
from vllm.entrypoints.openai.structured_outputs import check_structured_outputs
from vllm.entrypoints.openai.tool_parsers import PartialCall, ToolCallStreamer, ToolParser
from vllm.entrypoints.openai.tool_parsers.json_calls import call_from_object, load_json
from vllm.reasoning import ReasoningParser, ReasoningStreamer
from vllm.sampling_params import StructuredOutputsParams

logger = logging.getLogger(__name__)

TOOL_STRICT_LEVELS = ("auto", "function", "parameter")
"""--tool-strict-level, vLLM's server-side floor for tool_choice "auto": `auto` holds
calls to the tools only when some tool is `strict`; `function` holds every call of a
request with tools to one of its functions (a strict tool's arguments to its schema,
another's to any object); `parameter` also every tool's arguments to its schema, as if
each were strict. The model may still answer in text."""

AUTO_NEEDS_FLAGS = ('"auto" tool choice requires --enable-auto-tool-choice and '
                    '--tool-call-parser to be set')


class RequiredToolParser(ToolParser):
    """tool_choice "required": the output is a JSON list of {"name", "parameters"}."""

    def adjust_request(self, request: Any) -> Any:
        return request

    def split(self, text: str, final: bool) -> tuple[str, Optional[str]]:
        return "", text

    def parse_calls(self, tool_text: str, final: bool) -> list[PartialCall]:
        value = load_json(tool_text, final)
        if value is None:
            return []
        if not isinstance(value, list):
            raise ValueError("the required tool calls must be a JSON list")
        return [call_from_object(item, final or i < len(value) - 1, ("parameters",))
                for i, item in enumerate(value) if isinstance(item, dict)]


class NamedToolParser(ToolParser):
    """A named tool_choice: the whole output is that function's arguments."""

    def __init__(self, tokenizer: Any, name: str) -> None:
        super().__init__(tokenizer)
        self.name = name

    def adjust_request(self, request: Any) -> Any:
        return request

    def split(self, text: str, final: bool) -> tuple[str, Optional[str]]:
        return "", text

    def parse_calls(self, tool_text: str, final: bool) -> list[PartialCall]:
        return [PartialCall(self.name, complete=final, arguments_text=tool_text)]


def _tool_entry(tool: Any) -> dict[str, Any]:
    params = tool.function.parameters or {"type": "object", "properties": {}}
    return {"type": "object",
            "properties": {"name": {"type": "string", "enum": [tool.function.name]},
                           "parameters": params},
            "required": ["name", "parameters"]}


@dataclass
class ToolPlan:
    mode: str
    """none | auto | required | named"""
    parser: Optional[ToolParser] = None
    structured: Optional[tuple[StructuredOutputsParams, str]] = None

    @classmethod
    def build(cls, request: ChatCompletionRequest, tokenizer: Any,
              tool_parser_cls: Optional[type[ToolParser]], enable_auto: bool,
              so_config: Any, strict_level: str = "auto") -> "ToolPlan":
        choice = request.effective_tool_choice
        tools = request.tools or []
        for i, tool in enumerate(tools):
            if tool.function.parameters is not None:
                check_structured_outputs(StructuredOutputsParams(json=tool.function.parameters),
                                         f"tools.{i}.function.parameters", so_config)
        if choice == "none":
            return cls("none")
        if not tools:
            raise BadRequestError(f"tool_choice {_choice_name(choice)} needs tools.",
                                  param="tools")
        if choice == "auto":
            if not enable_auto or tool_parser_cls is None:
                raise BadRequestError(AUTO_NEEDS_FLAGS, param="tool_choice")
            parser = tool_parser_cls(tokenizer)
            return cls("auto", parser=parser,
                       structured=_strict_tag(parser, tools, request, strict_level))
        if _has_own_constraint(request):
            raise BadRequestError(f"tool_choice {_choice_name(choice)} constrains the output "
                                  "itself; it cannot be combined with response_format or "
                                  "structured_outputs.", param="tool_choice")
        if choice == "required":
            schema: dict[str, Any] = {"type": "array", "minItems": 1,
                                      "items": {"anyOf": [_tool_entry(t) for t in tools]}}
            if request.parallel_tool_calls is False:
                schema["maxItems"] = 1
            return cls("required", parser=RequiredToolParser(tokenizer),
                       structured=(StructuredOutputsParams(json=schema), "tool_choice"))
        name = choice.function.name
        tool = next((t for t in tools if t.function.name == name), None)
        if tool is None:
            raise BadRequestError(f"Tool {name!r} named by tool_choice is not in tools.",
                                  param="tool_choice")
        params = tool.function.parameters or {"type": "object", "properties": {}}
        return cls("named", parser=NamedToolParser(tokenizer, name),
                   structured=(StructuredOutputsParams(json=params), "tool_choice"))


def _strict_tag(parser: ToolParser, tools: list[Any], request: Any,
                strict_level: str = "auto") -> Optional[tuple[StructuredOutputsParams, str]]:
    """tool_choice "auto" with `strict` tools (or --tool-strict-level function /
    parameter): a structural tag that leaves the text free and, once the model opens a
    call, holds it to one of the tools (a strict tool's arguments to its parameters
    schema, another's to any object)."""
    if strict_level == "parameter":
        tools = [_as_strict(t) for t in tools]
    elif strict_level != "function" and not any(
            getattr(t.function, "strict", None) for t in tools):
        return None
    if _has_own_constraint(request):
        return None  # the request's own constraint governs the output
    frames = [parser.strict_structure(t.function.name) for t in tools]
    if any(f is None for f in frames):
        # No fixed frame per call (XML parameters, call sections, JSON lists): the
        # parser's own xgrammar structural-tag format, if it has one.
        fmt = parser.strict_format([(t.function.name, _strict_schema(t)) for t in tools])
        if fmt is None:
            logger.warning("strict tools are not enforced with tool_choice auto for the %s "
                           "format.", type(parser).__name__)
            return None
        return StructuredOutputsParams(structural_tag=json.dumps(
            {"type": "structural_tag", "format": fmt}, ensure_ascii=False)), "tools"
    structures = [{"begin": begin, "end": end,
                   "schema": (t.function.parameters or {"type": "object", "properties": {}})
                   if t.function.strict else {"type": "object"}}
                  for t, (_, begin, end) in zip(tools, frames)]
    tag = {"structures": structures, "triggers": sorted({f[0] for f in frames})}
    return StructuredOutputsParams(structural_tag=json.dumps(tag)), "tools"


def _as_strict(tool: Any) -> Any:
    """The tool as if `strict: true` (--tool-strict-level parameter)."""
    if tool.function.strict:
        return tool
    return tool.model_copy(update={"function": tool.function.model_copy(
        update={"strict": True})})


def _strict_schema(tool: Any) -> dict:
    """A strict tool's arguments schema; any object for a tool that is not strict."""
    if not tool.function.strict:
        return {"type": "object"}
    return tool.function.parameters or {"type": "object", "properties": {}}


def _choice_name(choice: Any) -> str:
    return repr(choice) if isinstance(choice, str) else f"{{function: {choice.function.name}}}"


def _has_own_constraint(request: Any) -> bool:
    fmt = request.response_format
    return (request.structured_outputs is not None or (fmt is not None and fmt.type != "text")
            or any(getattr(request, n) is not None for n in
                   ("guided_json", "guided_regex", "guided_choice", "guided_grammar")))


@dataclass
class ParsedChoice:
    reasoning: Optional[str]
    content: Optional[str]
    tool_calls: list[ToolCall]


class ChoiceParser:
    """Reasoning and tool calls of one choice (fresh per choice)."""

    def __init__(self, reasoning_parser: Optional[ReasoningParser], plan: ToolPlan,
                 request: Any) -> None:
        if reasoning_parser is not None:
            reasoning_parser = reasoning_parser.for_request(request)
        self.reasoning_parser = reasoning_parser
        self.plan = plan
        self.request = request
        self.include_reasoning = getattr(request, "include_reasoning", True) is not False
        """include_reasoning false: the reasoning is parsed out of the answer and dropped."""
        self._reasoning = ReasoningStreamer(reasoning_parser) if reasoning_parser else None
        self._tools = (ToolCallStreamer(plan.parser, request) if plan.parser is not None
                       else None)
        self._called = False

    @property
    def tools_called(self) -> bool:
        return self._called or (self._tools is not None and self._tools.tools_called)

    def finish_reason(self, finish_reason: Optional[str]) -> Optional[str]:
        """"tool_calls" when the model called tools (auto, required) and stopped."""
        if finish_reason == "stop" and self.tools_called and self.plan.mode != "named":
            return "tool_calls"
        return finish_reason

    def parse(self, text: str) -> ParsedChoice:
        reasoning, content = None, text
        if self.reasoning_parser is not None:
            reasoning, content = self.reasoning_parser.extract_reasoning(text)
            content = content or ""
            if not self.include_reasoning:
                reasoning = None
        if self.plan.parser is None:
            return ParsedChoice(reasoning, content, [])
        info = self.plan.parser.extract_tool_calls(content, self.request)
        if info.tools_called:
            self._called = True
            return ParsedChoice(reasoning, info.content, info.tool_calls)
        return ParsedChoice(reasoning, content, [])

    def stream(self, delta_text: str, final: bool
               ) -> tuple[str, str, list[DeltaToolCall]]:
        """(reasoning delta, content delta, tool-call deltas) for new text."""
        reasoning, content = "", delta_text
        if self._reasoning is not None:
            d = self._reasoning.feed(delta_text, final)
            reasoning, content = d.reasoning if self.include_reasoning else "", d.content
        if self._tools is None:
            return reasoning, content, []
        content, tool_deltas = self._tools.feed(content, final)
        return reasoning, content, tool_deltas
