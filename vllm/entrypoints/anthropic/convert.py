"""Anthropic Messages <-> OpenAI chat completions, the two directions of one request.

The Messages API is served by the chat completions code (templates, tools, reasoning,
structured tool choice, streaming): a request becomes a chat request, and the chat
response (or its stream of chunks) becomes a message (or Anthropic's events).

Mapping: `system` -> a system message; a user turn's `tool_result` blocks -> `tool`
messages (before the turn's other content); an assistant turn's `tool_use` blocks ->
its `tool_calls`; `image` blocks -> image_url parts (a base64 source as a data URL);
`tools[].input_schema` -> the function's `parameters`; tool_choice auto / any / tool /
none -> "auto" / "required" / named / "none"; `stop_sequences` -> `stop`; the chat
message's `reasoning` -> a `thinking` block.
"""
from __future__ import annotations

import json
import uuid
from typing import Any, Optional

from vllm.entrypoints.anthropic.protocol import (STOP_REASONS, ImageBlock, Message,
                                                 MessagesRequest, TextBlock, ToolChoice,
                                                 ToolResultBlock, ToolUseBlock)
from vllm.entrypoints.openai.errors import BadRequestError


def chat_body(request: Any, stream: bool, max_tokens: Optional[int]) -> dict[str, Any]:
    """The chat completions body of a Messages (or count_tokens) request."""
    body: dict[str, Any] = {"model": request.model, "stream": stream,
                            "messages": system_messages(request.system)
                            + [m for msg in request.messages for m in chat_messages(msg)]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if stream:
        body["stream_options"] = {"include_usage": True}
    for name in ("temperature", "top_p", "top_k"):
        value = getattr(request, name, None)
        if value is not None:
            body[name] = value
    if getattr(request, "stop_sequences", None):
        body["stop"] = list(request.stop_sequences)
    if request.tools:
        body["tools"] = [{"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": t.input_schema}}
            for t in request.tools]
    if request.tool_choice is not None:
        body.update(tool_choice(request.tool_choice))
    if request.thinking is not None:
        body["chat_template_kwargs"] = thinking_kwargs(request.thinking)
    if request.output_config is not None:
        body.update(output_config(request.output_config))
    return body


def output_config(config: Any) -> dict[str, Any]:
    """`format` (a JSON schema for the answer) as response_format; an `effort` level
    has nothing to set on this server (no reasoning-effort control yet): refused."""
    if config.effort is not None:
        raise BadRequestError("output_config.effort is not supported by this server.",
                              param="output_config.effort")
    if config.format is None:
        return {}
    return {"response_format": {"type": "json_schema", "json_schema": {
        "name": "output", "schema": config.format.schema_}}}


def system_messages(system: Any) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    return [{"role": "system", "content": "".join(block.text for block in system)}]


def chat_messages(message: Message) -> list[dict[str, Any]]:
    """One Anthropic turn as chat messages (a user turn with tool results is several)."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    if message.role == "assistant":
        return [_assistant_message(message.content)]
    tools = [_tool_message(b) for b in message.content if isinstance(b, ToolResultBlock)]
    parts = [_user_part(b) for b in message.content
             if isinstance(b, (TextBlock, ImageBlock))]
    if any(isinstance(b, ToolUseBlock) for b in message.content):
        raise BadRequestError("messages: tool_use blocks belong to assistant turns.",
                              param="messages")
    return tools + ([{"role": "user", "content": parts}] if parts else [])


def _assistant_message(blocks: list[Any]) -> dict[str, Any]:
    """Text and tool calls; earlier thinking is left out of the history (templates
    drop past reasoning too)."""
    text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
    message: dict[str, Any] = {"role": "assistant", "content": text}
    calls = [{"id": b.id, "type": "function",
              "function": {"name": b.name, "arguments": json.dumps(b.input)}}
             for b in blocks if isinstance(b, ToolUseBlock)]
    if any(isinstance(b, (ImageBlock, ToolResultBlock)) for b in blocks):
        raise BadRequestError("messages: an assistant turn holds text, thinking and "
                              "tool_use blocks only.", param="messages")
    if calls:
        message["tool_calls"] = calls
    return message


def _user_part(block: Any) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    source = block.source
    if source.type == "url":
        if not source.url:
            raise BadRequestError("image.source.url is missing.", param="messages")
        return {"type": "image_url", "image_url": {"url": source.url}}
    if not source.data or not source.media_type:
        raise BadRequestError("an image with a base64 source needs media_type and data.",
                              param="messages")
    return {"type": "image_url",
            "image_url": {"url": f"data:{source.media_type};base64,{source.data}"}}


def _tool_message(block: ToolResultBlock) -> dict[str, Any]:
    content = block.content
    if isinstance(content, list):
        if any(isinstance(part, ImageBlock) for part in content):
            raise BadRequestError("images in a tool_result are not supported; send them "
                                  "as image blocks of the user turn.", param="messages")
        content = "".join(part.text for part in content)
    text = content or ""
    if block.is_error:
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": text}


def tool_choice(choice: ToolChoice) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if choice.type == "tool":
        if not choice.name:
            raise BadRequestError("tool_choice of type 'tool' needs a name.",
                                  param="tool_choice")
        fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        fields["tool_choice"] = {"auto": "auto", "any": "required",
                                 "none": "none"}[choice.type]
    if choice.disable_parallel_tool_use:
        fields["parallel_tool_calls"] = False
    return fields


def thinking_kwargs(thinking: Any) -> dict[str, Any]:
    """`{"type": "disabled"}` turns a reasoning model's thinking off and `adaptive` (the
    model decides) on, through the template's `enable_thinking`; a thinking budget
    (`enabled`, `between_tools`) cannot be held to here, so it is refused."""
    if thinking.type in ("disabled", "adaptive"):
        return {"enable_thinking": thinking.type == "adaptive"}
    raise BadRequestError(f"thinking {{\"type\": \"{thinking.type}\"}} (a thinking budget) "
                          "is not supported by this server: send {\"type\": \"adaptive\"} "
                          "(the model reasons as its template allows; the reasoning comes "
                          "back as thinking blocks with --reasoning-parser) or "
                          "{\"type\": \"disabled\"}.", param="thinking")


# ------------------------------------------------------------- responses
def shows_thinking(request: Any) -> bool:
    """Whether the answer carries the model's thinking (not with display "omitted")."""
    return request.thinking is None or request.thinking.display != "omitted"


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def stop_reason(finish_reason: Optional[str], matched: Any,
                stop_sequences: Optional[list[str]]) -> tuple[Optional[str], Optional[str]]:
    """(stop_reason, stop_sequence) of a finished choice."""
    if finish_reason is None:
        return None, None
    if finish_reason == "stop" and isinstance(matched, str) and matched in (
            stop_sequences or ()):
        return "stop_sequence", matched
    return STOP_REASONS.get(finish_reason, "end_turn"), None


def message_object(request: MessagesRequest, chat: dict[str, Any]) -> dict[str, Any]:
    """A finished chat completion as an Anthropic message."""
    choice = chat["choices"][0]
    message = choice["message"]
    content: list[dict[str, Any]] = []
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if reasoning and shows_thinking(request):
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        content.append({"type": "tool_use", "id": call["id"],
                        "name": call["function"]["name"],
                        "input": tool_input(call["function"]["arguments"])})
    reason, sequence = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"),
                                   request.stop_sequences)
    usage = chat.get("usage") or {}
    return {"id": message_id(), "type": "message", "role": "assistant",
            "model": request.model, "content": content, "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": {"input_tokens": usage.get("prompt_tokens", 0),
                      "output_tokens": usage.get("completion_tokens", 0)}}


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object Anthropic's `input` is (the model's text when it
    is not a JSON object, under "arguments", rather than losing it)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}
