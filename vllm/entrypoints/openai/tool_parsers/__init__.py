"""Tool-call parsers by their `--tool-call-parser` name (one file per model format)."""
from __future__ import annotations

from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ExtractedToolCallInformation, PartialCall, ToolCallStreamer, ToolParser)
from vllm.entrypoints.openai.tool_parsers.deepseek_v3_tool_parser import DeepSeekV3ToolParser
from vllm.entrypoints.openai.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
from vllm.entrypoints.openai.tool_parsers.llama_tool_parser import Llama3JsonToolParser
from vllm.entrypoints.openai.tool_parsers.mistral_tool_parser import MistralToolParser
from vllm.entrypoints.openai.tool_parsers.pythonic_tool_parser import PythonicToolParser


class ToolParserManager:

    _parsers: dict[str, type[ToolParser]] = {
        "deepseek_v3": DeepSeekV3ToolParser,
        "hermes": Hermes2ProToolParser,
        "llama3_json": Llama3JsonToolParser,
        "mistral": MistralToolParser,
        "pythonic": PythonicToolParser,
    }

    @classmethod
    def names(cls) -> list[str]:
        return sorted(cls._parsers)

    @classmethod
    def get_tool_parser(cls, name: str) -> type[ToolParser]:
        if name not in cls._parsers:
            raise ValueError(f"--tool-call-parser {name!r} is not known; choose one of "
                             f"{', '.join(cls.names())}.")
        return cls._parsers[name]


__all__ = ["ExtractedToolCallInformation", "PartialCall", "ToolCallStreamer", "ToolParser",
           "ToolParserManager", "DeepSeekV3ToolParser", "Hermes2ProToolParser",
           "Llama3JsonToolParser", "MistralToolParser", "PythonicToolParser"]
