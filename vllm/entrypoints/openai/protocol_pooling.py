"""Request and response bodies of the pooling APIs, in vLLM 0.32's shapes:
`/v1/embeddings` (OpenAI), `/pooling`, `/classify`, `/score` + `/v1/score`, and
`/rerank` + `/v1/rerank` + `/v2/rerank` (Jina / Cohere)."""
from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Optional, Union

from pydantic import Field

from vllm.entrypoints.openai.protocol import OpenAIBaseModel, ResponseModel, UsageInfo

PromptInput = Union[str, list[str], list[int], list[list[int]]]
ScoreInput = Union[str, list[str]]


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class PoolingBasicFields(OpenAIBaseModel):
    """What every pooling request has (vLLM's PoolingBasicRequestMixin)."""
    model: Optional[str] = None
    user: Optional[str] = None
    truncate_prompt_tokens: Optional[int] = Field(default=None, ge=-1)
    truncation_side: Optional[Literal["left", "right"]] = None
    request_id: Optional[str] = None
    priority: int = 0
    add_special_tokens: bool = True


class EncodingFields(OpenAIBaseModel):
    encoding_format: Literal["float", "base64"] = "float"
    """float: JSON numbers; base64: the vector's bytes (embed_dtype, endianness) in base64,
    what the official openai client asks for by default."""
    embed_dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    endianness: Literal["native", "big", "little"] = "native"


class ChatInputFields(OpenAIBaseModel):
    """The chat form of a pooling request (vLLM's EmbeddingChatRequest): `messages`
    rendered with the chat template instead of `input`."""
    messages: Optional[list[dict[str, Any]]] = None
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template: Optional[str] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None

    def chat_body(self) -> Optional[dict[str, Any]]:
        """The chat request whose prompt this one embeds (None: the completion form).
        A list of messages given as `input` counts as `messages`, as in vLLM."""
        messages = self.messages
        raw = getattr(self, "input", None)
        if messages is None and isinstance(raw, list) and raw and all(
                isinstance(m, dict) and "role" in m for m in raw):
            messages = raw
        if messages is None:
            return None
        return {"messages": messages, "add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message,
                "chat_template": self.chat_template,
                "chat_template_kwargs": self.chat_template_kwargs}


class EmbeddingRequest(PoolingBasicFields, EncodingFields, ChatInputFields):
    input: Optional[Union[PromptInput, list[dict[str, Any]]]] = None
    dimensions: Optional[int] = None
    use_activation: Optional[bool] = None


class PoolingRequest(PoolingBasicFields, EncodingFields):
    input: PromptInput
    task: Optional[Literal["embed", "classify"]] = None
    dimensions: Optional[int] = None
    use_activation: Optional[bool] = None


class ClassificationRequest(PoolingBasicFields):
    input: PromptInput
    use_activation: Optional[bool] = None


class ScoringFields(PoolingBasicFields):
    use_activation: Optional[bool] = None


class ScoreRequest(ScoringFields):
    """text_1 / text_2 (also spelled data_1 / data_2, queries / documents)."""
    text_1: Optional[ScoreInput] = None
    text_2: Optional[ScoreInput] = None
    data_1: Optional[ScoreInput] = None
    data_2: Optional[ScoreInput] = None
    queries: Optional[ScoreInput] = None
    documents: Optional[ScoreInput] = None

    def pair(self) -> tuple[ScoreInput, ScoreInput]:
        for first, second in (("text_1", "text_2"), ("data_1", "data_2"),
                              ("queries", "documents")):
            a, b = getattr(self, first), getattr(self, second)
            if a is not None or b is not None:
                if a is None or b is None:
                    raise ValueError(f"{first} and {second} must both be given.")
                return a, b
        raise ValueError("Give text_1 and text_2 (or data_1 / data_2, queries / documents).")


class RerankRequest(ScoringFields):
    query: str
    documents: list[str]
    top_n: int = Field(default=0, ge=0)
    """0: all documents."""


# ------------------------------------------------------------------ responses
class EmbeddingResponseData(ResponseModel):
    index: int
    object: str = "embedding"
    embedding: Union[list[float], str]


class EmbeddingResponse(ResponseModel):
    id: str = Field(default_factory=lambda: _id("embd"))
    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: Optional[str] = None
    data: list[EmbeddingResponseData]
    usage: UsageInfo


class PoolingResponseData(ResponseModel):
    index: int
    object: str = "pooling"
    data: Union[list[float], str]


class PoolingResponse(ResponseModel):
    id: str = Field(default_factory=lambda: _id("pool"))
    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[PoolingResponseData]
    usage: UsageInfo


class ClassificationData(ResponseModel):
    index: int
    label: Optional[str]
    probs: list[float]
    num_classes: int


class ClassificationResponse(ResponseModel):
    id: str = Field(default_factory=lambda: _id("classify"))
    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ClassificationData]
    usage: UsageInfo


class ScoreResponseData(ResponseModel):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(ResponseModel):
    id: str = Field(default_factory=lambda: _id("score"))
    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ScoreResponseData]
    usage: UsageInfo


class RerankDocument(ResponseModel):
    text: Optional[str] = None


class RerankResult(ResponseModel):
    index: int
    document: RerankDocument
    relevance_score: float


class RerankUsage(ResponseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(ResponseModel):
    id: str = Field(default_factory=lambda: _id("rerank"))
    model: str
    usage: RerankUsage
    results: list[RerankResult]
