"""Response objects and stream events of `/v1/responses`, in OpenAI's shapes.

`response_object` builds the Response (`object: "response"`); `output_items` turns a
chat answer (reasoning, text, tool calls) into output items: a `reasoning` item, a
`message` item with one `output_text` part, one `function_call` item per call.
`ResponseEventStream` turns the chat handler's streamed chunks into the Responses
events (`response.created`, `response.output_item.added`, `response.output_text.delta`,
..., `response.completed`), each with its `sequence_number`.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Optional


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_object(response_id: str, request: Any, model: str, status: str,
                    output: list[dict[str, Any]], usage: Optional[dict[str, Any]] = None,
                    created_at: Optional[int] = None,
                    incomplete_reason: Optional[str] = None,
                    error: Optional[dict[str, Any]] = None,
                    sampling: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The Response, with vLLM's fields: the request's own values echoed as given (null
    when unset: metadata, text, reasoning; tool_choice "auto" and service_tier "auto" by
    default) and the sampling values in effect (`sampling`: temperature, top_p,
    max_output_tokens, as the request's defaults resolved them)."""
    sampling = sampling or {}
    return {
        "id": response_id, "object": "response",
        "created_at": created_at if created_at is not None else int(time.time()),
        "status": status, "background": bool(request.background), "error": error,
        "incomplete_details": ({"reason": incomplete_reason} if incomplete_reason else None),
        "instructions": request.instructions,
        "max_output_tokens": sampling.get("max_output_tokens", request.max_output_tokens),
        "max_tool_calls": request.max_tool_calls,
        "metadata": request.metadata, "model": model, "output": output,
        "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": request.previous_response_id, "prompt": request.prompt,
        "reasoning": request.reasoning, "service_tier": request.service_tier,
        "store": bool(request.store),
        "temperature": sampling.get("temperature", request.temperature),
        "text": request.text, "tool_choice": request.tool_choice, "tools": request.tools or [],
        "top_logprobs": None, "top_p": sampling.get("top_p", request.top_p),
        "truncation": request.truncation or "disabled", "usage": usage, "user": request.user,
    }


def usage_object(usage: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """A chat `usage` as vLLM's Responses usage words it: one turn (the per-turn lists
    have one entry; a tool round trip inside the server would add turns)."""
    if not usage:
        return None
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    output = usage.get("completion_tokens") or 0
    return {"input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": cached,
                                     "input_tokens_per_turn": [usage["prompt_tokens"]],
                                     "cached_tokens_per_turn": [cached]},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0,
                                      "output_tokens_per_turn": [output],
                                      "tool_output_tokens_per_turn": [0]},
            "total_tokens": usage["total_tokens"]}


def reasoning_item(text: str, status: str = "completed",
                   item_id: Optional[str] = None) -> dict[str, Any]:
    return {"id": item_id or new_id("rs"), "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": status}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(text: Optional[str], status: str = "completed",
                 item_id: Optional[str] = None) -> dict[str, Any]:
    return {"id": item_id or new_id("msg"), "type": "message", "role": "assistant",
            "status": status, "content": [] if text is None else [text_part(text)]}


def function_call_item(call_id: str, name: str, arguments: str, status: str = "completed",
                       item_id: Optional[str] = None) -> dict[str, Any]:
    return {"id": item_id or new_id("fc"), "type": "function_call", "call_id": call_id,
            "name": name, "arguments": arguments, "status": status}


def output_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """Output items of a chat answer (`choices[0].message` as a dict)."""
    items = []
    if message.get("reasoning"):
        items.append(reasoning_item(message["reasoning"]))
    if message.get("content") or not message.get("tool_calls"):
        items.append(message_item(message.get("content") or ""))
    for call in message.get("tool_calls") or []:
        items.append(function_call_item(call["id"], call["function"]["name"],
                                        call["function"]["arguments"]))
    return items


def assistant_message(message: dict[str, Any]) -> dict[str, Any]:
    """The answer as a chat message, for the conversation a later request continues."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        out["tool_calls"] = [{"id": c["id"], "type": "function", "function": c["function"]}
                             for c in message["tool_calls"]]
    return out


def sse_event(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


class ResponseEventStream:
    """Chat stream chunks in, Responses events out (see the module docstring)."""

    def __init__(self, make_response: Any) -> None:
        self.make_response = make_response
        """(status, output, usage, incomplete_reason) -> the Response object."""
        self.sequence = 0
        self.items: list[dict[str, Any]] = []
        self.open_kind: Optional[str] = None  # "reasoning" | "message" while streaming it
        self.calls: dict[int, dict[str, Any]] = {}  # chat tool index -> item
        self.usage: Optional[dict[str, Any]] = None
        self.finish_reason: Optional[str] = None
        self.message: dict[str, Any] = {"content": "", "reasoning": "", "tool_calls": []}

    def event(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse_event(body)

    def start(self) -> list[str]:
        response = self.make_response("in_progress", [], None, None)
        return [self.event("response.created", response=response),
                self.event("response.in_progress", response=response)]

    def on_chunk(self, chunk: dict[str, Any]) -> list[str]:
        """Events for one chat chunk (its first choice; n is 1 here)."""
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        events: list[str] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning"):
                events += self._text("reasoning", delta["reasoning"])
            if delta.get("content"):
                events += self._text("message", delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._tool_delta(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return events

    def _text(self, kind: str, delta: str) -> list[str]:
        events = []
        if self.open_kind != kind:
            events += self._close_open()
            item = (reasoning_item("", "in_progress") if kind == "reasoning"
                    else message_item(None, "in_progress"))
            self.items.append(item)
            self.open_kind = kind
            events.append(self.event("response.output_item.added",
                                     output_index=len(self.items) - 1, item=item))
            if kind == "message":
                events.append(self.event("response.content_part.added", item_id=item["id"],
                                         output_index=len(self.items) - 1, content_index=0,
                                         part=text_part("")))
        item, index = self.items[-1], len(self.items) - 1
        key = "reasoning" if kind == "reasoning" else "content"
        self.message[key] += delta
        if kind == "reasoning":
            item["content"][0]["text"] += delta
            events.append(self.event("response.reasoning_text.delta", item_id=item["id"],
                                     output_index=index, content_index=0, delta=delta))
        else:
            item.setdefault("_text", "")
            item["_text"] += delta
            events.append(self.event("response.output_text.delta", item_id=item["id"],
                                     output_index=index, content_index=0, delta=delta,
                                     logprobs=[]))
        return events

    def _tool_delta(self, call: dict[str, Any]) -> list[str]:
        events = []
        index = call.get("index", 0)
        item = self.calls.get(index)
        if item is None:
            events += self._close_open()
            function = call.get("function") or {}
            item = function_call_item(call.get("id") or new_id("call"),
                                      function.get("name") or "", "", "in_progress")
            self.calls[index] = item
            self.items.append(item)
            events.append(self.event("response.output_item.added",
                                     output_index=len(self.items) - 1, item=dict(item)))
        arguments = (call.get("function") or {}).get("arguments")
        if arguments:
            item["arguments"] += arguments
            events.append(self.event("response.function_call_arguments.delta",
                                     item_id=item["id"], output_index=self.items.index(item),
                                     delta=arguments))
        return events

    def _close_open(self) -> list[str]:
        """Done events of the reasoning or message item being streamed, if any."""
        if self.open_kind is None:
            return []
        item, index = self.items[-1], len(self.items) - 1
        events = []
        if self.open_kind == "reasoning":
            events.append(self.event("response.reasoning_text.done", item_id=item["id"],
                                     output_index=index, content_index=0,
                                     text=item["content"][0]["text"]))
        else:
            part = text_part(item.pop("_text", ""))
            item["content"] = [part]
            events.append(self.event("response.output_text.done", item_id=item["id"],
                                     output_index=index, content_index=0, text=part["text"],
                                     logprobs=[]))
            events.append(self.event("response.content_part.done", item_id=item["id"],
                                     output_index=index, content_index=0, part=part))
        item["status"] = "completed"
        events.append(self.event("response.output_item.done", output_index=index, item=item))
        self.open_kind = None
        return events

    def finish(self) -> tuple[list[str], dict[str, Any]]:
        """The closing events and the final Response."""
        events = self._close_open()
        if not self.items:  # nothing generated: an empty message, as the full form
            item = message_item("")
            self.items.append(item)
            events.append(self.event("response.output_item.added", output_index=0, item=item))
            events.append(self.event("response.output_item.done", output_index=0, item=item))
        for index, item in enumerate(self.items):
            if item["type"] == "function_call" and item["status"] != "completed":
                item["status"] = "completed"
                events.append(self.event("response.function_call_arguments.done",
                                         item_id=item["id"], output_index=index,
                                         arguments=item["arguments"]))
                events.append(self.event("response.output_item.done", output_index=index,
                                         item=item))
                self.message["tool_calls"].append({"id": item["call_id"], "function": {
                    "name": item["name"], "arguments": item["arguments"]}})
        incomplete = "max_output_tokens" if self.finish_reason == "length" else None
        response = self.make_response("incomplete" if incomplete else "completed",
                                      self.items, usage_object(self.usage), incomplete)
        kind = "response.incomplete" if incomplete else "response.completed"
        events.append(self.event(kind, response=response))
        return events, response
