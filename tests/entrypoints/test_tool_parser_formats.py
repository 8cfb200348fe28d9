"""Each model family's tool-call text, as the model writes it, read whole and streamed in
every chunking (tags split at every position): several calls, nested JSON and unicode in
the arguments, and a malformed call that comes back as text."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.entrypoints.parser_stream_check import assert_stream_matches, chunkings, stream
from vllm.entrypoints.openai.tool_parsers import ToolParserManager

WEATHER = {"city": "Zürich 北京", "days": 3, "detail": {"wind": True, "levels": [1, {"x": None}]}}
TIME = {"tz": "Asia/Tōkyō \"JST\""}
W, T = json.dumps(WEATHER, ensure_ascii=False), json.dumps(TIME, ensure_ascii=False)


def _tool(name, props):
    return SimpleNamespace(type="function", function=SimpleNamespace(
        name=name, parameters={"type": "object", "properties": props}))


REQUEST = SimpleNamespace(parallel_tool_calls=True, tools=[
    _tool("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"},
                          "detail": {"type": "object"}}),
    _tool("get_time", {"tz": {"type": "string"}})])


def _qwen_xml(open_tag, close_tag):
    return (f'{open_tag}\n<function=get_weather>\n<parameter=city>\n{WEATHER["city"]}\n'
            '</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=detail>\n'
            + json.dumps(WEATHER["detail"]) + f'\n</parameter>\n</function>\n{close_tag}\n'
            f'{open_tag}\n<function=get_time>\n<parameter=tz>\n{TIME["tz"]}\n</parameter>\n'
            f'</function>\n{close_tag}')


DS = "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"

CASES = {
    # name: (text, content before the calls)
    "qwen3_coder": ("Let me check.\n" + _qwen_xml("<tool_call>", "</tool_call>"),
                    "Let me check."),
    "qwen3_xml": (_qwen_xml("<tool_call>", "</tool_call>"), ""),
    "seed_oss": ("Checking.<seed:tool_call>" + _qwen_xml("", "")[1:] + "</seed:tool_call>",
                 "Checking."),
    "minimax_m2": ('Sure.\n<minimax:tool_call>\n<invoke name="get_weather">\n'
                   f'<parameter name="city">{WEATHER["city"]}</parameter>\n'
                   '<parameter name="days">3</parameter>\n<parameter name="detail">'
                   + json.dumps(WEATHER["detail"]) + '</parameter>\n</invoke>\n'
                   f'<invoke name="get_time">\n<parameter name="tz">{TIME["tz"]}</parameter>\n'
                   '</invoke>\n</minimax:tool_call>', "Sure."),
    "step3": ('OK<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜>'
              f'<steptml:invoke name="get_weather"><steptml:parameter name="city">'
              f'{WEATHER["city"]}</steptml:parameter><steptml:parameter name="days">3'
              '</steptml:parameter><steptml:parameter name="detail">'
              + json.dumps(WEATHER["detail"]) + '</steptml:parameter></steptml:invoke>'
              '<｜tool_call_end｜><｜tool_call_begin｜>function<｜tool_sep｜>'
              f'<steptml:invoke name="get_time"><steptml:parameter name="tz">{TIME["tz"]}'
              '</steptml:parameter></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>', "OK"),
    "deepseek_v31": (f"Hm.{DS[0]}{DS[1]}get_weather{DS[2]}{W}{DS[3]}{DS[1]}get_time{DS[2]}"
                     f"{T}{DS[3]}<｜tool▁calls▁end｜>", "Hm."),
    "kimi_k2": ("Let me see. <|tool_calls_section_begin|> <|tool_call_begin|> "
                f"functions.get_weather:0 <|tool_call_argument_begin|> {W} <|tool_call_end|>"
                "<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>"
                f"{T}<|tool_call_end|><|tool_calls_section_end|>", "Let me see."),
    "granite": (f'<|tool_call|>[{{"name": "get_weather", "arguments": {W}}}, '
                f'{{"name": "get_time", "arguments": {T}}}]', ""),
    "granite-20b-fc": (f'Calling.<function_call> {{"name": "get_weather", "arguments": {W}}}\n'
                       f'<function_call> {{"name": "get_time", "arguments": {T}}}', "Calling."),
    "internlm": (f'I will call.<|action_start|><|plugin|>\n{{"name": "get_weather", '
                 f'"parameters": {W}}}<|action_end|><|action_start|><|plugin|>\n'
                 f'{{"name": "get_time", "parameters": {T}}}<|action_end|>', "I will call."),
    "jamba": (f' <tool_calls>[\n{{"name": "get_weather", "arguments": {W}}},\n'
              f'{{"name": "get_time", "arguments": {T}}}\n]</tool_calls>', ""),
    "hunyuan_a13b": (f'Let me.<tool_calls>[{{"name": "get_weather", "arguments": {W}}}, '
                     f'{{"name": "get_time", "arguments": {T}}}]</tool_calls>', "Let me."),
    "phi4_mini_json": (f'functools[{{"name": "get_weather", "arguments": {W}}}, '
                       f'{{"name": "get_time", "arguments": {T}}}]', ""),
    "xlam": (f'[{{"name": "get_weather", "arguments": {W}}}, '
             f'{{"name": "get_time", "arguments": {T}}}]', ""),
    "longcat": (f'Hi<longcat_tool_call>{{"name": "get_weather", "arguments": {W}}}'
                f'</longcat_tool_call>\n<longcat_tool_call>{{"name": "get_time", '
                f'"arguments": {T}}}</longcat_tool_call>', "Hi"),
    "ernie45": (f'<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>\n'
                f'<tool_call>\n{{"name": "get_time", "arguments": {T}}}\n</tool_call>', ""),
    "gigachat3": (f'function call<|role_sep|>\n[{{"name": "get_weather", "arguments": {W}}}, '
                  f'{{"name": "get_time", "arguments": {T}}}]', ""),
    # GLM-4.5: name line, then key/value elements; GLM-4.6 drops the newline after the name.
    "glm45": ('Let me look.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>'
              f'{WEATHER["city"]}</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3'
              '</arg_value>\n<arg_key>detail</arg_key>\n<arg_value>'
              + json.dumps(WEATHER["detail"]) + '</arg_value>\n</tool_call>\n'
              f'<tool_call>get_time<arg_key>tz</arg_key><arg_value>{TIME["tz"]}</arg_value>'
              '</tool_call>', "Let me look."),
    "llama4_pythonic": ('<|python_start|>[get_weather(city="Zürich 北京", days=3, detail='
                        '{"wind": True, "levels": [1, {"x": None}]}), '
                        'get_time(tz="Asia/Tōkyō \\"JST\\"")]<|python_end|>', ""),
}

MALFORMED = {
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis",
    "qwen3_xml": "<tool_call>\n<parameter=city>Paris</parameter>\n</tool_call>",
    "seed_oss": "<seed:tool_call>nothing here</seed:tool_call>",
    "minimax_m2": '<minimax:tool_call><invoke name="f"><parameter name="a">1</parameter>',
    "step3": "<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜>oops",
    "deepseek_v31": f"{DS[0]}{DS[1]}get_weather{DS[2]}{{not json}}{DS[3]}",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
               "<|tool_call_argument_begin|>[1, 2]<|tool_call_end|>",
    "granite": "<|tool_call|>[{'name': 'f'}]",
    "granite-20b-fc": "<function_call> {not json}",
    "internlm": "<|action_start|><|plugin|>\n{oops}<|action_end|>",
    "jamba": "<tool_calls>[{\"name\": \"f\", \"arguments\": {}]</tool_calls>",
    "hunyuan_a13b": "<tool_calls>not json</tool_calls>",
    "phi4_mini_json": "functools[oops]",
    "xlam": "[1, 2, 3]",
    "longcat": "<longcat_tool_call>{broken</longcat_tool_call>",
    "ernie45": "<tool_call>\n{\"name\": 1}\n</tool_call>",
    "gigachat3": "function call<|role_sep|>\nnot json",
    "llama4_pythonic": "<|python_start|>[get_weather(city=)]<|python_end|>",
    "glm45": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris",
}


def make(name):
    return lambda: ToolParserManager.get_tool_parser(name)(None)


def _parsed(info):
    return [(c.function.name, json.loads(c.function.arguments)) for c in info.tool_calls]


def test_every_vllm_name_is_registered():
    assert set(CASES) <= set(ToolParserManager.list_registered())


@pytest.mark.parametrize("name", sorted(CASES))
def test_calls_read_whole_and_streamed_in_every_chunking(name):
    text, content = CASES[name]
    info = assert_stream_matches(make(name), text, REQUEST, model_ids=name == "kimi_k2")
    assert info.tools_called
    assert _parsed(info) == [("get_weather", WEATHER), ("get_time", TIME)]
    assert (info.content or "").strip() == content


def test_kimi_k2_keeps_the_models_call_ids():
    info = make("kimi_k2")().extract_tool_calls(CASES["kimi_k2"][0], REQUEST)
    assert [c.id for c in info.tool_calls] == ["functions.get_weather:0", "functions.get_time:1"]


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_call_is_returned_as_text(name):
    text = MALFORMED[name]
    info = make(name)().extract_tool_calls(text, REQUEST)
    assert not info.tools_called and info.content == text
    for pieces in chunkings(text):
        content, calls = stream(make(name)(), pieces, REQUEST)  # never raises
        if not calls:
            assert content == text


@pytest.mark.parametrize("name", sorted(CASES))
def test_plain_text_is_content(name):
    text = "No tools needed: 2 + 2 = 4."
    info = make(name)().extract_tool_calls(text, REQUEST)
    assert not info.tools_called and info.content == text
    assert stream(make(name)(), list(text), REQUEST) == (text, [])


def test_xml_values_are_typed_by_the_schema_and_strings_stay_verbatim():
    parser = make("qwen3_coder")()
    parser.adjust_request(REQUEST)
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\n  007 \n</parameter>\n"
            "<parameter=days>\n4\n</parameter>\n<parameter=unknown>\n5\n</parameter>\n"
            "</function>\n</tool_call>")
    info = parser.extract_tool_calls(text, REQUEST)
    assert json.loads(info.tool_calls[0].function.arguments) == {
        "city": "  007 ", "days": 4, "unknown": "5"}


PLUGIN = '''
from vllm.entrypoints.openai.protocol import DeltaFunctionCall, DeltaMessage, DeltaToolCall
from vllm.tool_parsers import ToolParser, ToolParserManager
from vllm.entrypoints.openai.tool_parsers import ExtractedToolCallInformation
from vllm.entrypoints.openai.protocol import FunctionCall, ToolCall


@ToolParserManager.register_module("shout")
class ShoutParser(ToolParser):
    """CALL name args-json, written against vLLM's two hooks."""

    def extract_tool_calls(self, model_output, request):
        if not model_output.startswith("CALL "):
            return ExtractedToolCallInformation(False, [], model_output)
        _, name, args = model_output.split(" ", 2)
        return ExtractedToolCallInformation(True, [ToolCall(
            id="call_1", function=FunctionCall(name=name, arguments=args))], None)

    def extract_tool_calls_streaming(self, previous_text, current_text, delta_text,
                                     previous_token_ids, current_token_ids,
                                     delta_token_ids, request):
        if not current_text.startswith("CALL"):
            return DeltaMessage(content=delta_text)
        return DeltaMessage(tool_calls=[DeltaToolCall(index=0, function=DeltaFunctionCall(
            arguments=delta_text))])
'''


def test_a_plugin_file_registers_a_parser_used_whole_and_streamed(tmp_path):
    import argparse

    from vllm.entrypoints.openai.cli_args import _check_tool_parser
    from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import ToolCallStreamer
    path = tmp_path / "my_parser.py"
    path.write_text(PLUGIN)
    with pytest.raises(ValueError, match="not known"):
        _check_tool_parser(argparse.Namespace(tool_call_parser="shout", tool_parser_plugin=""))
    _check_tool_parser(argparse.Namespace(tool_call_parser="shout",
                                          tool_parser_plugin=str(path)))
    from vllm.tool_parsers import ToolParserManager as Public
    parser = Public.get_tool_parser("shout")(None)
    info = parser.extract_tool_calls('CALL f {"a": 1}', None)
    assert info.tools_called and info.tool_calls[0].function.name == "f"
    streamer = ToolCallStreamer(parser)
    assert streamer.feed("hi", False) == ("hi", [])
    streamer2 = ToolCallStreamer(Public.get_tool_parser("shout")(None))
    _, deltas = streamer2.feed("CALL f", False)
    assert deltas[0].function.arguments == "CALL f" and streamer2.tools_called


def test_vllm_032_import_paths():
    from vllm.reasoning import ReasoningParser, ReasoningParserManager  # noqa: F401
    from vllm.tool_parsers import ToolParser, ToolParserManager  # noqa: F401
    assert "qwen3_coder" in ToolParserManager.list_registered()


def test_glm45_call_without_arguments_and_text_around():
    info = assert_stream_matches(make("glm45"), "<tool_call>get_time</tool_call>", REQUEST)
    assert _parsed(info) == [("get_time", {})] and info.content is None


@pytest.mark.parametrize("text, ids", [
    # v13+ (no call ids) and v11 ([CALL_ID] before [ARGS]) tokenizers' form
    (f"Sure [TOOL_CALLS]get_weather[ARGS]{W}[TOOL_CALLS]get_time[ARGS]{T}", None),
    (f"[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{W}[TOOL_CALLS]get_time"
     f"[CALL_ID]f5g6h7i8j[ARGS]{T}", ["a1b2c3d4e", "f5g6h7i8j"])])
def test_mistral_v11_named_calls_whole_and_streamed(text, ids):
    info = assert_stream_matches(make("mistral"), text, REQUEST, model_ids=ids is not None)
    assert _parsed(info) == [("get_weather", WEATHER), ("get_time", TIME)]
    assert (info.content or "").strip() == ("Sure" if ids is None else "")
    if ids:
        assert [c.id for c in info.tool_calls] == ids
    bad = make("mistral")().extract_tool_calls("[TOOL_CALLS]get_weather{oops", REQUEST)
    assert not bad.tools_called and bad.content == "[TOOL_CALLS]get_weather{oops"
