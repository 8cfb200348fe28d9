"""Reasoning parsers: split a model's `<think>...</think>` part from its answer.

The server uses them to fill the response field `reasoning` (streamed as reasoning
deltas); the engine uses them to know when the reasoning part has ended, because
structured outputs constrain only the answer after it.
"""
from __future__ import annotations

from typing import Any, Optional, Union

from vllm.reasoning.abs_reasoning_parser import ReasoningParser, ReasoningStreamer
from vllm.reasoning.deepseek_r1_reasoning_parser import DeepSeekR1ReasoningParser
from vllm.reasoning.deepseek_v3_reasoning_parser import DeepSeekV3ReasoningParser
from vllm.reasoning.ernie45_reasoning_parser import Ernie45ReasoningParser
from vllm.reasoning.glm4_moe_reasoning_parser import Glm4MoeModelReasoningParser
from vllm.reasoning.gptoss_reasoning_parser import GptOssReasoningParser
from vllm.reasoning.granite_reasoning_parser import GraniteReasoningParser
from vllm.reasoning.hunyuan_a13b_reasoning_parser import HunyuanA13BReasoningParser
from vllm.reasoning.kimi_k2_reasoning_parser import KimiK2ReasoningParser
from vllm.reasoning.minimax_m2_reasoning_parser import MiniMaxM2ReasoningParser
from vllm.reasoning.mistral_reasoning_parser import MistralReasoningParser
from vllm.reasoning.olmo3_reasoning_parser import Olmo3ReasoningParser
from vllm.reasoning.qwen3_reasoning_parser import Qwen3ReasoningParser
from vllm.reasoning.seed_oss_reasoning_parser import SeedOSSReasoningParser
from vllm.reasoning.step3_reasoning_parser import Step3ReasoningParser


class ReasoningParserManager:
    """Parsers by their `--reasoning-parser` name (vLLM's names)."""

    _parsers: dict[str, type[ReasoningParser]] = {
        "deepseek_r1": DeepSeekR1ReasoningParser,
        "deepseek_v3": DeepSeekV3ReasoningParser,
        "ernie45": Ernie45ReasoningParser,
        "glm45": Glm4MoeModelReasoningParser,
        "granite": GraniteReasoningParser,
        "hunyuan_a13b": HunyuanA13BReasoningParser,
        "kimi_k2": KimiK2ReasoningParser,
        "minimax_m2": MiniMaxM2ReasoningParser,
        "mistral": MistralReasoningParser,
        "olmo3": Olmo3ReasoningParser,
        "openai_gptoss": GptOssReasoningParser,
        "qwen3": Qwen3ReasoningParser,
        "seed_oss": SeedOSSReasoningParser,
        "step3": Step3ReasoningParser,
    }

    @classmethod
    def names(cls) -> list[str]:
        return sorted(cls._parsers)

    @classmethod
    def list_registered(cls) -> list[str]:
        """vLLM's name for `names()`."""
        return cls.names()

    @classmethod
    def check_name(cls, name: str) -> None:
        if name not in cls._parsers:
            raise ValueError(f"reasoning_parser={name!r} is not known; choose one of "
                             f"{', '.join(cls.names())} (or register it with "
                             "--reasoning-parser-plugin).")

    @classmethod
    def get_reasoning_parser(cls, name: str) -> type[ReasoningParser]:
        cls.check_name(name)
        return cls._parsers[name]

    @classmethod
    def register_module(cls, name: Union[str, list[str], None] = None, force: bool = True,
                        module: Optional[type] = None) -> Any:
        """Register a parser class under `name`; a decorator as in vLLM."""
        def register(parser_cls: type) -> type:
            names = [name] if isinstance(name, str) else (name or [parser_cls.__name__])
            for n in names:
                if not force and n in cls._parsers:
                    raise KeyError(f"reasoning parser {n!r} is already registered")
                cls._parsers[n] = parser_cls
            return parser_cls
        return register(module) if module is not None else register

    @classmethod
    def import_reasoning_parser(cls, plugin_path: str) -> None:
        """Run a user's parser file (`--reasoning-parser-plugin`); its decorators register."""
        from vllm.utils.plugin_files import import_file
        import_file(plugin_path, "--reasoning-parser-plugin")


__all__ = ["ReasoningParser", "ReasoningParserManager", "ReasoningStreamer",
           *(c.__name__ for c in ReasoningParserManager._parsers.values())]
