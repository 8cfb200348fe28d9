"""Each reasoning parser on its model family's text, whole and streamed in every chunking
(the tags split at every position): reasoning out of the answer, the answer intact;
and the request switches (include_reasoning, template kwargs, reasoning_effort)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.entrypoints.parser_stream_check import chunkings
from vllm.entrypoints.openai.chat_parsing import ChoiceParser, ToolPlan
from vllm.reasoning import ReasoningParserManager, ReasoningStreamer

R, A = "Let me think: 2 + 2 = 4 ✓ {\"x\": [1]}", "The answer is 4 — 四."

CASES = {
    # name: (output text, reasoning, content)
    "deepseek_v3": (f"{R}</think>{A}", R, A),
    "mistral": (f"[THINK]{R}[/THINK]{A}", R, A),
    "kimi_k2": (f"<think>{R}</think>{A}", R, A),
    "minimax_m2": (f"{R}</think>\n\n{A}", R, A),
    "seed_oss": (f"<seed:think>{R}</seed:think>{A}", R, A),
    "step3": (f"{R}</think>{A}", R, A),
    "ernie45": (f"{R}\n</think>\n\n<response>\n{A}\n</response>\n", R, A),
    "hunyuan_a13b": (f"<think>\n{R}\n</think>\n<answer>\n{A}\n</answer>", R, A),
    "olmo3": (f"<think>{R}</think>{A}", R, A),
    "glm45": (f"<think>{R}</think>{A}", R, A),
    "granite": (f"Here is my thought process: {R} Here is my response: {A}", R, A),
}

THINKING_ON = SimpleNamespace(chat_template_kwargs={"thinking": True})


def make(name, request=THINKING_ON):
    return ReasoningParserManager.get_reasoning_parser(name)(_Tok()).for_request(request)


class _Tok:
    """Enough tokenizer for the parsers' marker ids."""

    def get_vocab(self):
        return {}

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def _strip(x):
    return (x or "").strip()


@pytest.mark.parametrize("name", sorted(CASES))
def test_reasoning_split_whole_and_streamed(name):
    text, reasoning, content = CASES[name]
    got = make(name).extract_reasoning(text)
    assert (_strip(got[0]), _strip(got[1])) == (reasoning, content)
    for pieces in chunkings(text):
        streamer = ReasoningStreamer(make(name))
        r = c = ""
        for i, piece in enumerate(pieces):
            d = streamer.feed(piece, final=i == len(pieces) - 1)
            r, c = r + d.reasoning, c + d.content
        assert (_strip(r), _strip(c)) == (reasoning, content), pieces[:2]


@pytest.mark.parametrize("name, text", [
    ("mistral", "Just the answer."), ("kimi_k2", "Just the answer."),
    ("glm45", "Just the answer."), ("granite", "Just the answer."),
    ("hunyuan_a13b", "Just the answer.")])
def test_no_reasoning_markers_is_all_answer(name, text):
    assert make(name).extract_reasoning(text) == (None, text)


def test_kimi_k2_tool_section_ends_the_reasoning():
    text = "<think>hmm<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
    assert make("kimi_k2").extract_reasoning(text) == (
        "hmm", "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0")


def test_deepseek_v3_reasons_only_with_the_thinking_switch():
    assert make("deepseek_v3", SimpleNamespace(chat_template_kwargs=None)) is None
    assert make("deepseek_v3", SimpleNamespace(chat_template_kwargs={"thinking": False})) is None
    assert make("deepseek_v3") is not None


def _choice(name, include_reasoning):
    request = SimpleNamespace(include_reasoning=include_reasoning, chat_template_kwargs=None,
                              parallel_tool_calls=True)
    parser = ReasoningParserManager.get_reasoning_parser(name)(_Tok())
    return ChoiceParser(parser, ToolPlan("none"), request)


def test_include_reasoning_false_drops_the_reasoning_whole_and_streamed():
    text = f"<think>{R}</think>{A}"
    assert _choice("qwen3", True).parse(text).reasoning == R
    parsed = _choice("qwen3", False).parse(text)
    assert parsed.reasoning is None and parsed.content == A
    choice = _choice("qwen3", False)
    out = [choice.stream(ch, i == len(text) - 1) for i, ch in enumerate(text)]
    assert "".join(r for r, _, _ in out) == "" and "".join(c for _, c, _ in out) == A


def test_template_kwargs_default_then_effort_then_request():
    from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
    chat = OpenAIServingChat.__new__(OpenAIServingChat)
    chat.default_chat_template_kwargs = {"enable_thinking": False, "a": 1}
    req = SimpleNamespace(reasoning_effort="low", chat_template_kwargs={"a": 2})
    assert chat.template_kwargs(req) == {"enable_thinking": False, "a": 2,
                                         "reasoning_effort": "low"}
    req = SimpleNamespace(reasoning_effort="low",
                          chat_template_kwargs={"reasoning_effort": "high"})
    assert chat.template_kwargs(req)["reasoning_effort"] == "high"
    chat.default_chat_template_kwargs = {}
    assert chat.template_kwargs(SimpleNamespace(chat_template_kwargs=None)) is None


def test_default_chat_template_kwargs_flag():
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    args = make_arg_parser().parse_args(
        ["--default-chat-template-kwargs", '{"enable_thinking": false}'])
    assert args.default_chat_template_kwargs == {"enable_thinking": False}


REASONING_PLUGIN = '''
from vllm.reasoning import ReasoningParser, ReasoningParserManager


@ReasoningParserManager.register_module("bracket_think")
class BracketThink(ReasoningParser):
    start_token = "[[thinking]]"
    end_token = "[[done]]"
    unterminated_is_reasoning = False
'''


def test_reasoning_parser_plugin_file_registers_a_parser(tmp_path):
    """--reasoning-parser-plugin: the user's file registers a name the flag then accepts;
    the parser splits whole and streamed like the built-in ones."""
    import argparse

    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.openai.cli_args import _check_reasoning_parser, make_arg_parser
    path = tmp_path / "my_reasoning.py"
    path.write_text(REASONING_PLUGIN)
    with pytest.raises(ValueError, match="reasoning-parser-plugin"):
        _check_reasoning_parser(argparse.Namespace(reasoning_parser="bracket_think",
                                                   reasoning_parser_plugin=""))
    with pytest.raises(ValueError, match="--reasoning-parser-plugin"):
        _check_reasoning_parser(argparse.Namespace(reasoning_parser="",
                                                   reasoning_parser_plugin=str(tmp_path)))
    args = make_arg_parser().parse_args(["--reasoning-parser", "bracket_think",
                                         "--reasoning-parser-plugin", str(path)])
    _check_reasoning_parser(args)
    assert EngineArgs.from_cli_args(args).reasoning_parser_plugin == str(path)
    text = f"[[thinking]]{R}[[done]]{A}"
    assert make("bracket_think").extract_reasoning(text) == (R, A)
    assert make("bracket_think").extract_reasoning(A) == (None, A)
    for pieces in chunkings(text):
        streamer = ReasoningStreamer(make("bracket_think"))
        r = c = ""
        for i, piece in enumerate(pieces):
            d = streamer.feed(piece, final=i == len(pieces) - 1)
            r, c = r + d.reasoning, c + d.content
        assert (r, c) == (R, A), pieces[:2]
