"""vLLM 0.32's moved import paths exist beside the old ones and name the same objects,
so code written against vLLM 0.32 imports unchanged."""
from __future__ import annotations

import importlib

import pytest

MOVED = [
    ("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionRequest",
     "vllm.entrypoints.openai.protocol"),
    ("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionResponse",
     "vllm.entrypoints.openai.protocol"),
    ("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionStreamResponse",
     "vllm.entrypoints.openai.protocol"),
    ("vllm.entrypoints.openai.completion.protocol", "CompletionRequest",
     "vllm.entrypoints.openai.protocol"),
    ("vllm.entrypoints.openai.completion.protocol", "CompletionResponse",
     "vllm.entrypoints.openai.protocol"),
    ("vllm.entrypoints.openai.engine.protocol", "ErrorResponse",
     "vllm.entrypoints.openai.protocol"),
    ("vllm.entrypoints.openai.engine.protocol", "UsageInfo",
     "vllm.entrypoints.openai.protocol"),
    ("vllm.entrypoints.openai.models.protocol", "LoRAModulePath",
     "vllm.entrypoints.openai.serving_models"),
    ("vllm.entrypoints.openai.models.protocol", "ModelList",
     "vllm.entrypoints.openai.protocol"),
    ("vllm.entrypoints.openai.responses.protocol", "ResponsesRequest",
     "vllm.entrypoints.openai.protocol_responses"),
    ("vllm.entrypoints.launchers.cli_args", "make_arg_parser",
     "vllm.entrypoints.openai.cli_args"),
    ("vllm.entrypoints.launchers.cli_args", "validate_parsed_serve_args",
     "vllm.entrypoints.openai.cli_args"),
    ("vllm.tool_parsers", "ToolParserManager", "vllm.entrypoints.openai.tool_parsers"),
    ("vllm.tool_parsers", "ToolParser", "vllm.entrypoints.openai.tool_parsers"),
    ("vllm.tool_parsers", "Hermes2ProToolParser", "vllm.entrypoints.openai.tool_parsers"),
]


@pytest.mark.parametrize("new, name, old", MOVED)
def test_new_path_names_the_old_object(new, name, old):
    assert getattr(importlib.import_module(new), name) is \
        getattr(importlib.import_module(old), name)


def test_renamed_usage_details_and_registries():
    from vllm.entrypoints.openai.engine.protocol import PromptTokenUsageInfo
    from vllm.entrypoints.openai.protocol import PromptTokensDetails
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    assert PromptTokenUsageInfo is PromptTokensDetails
    assert "hermes" in ToolParserManager.list_registered()
    assert ToolParserManager.get_tool_parser("hermes").__name__ == "Hermes2ProToolParser"
    assert "deepseek_r1" in ReasoningParserManager.list_registered()


def test_launchers_parser_parses_serve_flags():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    args = make_arg_parser().parse_args(["--model", "m", "--max-model-len", "4k"])
    assert (args.model, args.max_model_len) == ("m", 4000)
