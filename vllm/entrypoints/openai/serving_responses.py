"""`/v1/responses`: create (full, streamed or in the background), retrieve, cancel.

A request is served by the chat handler (protocol_responses.py translates it), so
chat templates, tool parsers and reasoning parsers apply as on /v1/chat/completions;
the answer is re-shaped into a Response (responses_output.py) and, with `store` (the
default) on a server started with VLLM_ENABLE_RESPONSES_API_STORE=1, kept in a bounded
in-memory store (responses_store.py) for retrieval, for `previous_response_id` and for
background responses. Without that variable, as in vLLM, `store: true` is answered
but not kept (the Response says `store: false`) and `background: true` is refused.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator, Optional

from vllm import envs
from vllm.engine.params import RequestParamsPolicy
from vllm.entrypoints.openai.errors import BadRequestError, NotFoundError, OpenAIError
from vllm.entrypoints.openai.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.protocol_responses import (ResponsesRequest, chat_messages,
                                                        chat_request_body, with_instructions)
from vllm.entrypoints.openai.responses_output import (ResponseEventStream, assistant_message,
                                                      new_id, output_items, response_object,
                                                      usage_object)
from vllm.entrypoints.openai.responses_store import ResponsesStore, StoredResponse
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.serving_engine import parsed_chunks
from vllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class OpenAIServingResponses:

    def __init__(self, chat: OpenAIServingChat, store: Optional[ResponsesStore] = None) -> None:
        self.chat = chat
        self.enable_store = envs.VLLM_ENABLE_RESPONSES_API_STORE
        self.store = store or ResponsesStore(envs.VLLM_RESPONSES_API_STORE_MAX_BYTES)
        self._params_policy: Optional[RequestParamsPolicy] = None
        """The engine's rules for a request's defaults, to report the values in effect
        (built on first use)."""
        if self.enable_store:
            logger.info("Responses API store on: up to %d bytes of responses are kept, the "
                        "oldest evicted first.", self.store.max_bytes)

    # ------------------------------------------------------------- create
    async def create_response(self, request: ResponsesRequest) -> Any:
        refused = request.unsupported_field()
        if refused is not None:
            raise BadRequestError(refused[1], param=refused[0])
        if request.store and not self.enable_store:
            if request.background:
                raise BadRequestError(
                    "This vLLM engine does not support `store=True` and therefore does not "
                    "support the background mode. To enable these features, set the "
                    "environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when "
                    "launching the vLLM server.", param="background")
            # Answered but not kept (vLLM's choice: `store` defaults to true, so most
            # requests that say so never meant to keep the response).
            request.store = False
        model = self.chat.check_model(request.model)
        history = self._history(request.previous_response_id)
        messages = chat_messages(request, history)  # the conversation a continuation keeps
        response_id = new_id("resp")
        created = int(time.time())
        if request.stream:
            chat_request = self._chat_request(request, with_instructions(request, messages),
                                              stream=True)
            chunks = await self.chat.create_chat_completion(chat_request)
            return self._stream(request, response_id, created, model, messages, chunks)
        chat_request = self._chat_request(request, with_instructions(request, messages),
                                          stream=False)
        if request.background:
            return self._start_background(request, response_id, created, model, messages,
                                          chat_request)
        return await self._run(request, response_id, created, model, messages, chat_request)

    def _history(self, previous_id: Optional[str]) -> list[dict[str, Any]]:
        if previous_id is None:
            return []
        entry = self.store.get(previous_id)
        if entry is None:
            raise NotFoundError(f"Response with id '{previous_id}' not found.",
                                param="previous_response_id")
        if entry.response["status"] not in ("completed", "incomplete"):
            raise BadRequestError(f"Response '{previous_id}' is {entry.response['status']}; "
                                  "only a finished response can be continued.",
                                  param="previous_response_id")
        return list(entry.conversation)

    def _sampling(self, request: ResponsesRequest, prompt_tokens: Optional[int]
                  ) -> dict[str, Any]:
        """temperature, top_p and max_output_tokens in effect, as vLLM's Response reports
        them: the request's, else the model's defaults; max_output_tokens within the room
        the prompt leaves (the request's own until the prompt's length is known)."""
        if self._params_policy is None:
            self._params_policy = RequestParamsPolicy.from_model_config(self.chat.model_config)
        defaults = self._params_policy.default_sampling_params()
        max_tokens = request.max_output_tokens
        if prompt_tokens is not None:
            try:
                max_tokens = self._params_policy.resolve_max_tokens(
                    prompt_tokens, SamplingParams.from_client(max_tokens=max_tokens))
            except ValueError:
                pass  # the request failed on it already; report what it asked for
        return {"temperature": (request.temperature if request.temperature is not None
                                else defaults.temperature),
                "top_p": request.top_p if request.top_p is not None else defaults.top_p,
                "max_output_tokens": max_tokens}

    @staticmethod
    def _chat_request(request: ResponsesRequest, messages: list[dict[str, Any]],
                      stream: bool) -> ChatCompletionRequest:
        import pydantic

        from vllm.entrypoints.openai.errors import validation_error
        try:
            return ChatCompletionRequest.model_validate(
                chat_request_body(request, messages, stream))
        except pydantic.ValidationError as e:
            raise validation_error(e.errors()) from None

    async def _run(self, request: ResponsesRequest, response_id: str, created: int,
                   model: str, messages: list[dict[str, Any]],
                   chat_request: ChatCompletionRequest) -> dict[str, Any]:
        chat = (await self.chat.create_chat_completion(chat_request)).model_dump()
        choice = chat["choices"][0]
        incomplete = "max_output_tokens" if choice["finish_reason"] == "length" else None
        response = response_object(response_id, request, model,
                                   "incomplete" if incomplete else "completed",
                                   output_items(choice["message"]),
                                   usage_object(chat["usage"]), created, incomplete,
                                   sampling=self._sampling(request,
                                                           chat["usage"]["prompt_tokens"]))
        self._save(request, response, messages + [assistant_message(choice["message"])])
        return response

    def _save(self, request: ResponsesRequest, response: dict[str, Any],
              conversation: list[dict[str, Any]]) -> None:
        if request.store:
            self.store.put(response["id"], StoredResponse(response, conversation))

    # --------------------------------------------------------- streaming
    async def _stream(self, request: ResponsesRequest, response_id: str, created: int,
                      model: str, messages: list[dict[str, Any]],
                      chunks: AsyncIterator[str]) -> AsyncIterator[str]:
        sampling = self._sampling(request, None)
        builder = ResponseEventStream(
            lambda status, output, usage, incomplete: response_object(
                response_id, request, model, status, output, usage, created, incomplete,
                sampling=sampling))
        started = False
        async for chunk in parsed_chunks(chunks):
            if not started:
                # The first chunk's usage gives the prompt's length (the chat stream
                # reports usage on every chunk): the created event shows the
                # max_output_tokens in effect, as vLLM's does.
                if chunk.get("usage"):
                    sampling.update(self._sampling(request,
                                                   chunk["usage"]["prompt_tokens"]))
                started = True
                for event in builder.start():
                    yield event
            if "error" in chunk:
                yield builder.event("error", code=chunk["error"].get("code"),
                                    message=chunk["error"].get("message"), param=None)
                return
            for event in builder.on_chunk(chunk):
                yield event
        if not started:
            for event in builder.start():
                yield event
        events, response = builder.finish()
        message = {"role": "assistant", "content": builder.message["content"] or None}
        if builder.message["tool_calls"]:
            message["tool_calls"] = [{"id": c["id"], "type": "function",
                                      "function": c["function"]}
                                     for c in builder.message["tool_calls"]]
        self._save(request, response, messages + [message])
        for event in events:
            yield event

    # -------------------------------------------------------- background
    def _start_background(self, request: ResponsesRequest, response_id: str, created: int,
                          model: str, messages: list[dict[str, Any]],
                          chat_request: ChatCompletionRequest) -> dict[str, Any]:
        sampling = self._sampling(request, None)
        queued = response_object(response_id, request, model, "queued", [], None, created,
                                 sampling=sampling)
        entry = StoredResponse(queued, messages)
        if not self.store.put(response_id, entry):
            raise BadRequestError("The request is too large for the responses store "
                                  "(VLLM_RESPONSES_API_STORE_MAX_BYTES), so it cannot run "
                                  "in the background.", param="background")

        async def work() -> None:
            entry.response = response_object(response_id, request, model, "in_progress", [],
                                             None, created, sampling=sampling)
            try:
                await self._run(request, response_id, created, model, messages, chat_request)
                if self.store.get(response_id) is entry:  # the result was too large to keep
                    entry.response = response_object(
                        response_id, request, model, "failed", [], None, created,
                        sampling=sampling,
                        error={"code": "server_error", "message": "The response is larger "
                               "than the responses store (VLLM_RESPONSES_API_STORE_MAX_BYTES)"
                               " and was not kept."})
            except asyncio.CancelledError:
                entry.response = response_object(response_id, request, model, "cancelled",
                                                 [], None, created, sampling=sampling)
                raise
            except Exception as e:  # noqa: BLE001 - recorded on the response
                error = (e.to_response().error.model_dump() if isinstance(e, OpenAIError)
                         else {"code": "server_error", "message": str(e)})
                entry.response = response_object(response_id, request, model, "failed", [],
                                                 None, created, error=error, sampling=sampling)
            finally:
                entry.task = None

        entry.task = asyncio.ensure_future(work())
        return queued

    # --------------------------------------------------- retrieve, cancel
    def retrieve(self, response_id: str) -> dict[str, Any]:
        entry = self.store.get(response_id)
        if entry is None:
            raise NotFoundError(f"Response with id '{response_id}' not found.",
                                param="response_id")
        return entry.response

    async def cancel(self, response_id: str) -> dict[str, Any]:
        entry = self.store.get(response_id)
        if entry is None:
            raise NotFoundError(f"Response with id '{response_id}' not found.",
                                param="response_id")
        if not entry.response["background"]:
            raise BadRequestError("Cannot cancel a synchronous response.",
                                  param="response_id")
        task = entry.task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return entry.response
