"""`strict` tools under tool_choice "auto": the plan carries a structural tag (free text,
then each `<tool_call>` held to a tool's schema), compiled by xgrammar."""
from __future__ import annotations

import json

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


DS = ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
      "<｜tool▁calls▁end｜>")
# parser: (a call of strict f with days=3 as the model writes it, the same with days="x")
FORMATS = {
    "qwen3_coder": ("<tool_call>\n<function=f>\n<parameter=days>\n3\n</parameter>\n"
                    "</function>\n</tool_call>", "<parameter=days>\nx"),
    "qwen3_xml": ("<tool_call>\n<function=f>\n<parameter=days>\n3\n</parameter>\n"
                  "</function>\n</tool_call>", "<parameter=days>\nx"),
    "seed_oss": ("<seed:tool_call>\n<function=f>\n<parameter=days>3</parameter>\n</function>\n"
                 "</seed:tool_call>", "<parameter=days>x"),
    "minimax_m2": ('<minimax:tool_call>\n<invoke name="f">\n<parameter name="days">3'
                   '</parameter>\n</invoke>\n</minimax:tool_call>',
                   '<parameter name="days">x'),
    "deepseek_v3": (f'{DS[0]}{DS[1]}function{DS[2]}f\n```json\n{{"days": 3}}\n```{DS[3]}{DS[4]}',
                    '```json\n{"days": "x'),
    "deepseek_v31": (f'{DS[0]}{DS[1]}f{DS[2]}{{"days": 3}}{DS[3]}{DS[4]}', '{"days": "x'),
    "kimi_k2": ('<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0'
                '<|tool_call_argument_begin|>{"days": 3}<|tool_call_end|>'
                '<|tool_calls_section_end|>', '{"days": "x'),
    "mistral": ('[TOOL_CALLS][{"name": "f", "arguments": {"days": 3}}]', '{"days": "x'),
    "jamba": ('<tool_calls>[{"name": "f", "arguments": {"days": 3}}]</tool_calls>',
              '{"days": "x'),
    "hunyuan_a13b": ('<tool_calls>[{"name": "f", "arguments": {"days": 3}}]</tool_calls>',
                     '{"days": "x'),
    "granite": ('<|tool_call|>[{"name": "f", "arguments": {"days": 3}}]', '{"days": "x'),
    "phi4_mini_json": ('functools[{"name": "f", "arguments": {"days": 3}}]', '{"days": "x'),
    "gigachat3": ('function call<|role_sep|>\n[{"name": "f", "arguments": {"days": 3}}]',
                  '{"days": "x'),
    "xlam": ('[TOOL_CALLS][{"name": "f", "arguments": {"days": 3}}]', '{"days": "x'),
    "granite-20b-fc": ('<function_call> {"name": "f", "arguments": {"days": 3}}',
                       '{"days": "x'),
    "glm45": ("<tool_call>f\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
              "</tool_call>", "<arg_value>x"),
}


@pytest.fixture(scope="module")
def xgr_compiler(tokenizer):
    import xgrammar as xgr
    info = xgr.TokenizerInfo.from_huggingface(tokenizer)
    return xgr, xgr.GrammarCompiler(info)


@pytest.mark.parametrize("parser", sorted(FORMATS))
def test_strict_auto_in_formats_without_a_fixed_frame(parser, xgr_compiler):
    """XML-parameter, special-token section and JSON-list formats: xgrammar's structural
    tag lets text through, takes a strict call that keeps its schema (which the parser
    then reads), and refuses one that breaks it."""
    xgr, compiler = xgr_compiler
    params, field = _plan(_request(True), parser=parser).structured
    tag = json.loads(params.structural_tag)
    assert field == "tools" and tag["type"] == "structural_tag"
    assert validate_structured_outputs(params, StructuredOutputsConfig()).backend == "xgrammar"
    compiled = compiler.compile_structural_tag(params.structural_tag)
    good, bad_prefix = FORMATS[parser]
    text = "Let me look that up. " + good
    matcher = xgr.GrammarMatcher(compiled)
    assert matcher.accept_string(text)
    calls = ToolParserManager.get_tool_parser(parser)(None).extract_tool_calls(
        text, _request(True))
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls.tool_calls] \
        == [("f", {"days": 3})]
    bad = text[:text.index(bad_prefix[:6])] + bad_prefix
    assert not xgr.GrammarMatcher(compiled).accept_string(bad)


def test_tool_strict_level_function_and_parameter():
    """--tool-strict-level (vLLM 0.31+): function holds every call to a tool even when
    none is strict (arguments: any object unless strict); parameter pins every tool's
    arguments to its schema; auto (default) needs a strict tool."""
    from vllm.entrypoints.openai.cli_args import make_arg_parser

    def plan(level, strict=None, parser="hermes"):
        return ToolPlan.build(_request(strict), None, ToolParserManager.get_tool_parser(
            parser), True, StructuredOutputsConfig(), level)

    assert plan("auto").structured is None
    tag = json.loads(plan("function").structured[0].structural_tag)
    assert [s["schema"] for s in tag["structures"]] == [{"type": "object"}] * 2
    tag = json.loads(plan("parameter").structured[0].structural_tag)
    assert [s["schema"] for s in tag["structures"]] == [PARAMS, PARAMS]
    tag = json.loads(plan("parameter", parser="qwen3_coder").structured[0].structural_tag)
    assert [t["content"]["json_schema"] for t in tag["format"]["tags"]] == [PARAMS, PARAMS]
    none = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}],
                                 tool_choice="none", tools=_request(None).tools)
    assert ToolPlan.build(none, None, ToolParserManager.get_tool_parser("hermes"), True,
                          StructuredOutputsConfig(), "parameter").structured is None
    assert make_arg_parser().parse_args(["--tool-strict-level", "parameter"]
                                        ).tool_strict_level == "parameter"
    with pytest.raises(SystemExit):
        make_arg_parser().parse_args(["--tool-strict-level", "all"])
