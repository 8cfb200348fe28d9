"""What pooling returns, as vLLM names it: `PoolingRequestOutput` (the pooled tensor)
and its typed views, `EmbeddingRequestOutput` (LLM.embed), `ClassificationRequestOutput`
(LLM.classify) and `ScoringRequestOutput` (LLM.score). Re-exported by vllm.outputs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

import torch


@dataclass
class PoolingOutput:
    """The pooled vector of one prompt."""
    data: torch.Tensor

    def __eq__(self, other: object) -> bool:
        return isinstance(other, self.__class__) and bool((self.data == other.data).all())


_O = TypeVar("_O")


class PoolingRequestOutput(Generic[_O]):
    """One pooling request's result: `outputs` (a PoolingOutput, or a typed view's)."""

    def __init__(self, request_id: str, outputs: _O, prompt_token_ids: list[int],
                 num_cached_tokens: int, finished: bool) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.num_cached_tokens = num_cached_tokens
        self.finished = finished
        self.outputs = outputs

    def _from(self, outputs) -> dict:
        return dict(request_id=self.request_id, outputs=outputs,
                    prompt_token_ids=self.prompt_token_ids,
                    num_cached_tokens=self.num_cached_tokens, finished=self.finished)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(request_id={self.request_id!r}, "
                f"outputs={self.outputs!r}, prompt_token_ids={self.prompt_token_ids}, "
                f"num_cached_tokens={self.num_cached_tokens}, finished={self.finished})")


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @staticmethod
    def from_base(pooling_output: PoolingOutput) -> "EmbeddingOutput":
        data = pooling_output.data
        if data.ndim != 1:
            raise ValueError("pooled_data should be a 1-D embedding vector")
        return EmbeddingOutput(data.tolist())

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


class EmbeddingRequestOutput(PoolingRequestOutput[EmbeddingOutput]):

    @staticmethod
    def from_base(request_output: PoolingRequestOutput) -> "EmbeddingRequestOutput":
        return EmbeddingRequestOutput(**request_output._from(
            EmbeddingOutput.from_base(request_output.outputs)))


@dataclass
class ClassificationOutput:
    probs: list[float]

    @staticmethod
    def from_base(pooling_output: PoolingOutput) -> "ClassificationOutput":
        data = pooling_output.data
        if data.ndim != 1:
            raise ValueError("pooled_data should be a 1-D probability vector")
        return ClassificationOutput(data.tolist())

    @property
    def num_classes(self) -> int:
        return len(self.probs)


class ClassificationRequestOutput(PoolingRequestOutput[ClassificationOutput]):

    @staticmethod
    def from_base(request_output: PoolingRequestOutput) -> "ClassificationRequestOutput":
        return ClassificationRequestOutput(**request_output._from(
            ClassificationOutput.from_base(request_output.outputs)))


@dataclass
class ScoringOutput:
    score: float

    @staticmethod
    def from_base(pooling_output: PoolingOutput) -> "ScoringOutput":
        data = pooling_output.data.squeeze()
        if data.ndim != 0:
            raise ValueError("pooled_data should be a scalar score")
        return ScoringOutput(data.item())


class ScoringRequestOutput(PoolingRequestOutput[ScoringOutput]):

    @staticmethod
    def from_base(request_output: PoolingRequestOutput) -> "ScoringRequestOutput":
        return ScoringRequestOutput(**request_output._from(
            ScoringOutput.from_base(request_output.outputs)))
