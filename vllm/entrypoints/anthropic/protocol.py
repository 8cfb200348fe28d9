"""The Anthropic Messages API's request and response shapes (`POST /v1/messages`).

Field names and values are Anthropic's (docs.anthropic.com, "Messages"): a request
has `model`, `max_tokens`, `messages` of `user` / `assistant` turns whose content is a
string or a list of blocks (text, image, tool_use, tool_result, thinking), a `system`
prompt, `tools` with an `input_schema`, `tool_choice` (auto / any / tool / none),
`stop_sequences`, sampling knobs (the current SDK sends `temperature` / `top_p` /
`top_k` only through extra_body; the API still takes them), `thinking`, `output_config`
(a JSON schema for the answer) and `stream`. Unknown fields are refused (400), as an
accepted field must do what it says.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import Annotated


class AnthropicModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Block(BaseModel):
    """A content block. Extra keys are ignored here (not refused as at the top level):
    clients send back the blocks of earlier answers, and the SDK's response types carry
    fields of Anthropic's own features (`caller`, `citations`, ...) that say nothing
    about the conversation's content."""
    model_config = ConfigDict(extra="ignore")


class TextBlock(Block):
    type: Literal["text"]
    text: str
    cache_control: Optional[dict[str, Any]] = None
    """Prompt-caching hint; this server caches prefixes on its own (accepted, no-op)."""
    citations: Optional[list[Any]] = None


class ImageSource(Block):
    type: Literal["base64", "url"]
    media_type: Optional[str] = None
    data: Optional[str] = None
    url: Optional[str] = None


class ImageBlock(Block):
    type: Literal["image"]
    source: ImageSource
    cache_control: Optional[dict[str, Any]] = None


class ToolUseBlock(Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: Optional[dict[str, Any]] = None


class ToolResultBlock(Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: Optional[Union[str, list[Annotated[Union[TextBlock, ImageBlock],
                                                Field(discriminator="type")]]]] = None
    is_error: Optional[bool] = None
    cache_control: Optional[dict[str, Any]] = None


class ThinkingBlock(Block):
    type: Literal["thinking"]
    thinking: str
    signature: Optional[str] = None


class RedactedThinkingBlock(Block):
    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[Union[TextBlock, ImageBlock, ToolUseBlock, ToolResultBlock,
                               ThinkingBlock, RedactedThinkingBlock],
                         Field(discriminator="type")]


class Message(AnthropicModel):
    role: Literal["user", "assistant"]
    content: Union[str, list[ContentBlock]]


class Tool(AnthropicModel):
    name: str = Field(min_length=1, max_length=128)
    description: Optional[str] = None
    input_schema: dict[str, Any]
    type: Optional[Literal["custom"]] = None
    cache_control: Optional[dict[str, Any]] = None


class ToolChoice(AnthropicModel):
    type: Literal["auto", "any", "tool", "none"]
    name: Optional[str] = None
    disable_parallel_tool_use: Optional[bool] = None


class Thinking(AnthropicModel):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: Optional[int] = Field(default=None, ge=1)
    display: Optional[Literal["summarized", "omitted"]] = None
    """"omitted": the thinking is left out of the answer (no thinking blocks)."""


class OutputFormat(AnthropicModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(AnthropicModel):
    format: Optional[OutputFormat] = None
    """The answer as JSON of this schema (structured outputs)."""
    effort: Optional[str] = None


class Metadata(AnthropicModel):
    user_id: Optional[str] = None
    """An opaque id of the end user (abuse tracking at Anthropic); logged nowhere here."""


class MessagesRequest(AnthropicModel):
    model: str
    max_tokens: int = Field(ge=1)
    messages: list[Message]
    system: Optional[Union[str, list[TextBlock]]] = None
    metadata: Optional[Metadata] = None
    stop_sequences: Optional[list[str]] = None
    stream: bool = False
    temperature: Optional[float] = Field(default=None, ge=0.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(default=None, ge=0)
    tools: Optional[list[Tool]] = None
    tool_choice: Optional[ToolChoice] = None
    thinking: Optional[Thinking] = None
    output_config: Optional[OutputConfig] = None
    cache_control: Optional[dict[str, Any]] = None
    """Prompt-caching hint; this server caches prefixes on its own (accepted, no-op)."""


class CountTokensRequest(AnthropicModel):
    """`POST /v1/messages/count_tokens`: a Messages request without max_tokens."""
    model: str
    messages: list[Message]
    system: Optional[Union[str, list[TextBlock]]] = None
    tools: Optional[list[Tool]] = None
    tool_choice: Optional[ToolChoice] = None
    thinking: Optional[Thinking] = None
    output_config: Optional[OutputConfig] = None
    cache_control: Optional[dict[str, Any]] = None


STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                "abort": "end_turn"}
"""OpenAI finish_reason -> Anthropic stop_reason (a matched stop sequence is
"stop_sequence", decided from the chat choice's stop_reason)."""

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 503: "overloaded_error",
               529: "overloaded_error"}


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error shape: {"type": "error", "error": {"type", "message"}}."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}
