"""Tool-call parsers by their `--tool-call-parser` name (one file per model format).

The registry maps each name to the module and class that implement it and imports a
parser only when it is asked for: the flag parser needs the names at every server
start, before the engine core is forked, and importing the parsers means importing the
OpenAI request models (pydantic, about 0.4 s on a small CPU) on that path.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:
    from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import ToolParser

_PACKAGE = __name__

_PARSERS: dict[str, tuple[str, str]] = {
    "deepseek_v3": ("deepseek_v3_tool_parser", "DeepSeekV3ToolParser"),
    "deepseek_v31": ("deepseek_v31_tool_parser", "DeepSeekV31ToolParser"),
    "ernie45": ("ernie45_tool_parser", "Ernie45ToolParser"),
    "gigachat3": ("gigachat3_tool_parser", "GigaChat3ToolParser"),
    "glm45": ("glm4_moe_tool_parser", "Glm4MoeModelToolParser"),
    "granite": ("granite_tool_parser", "GraniteToolParser"),
    "granite-20b-fc": ("granite_20b_fc_tool_parser", "Granite20bFCToolParser"),
    "hermes": ("hermes_tool_parser", "Hermes2ProToolParser"),
    "hunyuan_a13b": ("hunyuan_a13b_tool_parser", "HunyuanA13BToolParser"),
    "internlm": ("internlm2_tool_parser", "Internlm2ToolParser"),
    "jamba": ("jamba_tool_parser", "JambaToolParser"),
    "kimi_k2": ("kimi_k2_tool_parser", "KimiK2ToolParser"),
    "llama3_json": ("llama_tool_parser", "Llama3JsonToolParser"),
    "llama4_pythonic": ("llama4_pythonic_tool_parser", "Llama4PythonicToolParser"),
    "longcat": ("longcat_tool_parser", "LongcatFlashToolParser"),
    "minimax_m2": ("minimax_m2_tool_parser", "MinimaxM2ToolParser"),
    "mistral": ("mistral_tool_parser", "MistralToolParser"),
    "openai": ("openai_tool_parser", "OpenAIToolParser"),
    "phi4_mini_json": ("phi4mini_tool_parser", "Phi4MiniJsonToolParser"),
    "pythonic": ("pythonic_tool_parser", "PythonicToolParser"),
    "qwen3_coder": ("qwen3coder_tool_parser", "Qwen3CoderToolParser"),
    "qwen3_xml": ("qwen3xml_tool_parser", "Qwen3XMLToolParser"),
    "seed_oss": ("seed_oss_tool_parser", "SeedOssToolParser"),
    "step3": ("step3_tool_parser", "Step3ToolParser"),
    "xlam": ("xlam_tool_parser", "xLAMToolParser"),
}
"""`--tool-call-parser` name -> (module in this package, class)."""

_ABSTRACT = ("ExtractedToolCallInformation", "PartialCall", "ToolCallStreamer", "ToolParser")


class ToolParserManager:
    """The built-in parsers by name, plus those a user's file registers with
    `@ToolParserManager.register_module("name")` (`--tool-parser-plugin`, as vLLM)."""

    _registered: dict[str, type] = {}

    @classmethod
    def names(cls) -> list[str]:
        return sorted(set(_PARSERS) | set(cls._registered))

    @classmethod
    def list_registered(cls) -> list[str]:
        """vLLM's name for `names()`."""
        return cls.names()

    @classmethod
    def get_tool_parser(cls, name: str) -> type[ToolParser]:
        if name in cls._registered:
            return cls._registered[name]
        if name not in _PARSERS:
            raise ValueError(f"--tool-call-parser {name!r} is not known; choose one of "
                             f"{', '.join(cls.names())}.")
        module, cls_name = _PARSERS[name]
        return getattr(importlib.import_module(f"{_PACKAGE}.{module}"), cls_name)

    @classmethod
    def register_module(cls, name: Union[str, list[str], None] = None, force: bool = True,
                        module: Optional[type] = None) -> Any:
        """Register `module` under `name` (default: the class name); used bare as a
        decorator, `@ToolParserManager.register_module("name")`, as in vLLM."""
        def register(parser_cls: type) -> type:
            names = [name] if isinstance(name, str) else (name or [parser_cls.__name__])
            for n in names:
                if not force and (n in cls._registered or n in _PARSERS):
                    raise KeyError(f"tool parser {n!r} is already registered")
                cls._registered[n] = parser_cls
            return parser_cls
        return register(module) if module is not None else register

    @classmethod
    def import_tool_parser(cls, plugin_path: str) -> None:
        """Run a user's parser file (`--tool-parser-plugin`); its decorators register."""
        from vllm.utils.plugin_files import import_file
        import_file(plugin_path, "--tool-parser-plugin")


def __getattr__(name: str) -> Any:
    """The package's public classes, imported on first use (see the module docstring)."""
    if name in _ABSTRACT:
        return getattr(importlib.import_module(f"{_PACKAGE}.abstract_tool_parser"), name)
    for module, cls_name in _PARSERS.values():
        if cls_name == name:
            return getattr(importlib.import_module(f"{_PACKAGE}.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ToolParserManager", *_ABSTRACT, *(c for _, c in _PARSERS.values())]
