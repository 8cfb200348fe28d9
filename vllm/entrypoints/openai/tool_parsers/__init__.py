"""Tool-call parsers by their `--tool-call-parser` name (one file per model format).

The registry maps each name to the module and class that implement it and imports a
parser only when it is asked for: the flag parser needs the names at every server
start, before the engine core is forked, and importing the parsers means importing the
OpenAI request models (pydantic, about 0.4 s on a small CPU) on that path.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import ToolParser

_PACKAGE = __name__

_PARSERS: dict[str, tuple[str, str]] = {
    "deepseek_v3": ("deepseek_v3_tool_parser", "DeepSeekV3ToolParser"),
    "hermes": ("hermes_tool_parser", "Hermes2ProToolParser"),
    "llama3_json": ("llama_tool_parser", "Llama3JsonToolParser"),
    "mistral": ("mistral_tool_parser", "MistralToolParser"),
    "pythonic": ("pythonic_tool_parser", "PythonicToolParser"),
}
"""`--tool-call-parser` name -> (module in this package, class)."""

_ABSTRACT = ("ExtractedToolCallInformation", "PartialCall", "ToolCallStreamer", "ToolParser")


class ToolParserManager:

    @classmethod
    def names(cls) -> list[str]:
        return sorted(_PARSERS)

    @classmethod
    def list_registered(cls) -> list[str]:
        """vLLM's name for `names()`."""
        return cls.names()

    @classmethod
    def get_tool_parser(cls, name: str) -> type[ToolParser]:
        if name not in _PARSERS:
            raise ValueError(f"--tool-call-parser {name!r} is not known; choose one of "
                             f"{', '.join(cls.names())}.")
        module, cls_name = _PARSERS[name]
        return getattr(importlib.import_module(f"{_PACKAGE}.{module}"), cls_name)


def __getattr__(name: str) -> Any:
    """The package's public classes, imported on first use (see the module docstring)."""
    if name in _ABSTRACT:
        return getattr(importlib.import_module(f"{_PACKAGE}.abstract_tool_parser"), name)
    for module, cls_name in _PARSERS.values():
        if cls_name == name:
            return getattr(importlib.import_module(f"{_PACKAGE}.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ToolParserManager", *_ABSTRACT, *(c for _, c in _PARSERS.values())]
