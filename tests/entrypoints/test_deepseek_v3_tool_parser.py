"""`--tool-call-parser deepseek_v3` on DeepSeek-V3's tool-call text, whole and streamed
(one character at a time and in the tokenizer's pieces): the concatenated content and
argument fragments equal the non-streamed result, each call's id/name sent once, first."""
from __future__ import annotations

import json

import pytest

from tests.entrypoints.test_tool_and_reasoning_parsers import parser_for, tokenizer  # noqa: F401
from vllm.entrypoints.openai.tool_parsers import ToolCallStreamer

WEATHER = {"city": "Paris", "unit": "celsius", "days": 3, "detail": {"wind": True}}
TIME = {"tz": "Europe/Paris \"CET\""}


def _call(name: str, args: dict) -> str:
    return ("<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n"
            + json.dumps(args) + "\n```<｜tool▁call▁end｜>")


TEXT = ("Let me check.<｜tool▁calls▁begin｜>" + _call("get_weather", WEATHER)
        + _call("get_time", TIME) + "<｜tool▁calls▁end｜>")


def test_extract_tool_calls(tokenizer):  # noqa: F811
    info = parser_for("deepseek_v3", tokenizer).extract_tool_calls(TEXT)
    assert info.tools_called and info.content == "Let me check."
    assert [c.function.name for c in info.tool_calls] == ["get_weather", "get_time"]
    assert [json.loads(c.function.arguments) for c in info.tool_calls] == [WEATHER, TIME]


def test_malformed_call_stays_content(tokenizer):  # noqa: F811
    text = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function get_weather{}"
            "<｜tool▁call▁end｜>")
    info = parser_for("deepseek_v3", tokenizer).extract_tool_calls(text)
    assert not info.tools_called and info.content == text


@pytest.mark.parametrize("chunking", ["chars", "tokens"])
def test_streamed_deltas_rebuild_the_calls(chunking, tokenizer):  # noqa: F811
    if chunking == "chars":
        pieces = list(TEXT)
    else:
        ids = tokenizer.encode(TEXT, add_special_tokens=False)
        pieces, prev = [], ""
        for i in range(len(ids)):
            cur = tokenizer.decode(ids[:i + 1])
            if cur.endswith("\ufffd"):  # a character split over tokens: held back, as
                continue                # the incremental detokenizer does
            pieces.append(cur[len(prev):])
            prev = cur
        assert "".join(pieces) == TEXT
    streamer = ToolCallStreamer(parser_for("deepseek_v3", tokenizer))
    content, calls = "", {}
    for i, piece in enumerate(pieces):
        delta_content, deltas = streamer.feed(piece, final=i == len(pieces) - 1)
        content += delta_content
        for d in deltas:
            entry = calls.setdefault(d.index, {"args": ""})
            if d.id is not None:
                assert "id" not in entry and d.function.name
                entry.update(id=d.id, name=d.function.name)
            else:
                assert "id" in entry
            entry["args"] += d.function.arguments or ""
    assert content == "Let me check."
    assert [calls[i]["name"] for i in sorted(calls)] == ["get_weather", "get_time"]
    assert [json.loads(calls[i]["args"]) for i in sorted(calls)] == [WEATHER, TIME]
