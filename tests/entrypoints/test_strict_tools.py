"""`strict` tools under tool_choice "auto": the plan carries a structural tag (free text,
then each `<tool_call>` held to a tool's schema), compiled by xgrammar."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from vllm.config import StructuredOutputsConfig
from vllm.entrypoints.openai.chat_parsing import ToolPlan
from vllm.entrypoints.openai.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.tool_parsers import ToolParserManager
from vllm.sampling_params import StructuredOutputsParams
from vllm.structured_output.manager import validate_structured_outputs

PARAMS = {"type": "object", "properties": {"days": {"type": "integer", "maximum": 7}},
          "required": ["days"]}


def _request(strict, **extra):
    return ChatCompletionRequest(
        messages=[{"role": "user", "content": "hi"}], tool_choice="auto",
        tools=[{"type": "function", "function": {"name": "f", "strict": strict,
                                                 "parameters": PARAMS}},
               {"type": "function", "function": {"name": "g", "parameters": PARAMS}}],
        **extra)


def _plan(request, parser="hermes"):
    return ToolPlan.build(request, None, ToolParserManager.get_tool_parser(parser), True,
                          StructuredOutputsConfig())


def test_strict_auto_builds_a_structural_tag_per_tool():
    params, field = _plan(_request(True)).structured
    tag = json.loads(params.structural_tag)
    assert field == "tools" and tag["triggers"] == ["<tool_call>"]
    assert [s["begin"] for s in tag["structures"]] == [
        '<tool_call>\n{"name": "f", "arguments": ', '<tool_call>\n{"name": "g", "arguments": ']
    assert tag["structures"][0]["schema"] == PARAMS  # strict: its schema
    assert tag["structures"][1]["schema"] == {"type": "object"}  # not strict: any object
    assert validate_structured_outputs(params, StructuredOutputsConfig()).backend == "xgrammar"


def test_no_strict_tool_or_an_own_constraint_leaves_auto_free():
    assert _plan(_request(None)).structured is None
    assert _plan(_request(True, response_format={"type": "json_object"})).structured is None
    assert _plan(_request(True), parser="pythonic").structured is None  # no fixed frame


def test_structural_tag_param_is_checked():
    with pytest.raises(ValueError, match="structural_tag"):
        StructuredOutputsParams(structural_tag='{"structures": 1}')
    with pytest.raises(ValueError, match="xgrammar"):
        validate_structured_outputs(
            StructuredOutputsParams(structural_tag=json.dumps(
                {"structures": [{"begin": "<a>", "schema": PARAMS, "end": "</a>"}],
                 "triggers": ["<a>"]})), StructuredOutputsConfig(backend="guidance"))
