"""Reasoning parsers: split a model's `<think>...</think>` part from its answer.

The server uses them to fill the response field `reasoning` (streamed as reasoning
deltas); the engine uses them to know when the reasoning part has ended, because
structured outputs constrain only the answer after it.
"""
from __future__ import annotations

from vllm.reasoning.abs_reasoning_parser import ReasoningParser, ReasoningStreamer
from vllm.reasoning.deepseek_r1_reasoning_parser import DeepSeekR1ReasoningParser
from vllm.reasoning.qwen3_reasoning_parser import Qwen3ReasoningParser


class ReasoningParserManager:
    """Parsers by their `--reasoning-parser` name."""

    _parsers: dict[str, type[ReasoningParser]] = {
        "deepseek_r1": DeepSeekR1ReasoningParser,
        "qwen3": Qwen3ReasoningParser,
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
                             f"{', '.join(cls.names())}.")

    @classmethod
    def get_reasoning_parser(cls, name: str) -> type[ReasoningParser]:
        cls.check_name(name)
        return cls._parsers[name]


__all__ = ["ReasoningParser", "ReasoningParserManager", "ReasoningStreamer",
           "DeepSeekR1ReasoningParser", "Qwen3ReasoningParser"]
