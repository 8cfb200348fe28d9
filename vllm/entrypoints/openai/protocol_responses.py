"""The `/v1/responses` request, and its translation to a chat completion.

A Responses request is served as the chat completion it describes: `instructions`
become the system message, `input` (a string, or a list of messages, function calls
and function call outputs) the conversation, after the stored conversation of
`previous_response_id`; tools, tool_choice, sampling knobs and `text.format` map to
their chat fields. The chat handler's answer (its reasoning, text and tool calls, as
the reasoning and tool parsers split them) then becomes the Response's output items
(responses_output.py). Fields this server cannot honour are refused by name.
"""
from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import Field

from vllm.entrypoints.openai.errors import BadRequestError
from vllm.entrypoints.openai.protocol import OpenAIBaseModel
from vllm.entrypoints.openai.request_metadata import metadata_problem


class ResponsesRequest(OpenAIBaseModel):
    # OpenAI: https://platform.openai.com/docs/api-reference/responses/create
    model: Optional[str] = None
    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = "auto"
    max_tool_calls: Optional[int] = None
    parallel_tool_calls: Optional[bool] = True
    stream: Optional[bool] = False
    store: Optional[bool] = True
    background: Optional[bool] = False
    previous_response_id: Optional[str] = None
    metadata: Optional[dict[str, Any]] = None
    user: Optional[str] = None
    text: Optional[dict[str, Any]] = None
    reasoning: Optional[dict[str, Any]] = None
    truncation: Optional[str] = "disabled"
    include: Optional[list[str]] = None
    top_logprobs: Optional[int] = None
    service_tier: Optional[str] = "auto"
    prompt: Optional[dict[str, Any]] = None
    request_id: Optional[str] = None

    def unsupported_field(self) -> Optional[tuple[str, str]]:
        """(field, reason) of the first field asking for what is not served."""
        bad_metadata = metadata_problem(self.metadata)
        if bad_metadata is not None:
            return ("metadata", bad_metadata)
        if self.reasoning and any(v is not None for v in self.reasoning.values()):
            return ("reasoning", "reasoning options (effort, summary) are not supported; "
                    "start the server with --reasoning-parser to get reasoning items.")
        if self.truncation not in (None, "disabled"):
            return ("truncation", "only truncation='disabled' is supported.")
        if self.include:
            return ("include", f"include={self.include} is not supported.")
        if self.top_logprobs:
            return ("top_logprobs", "logprobs are not supported on /v1/responses.")
        if self.prompt is not None:
            return ("prompt", "prompt templates are not supported.")
        if self.service_tier not in (None, "auto", "default"):
            return ("service_tier", "only service_tier='auto' is supported.")
        if self.background and self.stream:
            return ("background", "background responses cannot be streamed here.")
        if self.background and self.store is False:
            return ("background", "a background response must be stored (store=true).")
        return None


def with_instructions(request: ResponsesRequest, conversation: list[dict[str, Any]]
                      ) -> list[dict[str, Any]]:
    """The messages the model sees: the request's `instructions` as the system message
    (they apply to this response only, never to a continuation), then the conversation."""
    if not request.instructions:
        return conversation
    return [{"role": "system", "content": request.instructions}, *conversation]


def chat_messages(request: ResponsesRequest, history: list[dict[str, Any]]
                  ) -> list[dict[str, Any]]:
    """The conversation of the request: the previous response's, then `input`.

    A `function_call_output` must answer a call made before it (in `input` or in the
    previous response's conversation), as OpenAI requires: an answer to no call would
    reach the chat template as a tool message that follows nothing."""
    messages: list[dict[str, Any]] = list(history)
    if isinstance(request.input, str):
        messages.append({"role": "user", "content": request.input})
        return messages
    call_ids = {call.get("id") for m in history for call in m.get("tool_calls") or ()}
    for i, item in enumerate(request.input):
        message = _input_item(item, i)
        if message is None:
            continue
        if message["role"] == "tool" and message["tool_call_id"] not in call_ids:
            raise BadRequestError("No tool call found for function call output with call_id "
                                  f"{message['tool_call_id']}.", param="input")
        call_ids.update(call["id"] for call in message.get("tool_calls") or ())
        messages.append(message)
    return messages


def _input_item(item: dict[str, Any], index: int) -> Optional[dict[str, Any]]:
    kind = item.get("type", "message")
    if kind == "message" or (kind is None and "role" in item):
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise BadRequestError(f"input[{index}].role={role!r}: expected user, assistant, "
                                  "system or developer.", param=f"input.{index}.role")
        return {"role": "system" if role == "developer" else role,
                "content": _text_of(item.get("content"), index)}
    if kind == "function_call":
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": item.get("call_id"), "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}}]}
    if kind == "function_call_output":
        output = item.get("output")
        return {"role": "tool", "tool_call_id": item.get("call_id"),
                "content": output if isinstance(output, str) else str(output)}
    if kind == "reasoning":
        return None  # the model's earlier reasoning is not fed back (as vLLM)
    raise BadRequestError(f"input[{index}].type={kind!r} is not supported (message, "
                          "function_call, function_call_output, reasoning).",
                          param=f"input.{index}.type")


def _text_of(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in (
                    "input_text", "output_text", "text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequestError(f"input[{index}].content: part type {kind!r} is not "
                                      "supported (text only).", param=f"input.{index}.content")
            texts.append(part.get("text", ""))
        return "".join(texts)
    raise BadRequestError(f"input[{index}].content must be a string or a list of text parts.",
                          param=f"input.{index}.content")


def chat_request_body(request: ResponsesRequest, messages: list[dict[str, Any]],
                      stream: bool) -> dict[str, Any]:
    """The chat completion request body the Responses request stands for."""
    body: dict[str, Any] = {"model": request.model, "messages": messages,
                            "max_tokens": request.max_output_tokens, "stream": stream,
                            "user": request.user}
    if stream:
        # Usage on every chunk: the first one gives the prompt's length.
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    for name in ("temperature", "top_p", "request_id"):
        if getattr(request, name) is not None:
            body[name] = getattr(request, name)
    if request.tools:
        body["tools"] = [_chat_tool(t, i) for i, t in enumerate(request.tools)]
        body["parallel_tool_calls"] = request.parallel_tool_calls
    choice = request.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not choice.get("name"):
            raise BadRequestError("tool_choice must be 'auto', 'none', 'required' or "
                                  "{'type': 'function', 'name': ...}.", param="tool_choice")
        body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None and request.tools:
        body["tool_choice"] = choice
    response_format = _response_format(request.text)
    if response_format is not None:
        body["response_format"] = response_format
    return body


def _chat_tool(tool: dict[str, Any], index: int) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise BadRequestError(f"tools[{index}].type={tool.get('type')!r}: only function "
                              "tools are supported.", param=f"tools.{index}.type")
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict")
                if tool.get(k) is not None}
    return {"type": "function", "function": function}


def _response_format(text: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    fmt = (text or {}).get("format")
    if fmt is not None and not isinstance(fmt, dict):
        raise BadRequestError("text.format must be an object.", param="text.format")
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {
            "name": fmt.get("name", "response"), "schema": fmt.get("schema"),
            "strict": fmt.get("strict")}}
    raise BadRequestError(f"text.format.type={fmt.get('type')!r}: expected text, "
                          "json_object or json_schema.", param="text.format.type")
