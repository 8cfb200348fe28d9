"""POST /v1/messages and /v1/messages/count_tokens, served by the chat completions code.

A stream follows Anthropic's event sequence: `message_start`, then per content block
(thinking, text, each tool_use) `content_block_start`, its deltas (`thinking_delta`,
`text_delta`, `input_json_delta`) and `content_block_stop`, then `message_delta` with
the stop reason and usage, and `message_stop`; an error mid-stream is an `error`
event. Each SSE event carries its type as `event:` and its JSON as `data:`.
"""
from __future__ import annotations

import json
from typing import Any, AsyncIterator, Optional

import pydantic

from vllm.entrypoints.anthropic.convert import (chat_body, message_id, message_object,
                                                shows_thinking, stop_reason)
from vllm.entrypoints.anthropic.protocol import (CountTokensRequest, MessagesRequest,
                                                 error_body)
from vllm.entrypoints.openai.errors import validation_error
from vllm.entrypoints.openai.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.serving_engine import parsed_chunks


def event(kind: str, **data: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


class AnthropicServingMessages:

    def __init__(self, chat: Any) -> None:
        self.chat = chat

    async def create_message(self, request: MessagesRequest) -> Any:
        """The message as a dict, or an async iterator of SSE events when streaming."""
        chat_request = _chat_request(chat_body(request, request.stream, request.max_tokens))
        result = await self.chat.create_chat_completion(chat_request)
        if request.stream:
            return self._stream(request, result)
        return message_object(request, result.model_dump())

    async def count_tokens(self, request: CountTokensRequest) -> dict[str, Any]:
        """{"input_tokens": N}: the rendered prompt's length (template, tools, system)."""
        prompt = await self.chat.render_prompt(
            _chat_request(chat_body(request, stream=False, max_tokens=None)))
        return {"input_tokens": len(prompt.token_ids)}

    async def _stream(self, request: MessagesRequest,
                      chunks: AsyncIterator[str]) -> AsyncIterator[str]:
        stream = MessageEventStream(request)
        yield stream.start()
        async for chunk in parsed_chunks(chunks):
            if "error" in chunk:
                error = chunk["error"]
                body = error_body(int(error.get("code") or 500), error.get("message", ""))
                yield event("error", error=body["error"])
                return
            for out in stream.on_chunk(chunk):
                yield out
        for out in stream.finish():
            yield out


class MessageEventStream:
    """Chat completion chunks -> Anthropic stream events, one content block at a time."""

    def __init__(self, request: MessagesRequest) -> None:
        self.request = request
        self.show_thinking = shows_thinking(request)
        self.index = -1
        self.open: Optional[tuple[str, Optional[int]]] = None
        """(kind, tool call index) of the block now open, None between blocks."""
        self.finish_reason: Optional[str] = None
        self.matched: Any = None
        self.usage: dict[str, int] = {}

    def start(self) -> str:
        return event("message_start", message={
            "id": message_id(), "type": "message", "role": "assistant",
            "model": self.request.model, "content": [], "stop_reason": None,
            "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}})

    def on_chunk(self, chunk: dict[str, Any]) -> list[str]:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        events: list[str] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning") or delta.get("reasoning_content")
            if reasoning and self.show_thinking:
                events += self._block("thinking", None, {"thinking": "", "signature": ""})
                events.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
            if delta.get("content"):
                events += self._block("text", None, {"text": ""})
                events.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or []:
                events += self._tool_call(call)
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
                self.matched = choice.get("stop_reason")
        return events

    def _tool_call(self, call: dict[str, Any]) -> list[str]:
        function = call.get("function") or {}
        events: list[str] = []
        if self.open != ("tool_use", call.get("index")):
            events += self._close()
            self.index += 1
            self.open = ("tool_use", call.get("index"))
            events.append(event("content_block_start", index=self.index, content_block={
                "type": "tool_use", "id": call.get("id") or f"toolu_{self.index}",
                "name": function.get("name") or "", "input": {}}))
        if function.get("arguments"):
            events.append(self._delta({"type": "input_json_delta",
                                       "partial_json": function["arguments"]}))
        return events

    def _block(self, kind: str, key: Optional[int], start: dict[str, Any]) -> list[str]:
        """Open a block of `kind` unless one is open (closing the block before)."""
        if self.open == (kind, key):
            return []
        events = self._close()
        self.index += 1
        self.open = (kind, key)
        events.append(event("content_block_start", index=self.index,
                            content_block={"type": kind, **start}))
        return events

    def _delta(self, delta: dict[str, Any]) -> str:
        return event("content_block_delta", index=self.index, delta=delta)

    def _close(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [event("content_block_stop", index=self.index)]

    def finish(self) -> list[str]:
        reason, sequence = stop_reason(self.finish_reason or "stop", self.matched,
                                       self.request.stop_sequences)
        usage = {"input_tokens": self.usage.get("prompt_tokens", 0),
                 "output_tokens": self.usage.get("completion_tokens", 0)}
        return [*self._close(),
                event("message_delta", delta={"stop_reason": reason,
                                              "stop_sequence": sequence}, usage=usage),
                event("message_stop")]


def _chat_request(body: dict[str, Any]) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(body)
    except pydantic.ValidationError as e:
        raise validation_error(e.errors()) from None
