"""Tool-call and reasoning parsers on fixed model texts, whole and streamed.

Streaming is fed in every chunking tested (one character at a time, and the
tokenizer's own tokens): the concatenated content and argument fragments must equal
the non-streamed result, with each call's id/name sent once, first.
"""
from __future__ import annotations

import json

import pytest

from vllm.entrypoints.openai.tool_parsers import ToolCallStreamer, ToolParserManager
from vllm.reasoning import ReasoningParserManager, ReasoningStreamer

WEATHER = {"city": "Paris", "unit": "celsius", "days": 3, "detail": {"wind": True}}
TIME = {"tz": "Europe/Paris \"CET\""}

CASES = {
    "hermes": (
        'Let me check.<tool_call>\n{"name": "get_weather", "arguments": '
        + json.dumps(WEATHER) + '}\n</tool_call>\n<tool_call>\n{"name": "get_time", '
        '"arguments": ' + json.dumps(TIME) + '}\n</tool_call>',
        "Let me check."),
    "llama3_json": (
        '{"name": "get_weather", "parameters": ' + json.dumps(WEATHER) + '}; '
        '{"name": "get_time", "parameters": ' + json.dumps(TIME) + '}', None),
    "mistral": (
        'Sure [TOOL_CALLS] [{"name": "get_weather", "arguments": ' + json.dumps(WEATHER)
        + '}, {"name": "get_time", "arguments": ' + json.dumps(TIME) + '}]', "Sure "),
    "pythonic": (
        '[get_weather(city="Paris", unit="celsius", days=3, detail={"wind": True}), '
        'get_time(tz="Europe/Paris \\"CET\\"")]', None),
}


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    from vllm.transformers_utils.tokenizer import get_tokenizer
    return get_tokenizer(resolve_model_path(DEFAULT_MODEL))


def parser_for(name, tokenizer):
    return ToolParserManager.get_tool_parser(name)(tokenizer)


@pytest.mark.parametrize("name", sorted(CASES))
def test_extract_tool_calls(name, tokenizer):
    text, content = CASES[name]
    info = parser_for(name, tokenizer).extract_tool_calls(text)
    assert info.tools_called
    assert [c.function.name for c in info.tool_calls] == ["get_weather", "get_time"]
    assert json.loads(info.tool_calls[0].function.arguments) == WEATHER
    assert json.loads(info.tool_calls[1].function.arguments) == TIME
    assert info.content == content
    assert len({c.id for c in info.tool_calls}) == 2
    if name == "mistral":
        assert all(len(c.id) == 9 and c.id.isalnum() for c in info.tool_calls)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("chunking", ["chars", "tokens"])
def test_streamed_deltas_rebuild_the_calls(name, chunking, tokenizer):
    text, content = CASES[name]
    if chunking == "chars":
        pieces = list(text)
    else:
        ids = tokenizer.encode(text, add_special_tokens=False)
        pieces, prev = [], ""
        for i in range(len(ids)):
            cur = tokenizer.decode(ids[:i + 1])
            pieces.append(cur[len(prev):])
            prev = cur
        assert "".join(pieces) == text
    streamer = ToolCallStreamer(parser_for(name, tokenizer))
    got_content = ""
    calls: dict[int, dict] = {}
    for i, piece in enumerate(pieces):
        delta_content, deltas = streamer.feed(piece, final=i == len(pieces) - 1)
        got_content += delta_content
        # One entry per call index in a chunk: clients read a chunk's entry for an index
        # as that call's news (a header and its first arguments come together).
        assert len({d.index for d in deltas}) == len(deltas), deltas
        for d in deltas:
            entry = calls.setdefault(d.index, {"args": ""})
            if d.id is not None:
                assert "id" not in entry and d.function.name
                entry.update(id=d.id, name=d.function.name)
            else:
                assert "id" in entry, "arguments before the call's first delta"
            entry["args"] += d.function.arguments or ""
    assert got_content == (content or "")
    assert [calls[i]["name"] for i in sorted(calls)] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["args"]) == WEATHER
    assert json.loads(calls[1]["args"]) == TIME


@pytest.mark.parametrize("name, text", [
    ("hermes", "No tools needed, the answer is 4."),
    ("hermes", "<tool_call>{not json}</tool_call>"),
    ("llama3_json", "The answer is {probably} 4."),
    ("mistral", "Plain answer."),
    ("pythonic", "Plain answer [with brackets]."),
    ("pythonic", "[1, 2, 3]"),
])
def test_plain_text_stays_content(name, text, tokenizer):
    info = parser_for(name, tokenizer).extract_tool_calls(text)
    assert not info.tools_called and info.content == text


def test_parallel_tool_calls_false_keeps_the_first(tokenizer):
    class Req:
        parallel_tool_calls = False
    info = parser_for("hermes", tokenizer).extract_tool_calls(CASES["hermes"][0], Req())
    assert [c.function.name for c in info.tool_calls] == ["get_weather"]


def test_content_before_a_partial_marker_is_held_back(tokenizer):
    streamer = ToolCallStreamer(parser_for("hermes", tokenizer))
    assert streamer.feed("Hi <tool_") == ("Hi ", [])
    content, deltas = streamer.feed("call>")
    assert content == "" and deltas == []
    streamer = ToolCallStreamer(parser_for("hermes", tokenizer))
    assert streamer.feed("a <b>") == ("a <b>", [])


# ----------------------------------------------------------------- reasoning
@pytest.mark.parametrize("name, text, reasoning, content", [
    ("deepseek_r1", "I should add.</think>The answer is 4.", "I should add.",
     "The answer is 4."),
    ("deepseek_r1", "<think>Think.</think>Answer", "Think.", "Answer"),
    ("deepseek_r1", "Still thinking when cut off", "Still thinking when cut off", None),
    ("qwen3", "<think>\nStep 1.\n</think>\n\n42", "\nStep 1.\n", "\n\n42"),
    ("qwen3", "42 without thinking", None, "42 without thinking"),
    ("qwen3", "<think>unfinished", "unfinished", None),
])
def test_reasoning_split(name, text, reasoning, content, tokenizer):
    parser = ReasoningParserManager.get_reasoning_parser(name)(tokenizer)
    assert parser.extract_reasoning(text) == (reasoning, content)
    streamer = ReasoningStreamer(parser)
    got_r, got_c = "", ""
    for i, ch in enumerate(text):
        d = streamer.feed(ch, final=i == len(text) - 1)
        got_r += d.reasoning
        got_c += d.content
    assert (got_r or None, got_c or None) == (reasoning, content)


def test_reasoning_end_on_tokens(tokenizer):
    r1 = ReasoningParserManager.get_reasoning_parser("deepseek_r1")(tokenizer)
    q3 = ReasoningParserManager.get_reasoning_parser("qwen3")(tokenizer)
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    assert not r1.reasoning_ended_in(enc("User: hi\nAssistant: <think>\n"))
    assert not r1.reasoning_ended_in(enc("User: hi"))  # opens reasoning implicitly
    assert q3.reasoning_ended_in(enc("User: hi"))  # thinking only when it starts
    assert q3.reasoning_ended_in(enc("<think>\n\n</think>\n\n"))
    assert r1.ended_after(enc("so 4") + r1.end_token_ids)
    assert not r1.ended_after(enc("so 4"))
