"""Request and response bodies of the OpenAI-compatible server (pydantic models).

Field names and defaults follow OpenAI's API plus vLLM's extras. Requests accept unknown
fields (logged and ignored, as vLLM does), but a field that vLLM defines and this server
does not implement is refused with a 400 naming it (`NOT_IMPLEMENTED_FIELDS`, the one list
to shrink as features land) unless it carries vLLM's default, which changes nothing: a
client that asks for something this server cannot do must not silently get something
else.
"""
from __future__ import annotations

import dataclasses
import logging
import time
import typing
import uuid
from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, create_model, model_serializer,
                      field_validator, model_validator)

from vllm.entrypoints.openai.request_metadata import metadata_problem
from vllm.sampling_params import StructuredOutputsParams

logger = logging.getLogger(__name__)

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_N = 128
"""Most completions one request may ask for (n): each one is a sequence in the batch."""


def random_uuid() -> str:
    return uuid.uuid4().hex


class OpenAIBaseModel(BaseModel):
    """Base of request bodies: unknown fields are kept aside, logged and ignored."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    @model_validator(mode="after")
    def _warn_unknown_fields(self) -> "OpenAIBaseModel":
        extra = self.model_extra
        if extra:
            logger.warning("The following fields were present in the request but ignored: %s",
                           sorted(extra))
        return self


class ResponseModel(BaseModel):
    """Base of response bodies: strict, every field serialized (None as null)."""

    model_config = ConfigDict(extra="forbid")


# ------------------------------------------------------------------ errors
class ErrorInfo(ResponseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: int


class ErrorResponse(ResponseModel):
    error: ErrorInfo


# ------------------------------------------------------------------ shared
class StreamOptions(OpenAIBaseModel):
    include_usage: Optional[bool] = False
    continuous_usage_stats: Optional[bool] = False


class JsonSchemaResponseFormat(OpenAIBaseModel):
    """OpenAI's response_format.json_schema: {name, description, schema, strict}."""
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, populate_by_name=True)
    name: Optional[str] = None
    description: Optional[str] = None
    json_schema: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(OpenAIBaseModel):
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: Optional[JsonSchemaResponseFormat] = None


class _StructuredOutputsBase(OpenAIBaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, populate_by_name=True)


def _request_model_of(cls: type, name: str, doc: str) -> type[OpenAIBaseModel]:
    """A request-body model with the init fields of dataclass `cls`: the dataclass stays
    the one definition of the fields, their types and defaults. A field whose name is a
    pydantic BaseModel attribute (`json`) gets a `_schema` suffix and its name as alias."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if hasattr(BaseModel, f.name):
            fields[f"{f.name}_schema"] = (hints[f.name], Field(default=f.default,
                                                                alias=f.name))
        else:
            fields[f.name] = (hints[f.name], f.default)
    model = create_model(name, __base__=_StructuredOutputsBase, __doc__=doc, **fields)
    model.__module__ = __name__
    return model


StructuredOutputsRequest = _request_model_of(
    StructuredOutputsParams, "StructuredOutputsRequest",
    "vLLM's request field `structured_outputs`: the fields of StructuredOutputsParams.")


class PromptTokensDetails(ResponseModel):
    cached_tokens: int = 0


class UsageInfo(ResponseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: Optional[int] = 0
    prompt_tokens_details: Optional[PromptTokensDetails] = None


Int64 = Field(default=None, ge=INT64_MIN, le=INT64_MAX)

_UNSET = object()

NOT_IMPLEMENTED_FIELDS: dict[str, tuple[Any, str]] = {
    # request field: (vLLM's default, which is accepted as a no-op; what is missing)
    "guided_decoding_backend": (None, "choosing a structured-output backend per request "
                                      "(the server's --structured-outputs-config backend "
                                      "serves every request)"),
    "guided_whitespace_pattern": (None, "guided decoding (structured output)"),
    "logits_processors": (None, "custom logits processors"),
    "logprob_token_ids": (None, "logprobs of chosen token ids"),
    "thinking_token_budget": (None, "a thinking token budget (chat completions only)"),
    "media_io_kwargs": (None, "multimodal inputs"),
    "mm_processor_kwargs": (None, "multimodal inputs"),
    "prompt_embeds": (None, "prompt_embeds"),
    "documents": (None, "documents (RAG templates)"),
    "functions": (None, "function calling"),
    "audio": (None, "audio output"),
    "prediction": (None, "predicted outputs"),
    "repetition_detection": (None, "repetition detection"),
    "session_id": (None, "sessions (session_id)"),
    "watermarking": (None, "watermarking"),
    "mm_payload": ("tensors", "multimodal render payloads (mm_payload)"),
    "return_mm_kwargs": (None, "multimodal render payloads (return_mm_kwargs)"),
    "ec_transfer_params": (None, "encoder-cache transfer (ec_transfer_params)"),
    "routed_experts_prompt_start": (0, "routed-expert data (routed_experts_prompt_start)"),
    "return_token_offsets": (False, "token offsets (vLLM returns them only from its render "
                                    "endpoints, which this server does not have)"),
}
"""vLLM request fields this server does not implement, refused when set to anything but
vLLM's default. Remove a field's entry when it is implemented."""


class SamplingFields(OpenAIBaseModel):
    """Sampling knobs shared by completions and chat (OpenAI's plus vLLM's extras)."""

    model: Optional[str] = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    best_of: Optional[int] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    seed: Optional[int] = Int64
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logit_bias: Optional[dict[str, float]] = None
    allowed_token_ids: Optional[list[int]] = None
    prompt_logprobs: Optional[int] = None
    truncate_prompt_tokens: Optional[int] = Field(default=None, ge=-1)
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None
    response_format: Optional[ResponseFormat] = None
    request_id: Optional[str] = None
    priority: int = 0
    return_tokens_as_token_ids: Optional[bool] = None
    return_token_ids: Optional[bool] = None
    """Add prompt_token_ids and each choice's token_ids to the response (vLLM)."""
    stream_interval: Optional[int] = Field(default=None, ge=1)
    """Tokens batched into each streamed chunk (first and last chunks go at once);
    ignored without stream."""
    truncation_side: Optional[Literal["left", "right"]] = None
    """With truncate_prompt_tokens: 'left' (default) drops the prompt's first tokens,
    'right' its last ones."""
    # Structured outputs: vLLM's field, and its older guided_* names.
    structured_outputs: Optional[StructuredOutputsRequest] = None
    guided_json: Optional[Union[str, dict[str, Any]]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    # vLLM extras this server knows but does not implement (refused when set).
    use_beam_search: bool = False
    length_penalty: float = 1.0
    logits_processors: Optional[Any] = None
    bad_words: Optional[list[str]] = None
    """Words the completion must not contain (vLLM's field; see SamplingParams)."""
    cache_salt: Optional[str] = None
    """Prefix-cache isolation: only requests with the same salt share cached blocks."""
    vllm_xargs: Optional[dict[str, Any]] = None
    """Extra request arguments for custom extensions (SamplingParams.extra_args: what
    custom logits processors read per request), as vLLM."""
    kv_transfer_params: Optional[dict[str, Any]] = None
    """Prefill/decode disaggregation (needs --kv-transfer-config): {"do_remote_decode":
    true} on a prefill instance; on a decode instance, the prefill response's
    kv_transfer_params."""

    _beam_search_route: ClassVar[bool] = False
    _implemented_fields: ClassVar[frozenset[str]] = frozenset()
    """NOT_IMPLEMENTED_FIELDS entries this request type does implement."""
    """Whether this route serves `use_beam_search` (completions do)."""

    def _beam_search_conflict(self) -> Optional[tuple[str, str]]:
        """Fields beam search would not honour (it ranks raw logprobs of whole beams)."""
        for name in ("logprobs", "prompt_logprobs", "stop", "stop_token_ids", "logit_bias",
                     "allowed_token_ids", "seed", "top_p", "top_k", "min_p",
                     "presence_penalty", "frequency_penalty", "repetition_penalty"):
            if getattr(self, name, None) not in (None, [], ""):
                return (name, f"{name} cannot be combined with use_beam_search.")
        if self.min_tokens:
            return ("min_tokens", "min_tokens cannot be combined with use_beam_search.")
        return None

    def unsupported_fields(self) -> Optional[tuple[str, str]]:
        """(field, reason) of the first field asking for something not implemented."""
        if self.use_beam_search and not self._beam_search_route:
            return ("use_beam_search", "Beam search is only supported on /v1/completions.")
        if self.use_beam_search:
            refused = self._beam_search_conflict()
            if refused is not None:
                return refused
        elif self.length_penalty != 1.0:
            return ("length_penalty", "length_penalty only applies with use_beam_search=true.")
        if self.best_of is not None and self.best_of != self.n:
            return ("best_of", f"best_of={self.best_of} different from n={self.n} is not "
                    "supported.")
        if self.stream_options is not None and not self.stream:
            return ("stream_options", "Stream options can only be defined when `stream=True`.")
        return self._not_implemented_field()

    def _not_implemented_field(self) -> Optional[tuple[str, str]]:
        """The first NOT_IMPLEMENTED_FIELDS entry set to something but vLLM's default."""
        extra = self.model_extra or {}
        for name, (default, what) in NOT_IMPLEMENTED_FIELDS.items():
            if name in self._implemented_fields:
                continue
            value = extra.get(name, getattr(self, name, _UNSET))
            if value is _UNSET or value is None or value in ([], {}, ""):
                continue  # not given, or empty: asks for nothing
            if value != default:
                return (name, f"{name}: {what} is not supported by this server.")
        return None

    @model_validator(mode="after")
    def _warn_unknown_fields(self) -> "SamplingFields":
        # vLLM's own fields are refused by unsupported_fields(), not ignored: only the rest
        # is reported as ignored.
        ignored = sorted(set(self.model_extra or {}) - set(NOT_IMPLEMENTED_FIELDS))
        if ignored:
            logger.warning("The following fields were present in the request but ignored: %s",
                           ignored)
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.include_usage and self.stream_options.continuous_usage_stats)


# ------------------------------------------------------------- completions
class CompletionRequest(SamplingFields):
    # OpenAI: https://platform.openai.com/docs/api-reference/completions/create
    _beam_search_route: ClassVar[bool] = True
    prompt: Union[list[int], list[list[int]], str, list[str]]
    echo: Optional[bool] = False
    logprobs: Optional[int] = Field(default=None, ge=0)
    max_tokens: Optional[int] = 16
    suffix: Optional[str] = None
    add_special_tokens: bool = True

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _null_max_tokens_is_the_default(cls, value: Any) -> Any:
        """An explicit null means the default 16 (as in vLLM), not "fill the context"."""
        return 16 if value is None else value

    def unsupported_fields(self) -> Optional[tuple[str, str]]:
        if self.suffix:
            return ("suffix", "suffix (fill-in-the-middle) is not supported.")
        return super().unsupported_fields()


class CompletionLogProbs(ResponseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)


class CompletionResponseChoice(ResponseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None
    prompt_logprobs: Optional[list[Optional[dict[int, "Logprob"]]]] = None
    prompt_token_ids: Optional[list[int]] = None
    token_ids: Optional[list[int]] = None


class Logprob(ResponseModel):
    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


class CompletionResponse(ResponseModel):
    id: str = Field(default_factory=lambda: f"cmpl-{random_uuid()}")
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo
    system_fingerprint: Optional[str] = None
    kv_transfer_params: Optional[dict[str, Any]] = None
    """Where another instance finds this request's KV (a prefill instance's answer)."""


class CompletionResponseStreamChoice(ResponseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None
    prompt_token_ids: Optional[list[int]] = None
    """With return_token_ids: the prompt's ids, in the choice's first chunk only."""
    token_ids: Optional[list[int]] = None
    """With return_token_ids: the ids this chunk's text came from."""


class CompletionStreamResponse(ResponseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionResponseStreamChoice]
    usage: Optional[UsageInfo] = None
    system_fingerprint: Optional[str] = None
    """On the stream's last chunk (the usage chunk, else each finishing chunk), as vLLM."""


# -------------------------------------------------------------------- chat
class ImageURL(OpenAIBaseModel):
    url: str
    detail: Optional[str] = None


class ChatContentPart(OpenAIBaseModel):
    type: str
    text: Optional[str] = None
    image_url: Optional[ImageURL] = None


class ChatMessage(OpenAIBaseModel):
    """One message; extra keys (tool_calls, tool_call_id, ...) are passed to the template."""
    role: str
    content: Optional[Union[str, list[ChatContentPart]]] = None
    name: Optional[str] = None

    @model_validator(mode="after")
    def _warn_unknown_fields(self) -> "ChatMessage":
        return self  # message extras are legitimate template inputs, not ignored fields


class FunctionDefinition(OpenAIBaseModel):
    name: str = Field(min_length=1, max_length=256)
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    """The JSON schema of the arguments."""
    strict: Optional[bool] = None


class ChatCompletionToolsParam(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatCompletionNamedFunction(OpenAIBaseModel):
    name: str


class ChatCompletionNamedToolChoiceParam(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: ChatCompletionNamedFunction


class ChatCompletionRequest(SamplingFields):
    # OpenAI: https://platform.openai.com/docs/api-reference/chat/create
    messages: list[ChatMessage]
    return_prompt_text: Optional[bool] = None
    """Include `prompt_text`, the chat template's output, in the response (streaming:
    in the first chunk)."""
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = Field(default=0, ge=0)
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    tools: Optional[list[ChatCompletionToolsParam]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"],
                                ChatCompletionNamedToolChoiceParam]] = None
    """Unset: "auto" when tools are given, else "none" (OpenAI's default)."""
    parallel_tool_calls: Optional[bool] = True
    functions: Optional[list[Any]] = None
    function_call: Optional[Any] = None
    audio: Optional[Any] = None
    modalities: Optional[list[str]] = None
    prediction: Optional[Any] = None
    metadata: Optional[dict[str, Any]] = None
    """Accepted (within OpenAI's limits, request_metadata.py) and otherwise ignored."""
    # vLLM extras
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: Optional[list[dict[str, str]]] = None
    chat_template: Optional[str] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    mm_processor_kwargs: Optional[Any] = None
    reasoning_effort: Optional[Literal["none", "minimal", "low", "medium", "high"]] = None
    """Passed to the chat template as `reasoning_effort` (templates that read it, such as
    GPT-OSS's, set the model's effort); an explicit chat_template_kwargs entry wins."""
    include_reasoning: bool = True
    """False: the reasoning (with --reasoning-parser) is kept out of the answer and dropped."""
    thinking_token_budget: Optional[int] = Field(default=None, ge=0)
    """Reasoning tokens after which the end of the reasoning is forced (needs a
    --reasoning-parser whose reasoning ends with a known token sequence)."""
    _implemented_fields: ClassVar[frozenset[str]] = frozenset({"thinking_token_budget"})

    def unsupported_fields(self) -> Optional[tuple[str, str]]:
        bad_metadata = metadata_problem(self.metadata)
        if bad_metadata is not None:
            return ("metadata", bad_metadata)
        if self.function_call not in (None, "none"):
            return ("function_call", "Function calling is not supported.")
        if self.modalities and any(m != "text" for m in self.modalities):
            return ("modalities", "Only the 'text' modality is supported.")
        if self.add_generation_prompt and self.continue_final_message:
            return ("continue_final_message", "continue_final_message and "
                    "add_generation_prompt cannot both be true.")
        if self.top_logprobs and not self.logprobs:
            return ("top_logprobs", "When using `top_logprobs`, `logprobs` must be set to "
                    "true.")
        return super().unsupported_fields()

    @property
    def effective_tool_choice(self) -> Union[str, ChatCompletionNamedToolChoiceParam]:
        if self.tool_choice is None:
            return "auto" if self.tools else "none"
        return self.tool_choice

    @property
    def requested_max_tokens(self) -> Optional[int]:
        """max_completion_tokens (OpenAI's current name) wins over deprecated max_tokens."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


class ChatCompletionLogProb(ResponseModel):
    token: str
    logprob: float = -9999.0
    bytes: Optional[list[int]] = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(ResponseModel):
    content: Optional[list[ChatCompletionLogProbsContent]] = None


class FunctionCall(ResponseModel):
    name: str
    arguments: str
    """The arguments as JSON text (OpenAI's format: a string, not an object)."""


class ToolCall(ResponseModel):
    id: str = Field(default_factory=lambda: f"chatcmpl-tool-{random_uuid()}")
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(ResponseModel):
    name: Optional[str] = None
    arguments: Optional[str] = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class DeltaToolCall(ResponseModel):
    """A streamed piece of tool call `index`: id, type and name come in its first piece,
    then `arguments` fragments whose concatenation is the arguments' JSON text."""
    index: int
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None
    function: Optional[DeltaFunctionCall] = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatResponseMessage(ResponseModel):
    role: str
    content: Optional[str] = None
    reasoning: Optional[str] = None
    """The model's reasoning (with --reasoning-parser), apart from the answer."""
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatCompletionResponseChoice(ResponseModel):
    index: int
    message: ChatResponseMessage
    logprobs: Optional[ChatCompletionLogProbs] = None
    finish_reason: Optional[str] = "stop"
    stop_reason: Optional[Union[int, str]] = None
    token_ids: Optional[list[int]] = None


class ChatCompletionResponse(ResponseModel):
    id: str = Field(default_factory=lambda: f"chatcmpl-{random_uuid()}")
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    system_fingerprint: Optional[str] = None
    prompt_logprobs: Optional[list[Optional[dict[int, Logprob]]]] = None
    prompt_token_ids: Optional[list[int]] = None
    prompt_text: Optional[str] = None
    """With return_prompt_text: the rendered prompt."""
    kv_transfer_params: Optional[dict[str, Any]] = None
    """Where another instance finds this request's KV (a prefill instance's answer)."""


class DeltaMessage(ResponseModel):
    """A streamed message delta; unset parts are omitted (OpenAI sends {} at the end)."""
    role: Optional[str] = None
    content: Optional[str] = None
    reasoning: Optional[str] = None
    tool_calls: Optional[list[DeltaToolCall]] = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatCompletionResponseStreamChoice(ResponseModel):
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChatCompletionLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None
    token_ids: Optional[list[int]] = None


class ChatCompletionStreamResponse(ResponseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: Optional[UsageInfo] = None
    system_fingerprint: Optional[str] = None
    """On the stream's last chunk (the usage chunk, else each finishing chunk), as vLLM."""
    prompt_token_ids: Optional[list[int]] = None
    """With return_token_ids: the prompt's ids, in the first chunk only."""
    prompt_text: Optional[str] = None
    """With return_prompt_text: the rendered prompt, in the first chunk only."""


# ------------------------------------------------------------------ models
class ModelPermission(ResponseModel):
    id: str = Field(default_factory=lambda: f"modelperm-{random_uuid()}")
    object: str = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: Optional[str] = None
    is_blocking: bool = False


class ModelCard(ResponseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "vllm"
    root: Optional[str] = None
    parent: Optional[str] = None
    max_model_len: Optional[int] = None
    permission: list[ModelPermission] = Field(default_factory=list)


class ModelList(ResponseModel):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


# ------------------------------------------------------------ tokenization
class TokenizeCompletionRequest(OpenAIBaseModel):
    model: Optional[str] = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: Optional[bool] = False


class TokenizeChatRequest(OpenAIBaseModel):
    model: Optional[str] = None
    messages: list[ChatMessage]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: Optional[bool] = False
    chat_template: Optional[str] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    tools: Optional[list[ChatCompletionToolsParam]] = None

    def unsupported_fields(self) -> Optional[tuple[str, str]]:
        if self.add_generation_prompt and self.continue_final_message:
            return ("continue_final_message", "continue_final_message and "
                    "add_generation_prompt cannot both be true.")
        return None


TokenizeRequest = Union[TokenizeCompletionRequest, TokenizeChatRequest]


class TokenizeResponse(ResponseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: Optional[list[str]] = None


class DetokenizeRequest(OpenAIBaseModel):
    model: Optional[str] = None
    tokens: list[int]


class DetokenizeResponse(ResponseModel):
    prompt: str


class VersionResponse(ResponseModel):
    version: str


# -------------------------------------------------------------- LoRA adapters
class LoadLoRAAdapterRequest(OpenAIBaseModel):
    lora_name: str
    lora_path: str
    load_inplace: bool = False
    """Reload a loaded adapter's weights (from lora_path) under its name and id."""


class UnloadLoRAAdapterRequest(OpenAIBaseModel):
    lora_name: str
    lora_int_id: Optional[int] = Field(default=None)


CompletionResponseChoice.model_rebuild()
