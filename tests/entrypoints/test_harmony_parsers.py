"""GPT-OSS's harmony output through the `openai_gptoss` reasoning parser and the
`openai` tool parser, alone and chained as the server chains them (ChoiceParser),
whole and streamed in every chunking (special tokens split at every position):
analysis out as reasoning, the final message as content, commentary calls as tool
calls with their JSON arguments, preambles kept, malformed calls as text; and the
token-side end of reasoning (a final message of an earlier turn does not count)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.entrypoints.parser_stream_check import assert_stream_matches, chunkings
from vllm.entrypoints.openai.chat_parsing import ChoiceParser, ToolPlan
from vllm.entrypoints.openai.tool_parsers import ToolParserManager
from vllm.reasoning import ReasoningParserManager

ARGS = {"city": "Zürich", "days": 3, "detail": {"wind": True}}
A = json.dumps(ARGS, ensure_ascii=False)
THINK = "The user wants weather; call get_weather."
CALL = (f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        f"{A}<|call|>")
OUTPUTS = {
    # analysis, then a call (the recipient after the channel, as gpt-oss writes it)
    "call": (f"<|channel|>analysis<|message|>{THINK}<|end|><|start|>assistant{CALL}",
             THINK, None, [("get_weather", ARGS)]),
    # a preamble, then a call addressed before the channel
    "preamble-call": (f"<|channel|>analysis<|message|>{THINK}<|end|><|start|>assistant"
                      "<|channel|>commentary<|message|>Checking the weather.<|end|>"
                      "<|start|>assistant to=functions.get_weather<|channel|>commentary json"
                      f"<|message|>{A}<|call|>", THINK, "Checking the weather.",
                      [("get_weather", ARGS)]),
    # the final answer after reasoning (no call)
    "final": (f"<|channel|>analysis<|message|>{THINK}<|end|><|start|>assistant"
              "<|channel|>final<|message|>It is sunny — 晴れ.<|return|>", THINK,
              "It is sunny — 晴れ.", []),
    # generation stopped at <|call|> / <|return|> (stop tokens are not in the text)
    "final-stopped": ("<|channel|>analysis<|message|>Short.<|end|><|start|>assistant"
                      "<|channel|>final<|message|>Done.", "Short.", "Done.", []),
}


class _Tok:
    """Enough tokenizer for marker ids: one id per character."""

    def get_vocab(self):
        return {}

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def _tool(name):
    return SimpleNamespace(type="function", function=SimpleNamespace(
        name=name, parameters={"type": "object", "properties": {}}, strict=None))


REQUEST = SimpleNamespace(parallel_tool_calls=True, tools=[_tool("get_weather")],
                          include_reasoning=True, chat_template_kwargs=None,
                          skip_special_tokens=True)


def _reasoning_parser():
    return ReasoningParserManager.get_reasoning_parser("openai_gptoss")(_Tok())


def _tool_parser():
    return ToolParserManager.get_tool_parser("openai")(None)


def _chained(text_pieces):
    """(reasoning, content, [(name, args)]) as the server gets them, streamed."""
    parser = ChoiceParser(_reasoning_parser(), ToolPlan("auto", parser=_tool_parser()),
                          REQUEST)
    reasoning, content, calls = "", "", {}
    for i, piece in enumerate(text_pieces):
        r, c, deltas = parser.stream(piece, final=i == len(text_pieces) - 1)
        reasoning, content = reasoning + r, content + c
        for d in deltas:
            entry = calls.setdefault(d.index, {"name": None, "args": ""})
            entry["name"] = entry["name"] or d.function.name
            entry["args"] += d.function.arguments or ""
    return reasoning, content, [(c["name"], json.loads(c["args"])) for c in calls.values()]


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_chained_whole_and_streamed_in_every_chunking(name):
    text, reasoning, content, calls = OUTPUTS[name]
    whole = ChoiceParser(_reasoning_parser(), ToolPlan("auto", parser=_tool_parser()),
                         REQUEST).parse(text)
    assert whole.reasoning == reasoning
    assert (whole.content or None) == content
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in whole.tool_calls] == calls
    for pieces in chunkings(text):
        got = _chained(pieces)
        assert got == (reasoning, content or "", calls), pieces[:2]


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_tool_parser_alone(name):
    """Without the reasoning parser the analysis is dropped, not shown as content."""
    text, _, content, calls = OUTPUTS[name]
    info = assert_stream_matches(_tool_parser, text, REQUEST)
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in info.tool_calls] == calls
    if calls:
        assert (info.content or None) == content


def test_malformed_call_is_text():
    text = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{oops"
    info = _tool_parser().extract_tool_calls(text, REQUEST)
    assert not info.tools_called and info.content == text


def test_plain_text_is_content():
    parser = _reasoning_parser()
    assert parser.extract_reasoning("No harmony here.") == (None, "No harmony here.")
    info = _tool_parser().extract_tool_calls("No harmony here.", REQUEST)
    assert not info.tools_called and info.content == "No harmony here."


def test_reasoning_end_on_tokens():
    parser = _reasoning_parser()
    ids = _Tok().encode
    history = ids("<|start|>assistant<|channel|>final<|message|>Earlier answer.<|end|>"
                  "<|start|>user<|message|>Next?<|end|><|start|>assistant")
    assert not parser.reasoning_ended_in(history)  # an earlier turn's final message
    out = ids("<|channel|>analysis<|message|>hm<|end|><|start|>assistant"
              "<|channel|>final<|message|>")
    assert not parser.reasoning_ended_in(history + out[:-3])
    assert parser.reasoning_ended_in(history + out) and parser.ended_after(out)
    assert parser.end_token.endswith("<|channel|>final<|message|>")


def test_special_tokens_kept_for_parsing():
    request = SimpleNamespace(skip_special_tokens=True)
    assert _reasoning_parser().adjust_request(request).skip_special_tokens is False
