"""POST /v1/chat/completions: messages -> chat template -> one engine request with n choices.

Streaming follows OpenAI's chunk sequence: per choice a first chunk carrying the role, then
content (and reasoning / tool-call) deltas, the last one with finish_reason; then an
optional usage chunk and [DONE]. Reasoning and tool calls are read from each choice's
text by chat_parsing.py (--reasoning-parser, --tool-call-parser, tool_choice).
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Optional, Union

import vllm.envs as envs
from vllm.entrypoints.openai.chat_parsing import ChoiceParser, ToolPlan
from vllm.entrypoints.openai.chat_utils import (apply_chat_template, render_mistral_chat,
                                                check_request_chat_template, content_chars,
                                                conversation_and_images,
                                                resolve_content_format)
from vllm.entrypoints.openai.chat_media import ChatImages
from vllm.entrypoints.openai.errors import BadRequestError
from vllm.entrypoints.openai.protocol import (ChatCompletionRequest, ChatCompletionResponse,
                                              ChatCompletionResponseChoice,
                                              ChatCompletionResponseStreamChoice,
                                              ChatCompletionStreamResponse, ChatResponseMessage,
                                              DeltaMessage)
from vllm.entrypoints.openai.serving_engine import (SSE_DONE, OpenAIServing, PromptInput, sse,
                                                   sse_error)
from vllm.entrypoints.openai.stream_interval import batch_stream
from vllm.entrypoints.openai.template_sandbox import TemplateSandbox


class OpenAIServingChat(OpenAIServing):

    def __init__(self, *args: Any, response_role: str = "assistant",
                 chat_template: Optional[str] = None,
                 content_format: str = "auto",
                 trust_request_chat_template: bool = False,
                 enable_auto_tools: bool = False, tool_parser: Optional[str] = None,
                 reasoning_parser: Optional[str] = None,
                 default_chat_template_kwargs: Optional[dict[str, Any]] = None,
                 tool_strict_level: str = "auto",
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tool_strict_level = tool_strict_level
        """--tool-strict-level (chat_parsing.TOOL_STRICT_LEVELS)."""
        self.default_chat_template_kwargs = dict(default_chat_template_kwargs or {})
        """--default-chat-template-kwargs: under each request's own chat_template_kwargs."""
        from vllm.entrypoints.openai.tool_parsers import ToolParserManager
        from vllm.reasoning import ReasoningParserManager
        self.enable_auto_tools = enable_auto_tools
        self.tool_parser_cls = (ToolParserManager.get_tool_parser(tool_parser)
                                if tool_parser else None)
        self.reasoning_parser = (
            ReasoningParserManager.get_reasoning_parser(reasoning_parser)(self.tokenizer)
            if reasoning_parser else None)
        self.response_role = response_role
        self.chat_template = chat_template
        self.content_format = content_format
        """--chat-template-content-format, resolved per request against the template used
        (chat_utils.resolve_content_format)."""
        self.trust_request_chat_template = trust_request_chat_template
        self.chat_images = ChatImages(self.model_config)
        # Request templates are code from the client: rendered in a killable helper process.
        self.template_sandbox = (TemplateSandbox(self.tokenizer,
                                                 envs.VLLM_CHAT_TEMPLATE_TIMEOUT_S,
                                                 envs.VLLM_CHAT_TEMPLATE_WORKERS)
                                 if trust_request_chat_template else None)

    async def render_prompt(self, request: Any) -> PromptInput:
        """Messages -> template text -> token ids (shared with /tokenize)."""
        check_request_chat_template(request, self.trust_request_chat_template)
        request.chat_template_kwargs = self.template_kwargs(request)
        template = request.chat_template or self.chat_template
        placeholder = self.chat_images.placeholder
        content_format = resolve_content_format(
            self.content_format, template or getattr(self.tokenizer, "chat_template", None),
            multimodal=placeholder is not None)
        conversation, image_refs = conversation_and_images(request.messages, placeholder,
                                                           content_format)
        self.check_prompt_chars(sum(content_chars(m["content"]) for m in conversation),
                                "messages", "messages")
        job = dict(conversation=conversation,
                   chat_template=template,
                   add_generation_prompt=request.add_generation_prompt,
                   continue_final_message=request.continue_final_message,
                   chat_template_kwargs=request.chat_template_kwargs,
                   tools=[t.model_dump(exclude_none=True) for t in request.tools]
                   if request.tools else None)
        if getattr(self.tokenizer, "is_mistral", False):  # --tokenizer-mode mistral
            ids, text = await self.run_blocking(render_mistral_chat, self.tokenizer, **job)
        elif request.chat_template is not None and self.template_sandbox is not None:
            text = await self.template_sandbox.render(**job)
            ids = await self.tokenize_text(text, request.add_special_tokens, "messages")
        else:
            text = await self.run_blocking(apply_chat_template, self.tokenizer, **job)
            ids = await self.tokenize_text(text, request.add_special_tokens, "messages")
        if image_refs:
            images = await self.chat_images.load(image_refs)
            return PromptInput(ids, text, multi_modal_data={"image": images})
        return PromptInput(ids, text)

    def apply_thinking_budget(self, request: Any, params: Any,
                              prompt_token_ids: Optional[list[int]] = None) -> None:
        """`thinking_token_budget`: the budget and the reasoning parser's end sequence
        on the params (the sampler forces that sequence once the budget is spent); a 400
        naming the field where the server cannot tell where reasoning ends. When the
        prompt does not open the reasoning (the model writes `<think>` itself), the
        parser's start sequence too: the budget then counts from it, as vLLM."""
        budget = getattr(request, "thinking_token_budget", None)
        if budget is None:
            return
        parser = self.reasoning_parser
        if parser is None:
            raise BadRequestError("thinking_token_budget needs a server started with "
                                  "--reasoning-parser.", param="thinking_token_budget")
        end_ids = list(getattr(parser, "end_token_ids", None) or ())
        if not end_ids:
            raise BadRequestError(
                f"thinking_token_budget: the reasoning parser "
                f"{type(parser).__name__} has no end-of-reasoning token sequence.",
                param="thinking_token_budget")
        active = parser.for_request(request)
        if active is None:
            return  # the request turned reasoning off: nothing to budget
        params.thinking_end_token_ids = end_ids
        params.thinking_token_budget = budget
        start_ids = list(getattr(active, "start_token_ids", None) or ())
        if (prompt_token_ids is not None and start_ids
                and active.reasoning_ended_in(prompt_token_ids)):
            params.thinking_start_token_ids = start_ids

    def template_kwargs(self, request: Any) -> Optional[dict[str, Any]]:
        """The server's default template kwargs, then the request's `reasoning_effort`,
        then its own chat_template_kwargs (each later one wins, as vLLM)."""
        merged = dict(self.default_chat_template_kwargs)
        effort = getattr(request, "reasoning_effort", None)
        if effort is not None:
            merged["reasoning_effort"] = effort
        merged.update(request.chat_template_kwargs or {})
        return merged or None

    async def tool_plan(self, request: ChatCompletionRequest) -> ToolPlan:
        """The request's ToolPlan, built on a pool thread when it has tools: building it
        parses each tool's parameters schema, which takes the grammar compiler seconds
        for a large one (it releases the GIL, so the event loop keeps serving)."""
        args = (request, self.tokenizer, self.tool_parser_cls, self.enable_auto_tools,
                self.structured_outputs_config, getattr(self, "tool_strict_level", "auto"))
        if not request.tools:
            return ToolPlan.build(*args)
        return await self.run_blocking(ToolPlan.build, *args)

    def response_role_for(self, request: ChatCompletionRequest) -> str:
        if request.add_generation_prompt:
            return self.response_role
        return request.messages[-1].role

    async def create_chat_completion(self, request: ChatCompletionRequest,
                                     trace_headers: Optional[dict[str, str]] = None,
                                     ) -> Union[ChatCompletionResponse, AsyncIterator[str]]:
        model_name = self.check_model(request.model)
        self.check_supported(request)
        await self.check_engine()
        prompt = await self.render_prompt(request)
        truncated = self.truncate(prompt.token_ids, request.truncate_prompt_tokens,
                                  self.max_model_len, request.truncation_side,
                                  request.requested_max_tokens)
        if truncated is not prompt.token_ids:
            if prompt.multi_modal_data:
                raise BadRequestError("truncate_prompt_tokens cannot cut a prompt with "
                                      "images.", param="truncate_prompt_tokens")
            prompt = PromptInput(truncated, None)
        max_tokens_param = ("max_completion_tokens" if request.max_completion_tokens
                            is not None else "max_tokens")
        top = request.top_logprobs or 0
        plan = await self.tool_plan(request)
        if plan.mode == "auto":
            request = plan.parser.adjust_request(request)
        if self.reasoning_parser is not None:
            request = self.reasoning_parser.adjust_request(request)
        params = await self.sampling_params(request, max_tokens=request.requested_max_tokens,
                                            logprobs=top if request.logprobs else None,
                                            prompt_logprobs=request.prompt_logprobs,
                                            stream=bool(request.stream),
                                            structured_outputs=plan.structured,
                                            max_tokens_param=max_tokens_param)
        self.apply_thinking_budget(request, params, prompt.token_ids)
        request_id, engine_id = self.request_ids("chatcmpl", request.request_id)
        try:
            stream = await self.add_request(engine_id, prompt.engine_prompt(request.cache_salt),
                                            params, request.model, request.priority,
                                            trace_headers)
        except ValueError as e:
            raise self.engine_error(e, "messages", "messages", max_tokens_param,
                                    "top_logprobs") from e
        outputs = self.engine.iterate(stream)
        if request.stream and (request.stream_interval or 1) > 1:
            outputs = batch_stream(outputs, request.stream_interval)
        created = int(time.time())
        role = self.response_role_for(request)
        if request.stream:
            return self._stream(request, prompt, outputs, request_id, created, model_name,
                                role, plan)
        return await self._full(request, prompt, outputs, request_id, created, model_name,
                                role, plan)

    def _echo_text(self, request: ChatCompletionRequest, role: str) -> str:
        last = request.messages[-1]
        if request.echo and last.role == role and last.content:
            return (last.content if isinstance(last.content, str)
                    else "\n".join(p.text or "" for p in last.content))
        return ""

    # ------------------------------------------------------------ full body
    async def _full(self, request: ChatCompletionRequest, prompt: PromptInput, outputs: Any,
                    request_id: str, created: int, model_name: str,
                    role: str, plan: ToolPlan) -> ChatCompletionResponse:
        final = None
        try:
            async for output in outputs:
                final = output
        finally:
            await outputs.aclose()
        self.check_generation_error(final)
        echo = self._echo_text(request, role)
        as_ids = bool(request.return_tokens_as_token_ids)
        with_ids = bool(request.return_token_ids)
        choices = []
        completion_tokens = 0
        for c in sorted(final.outputs, key=lambda c: c.index):
            completion_tokens += len(c.token_ids)
            logprobs = None
            if request.logprobs:
                logprobs = self.chat_logprobs(c.token_ids, c.logprobs or [],
                                              request.top_logprobs or 0, as_ids)
            parser = ChoiceParser(self.reasoning_parser, plan, request)
            parsed = parser.parse(c.text)
            content = parsed.content
            if echo:
                content = echo + (content or "")
            choices.append(ChatCompletionResponseChoice(
                index=c.index, message=ChatResponseMessage(
                    role=role, content=content, reasoning=parsed.reasoning,
                    tool_calls=parsed.tool_calls),
                logprobs=logprobs, finish_reason=parser.finish_reason(c.finish_reason),
                stop_reason=c.stop_reason,
                token_ids=list(c.token_ids) if with_ids else None))
        prompt_ids = (final.prompt_token_ids if prompt.multi_modal_data
                      and final.prompt_token_ids else prompt.token_ids)  # images expanded
        return ChatCompletionResponse(
            id=request_id, created=created, model=model_name, choices=choices,
            usage=self.usage(len(prompt_ids), completion_tokens,
                             final.num_cached_tokens),
            system_fingerprint=self.system_fingerprint,
            prompt_logprobs=(self.prompt_logprobs_json(final.prompt_logprobs)
                             if request.prompt_logprobs is not None else None),
            prompt_token_ids=list(prompt_ids) if with_ids else None,
            prompt_text=prompt.text if request.return_prompt_text else None,
            kv_transfer_params=getattr(final, "kv_transfer_params", None))

    # --------------------------------------------------------------- stream
    async def _stream(self, request: ChatCompletionRequest, prompt: PromptInput, outputs: Any,
                      request_id: str, created: int, model_name: str,
                      role: str, plan: ToolPlan) -> AsyncIterator[str]:
        prompt_tokens = len(prompt.token_ids)
        cached_tokens = 0
        completion_tokens = [0] * request.n  # per choice: continuous usage counts its own
        as_ids = bool(request.return_tokens_as_token_ids)
        with_ids = bool(request.return_token_ids)

        def chunk(index: int, delta: DeltaMessage, logprobs: Any = None,
                  finish_reason: Optional[str] = None, stop_reason: Any = None,
                  token_ids: Optional[list[int]] = None,
                  prompt_token_ids: Optional[list[int]] = None,
                  prompt_text: Optional[str] = None) -> str:
            usage = None
            if request.continuous_usage:
                usage = self.usage(prompt_tokens, completion_tokens[index], cached_tokens)
            return sse(ChatCompletionStreamResponse(
                id=request_id, created=created, model=model_name, usage=usage,
                system_fingerprint=self._last_chunk_fingerprint(request, finish_reason),
                prompt_token_ids=prompt_token_ids, prompt_text=prompt_text,
                choices=[ChatCompletionResponseStreamChoice(
                    index=index, delta=delta, logprobs=logprobs, finish_reason=finish_reason,
                    stop_reason=stop_reason, token_ids=token_ids)]))

        parsers = [ChoiceParser(self.reasoning_parser, plan, request) for _ in range(request.n)]
        try:
            for index in range(request.n):
                first_ids = list(prompt.token_ids) if with_ids and index == 0 else None
                yield chunk(index, DeltaMessage(role=role, content=""),
                            prompt_token_ids=first_ids,
                            prompt_text=(prompt.text if request.return_prompt_text
                                         and index == 0 else None))
            echo = self._echo_text(request, role)
            if echo:
                for index in range(request.n):
                    yield chunk(index, DeltaMessage(content=echo))
            async for output in outputs:
                self.check_generation_error(output)
                cached_tokens = output.num_cached_tokens or 0
                if prompt.multi_modal_data and output.prompt_token_ids:
                    prompt_tokens = len(output.prompt_token_ids)  # images expanded
                for c in output.outputs:
                    completion_tokens[c.index] += len(c.token_ids)
                    if not c.text and not c.token_ids and c.finish_reason is None:
                        continue
                    logprobs = None
                    if request.logprobs:
                        logprobs = self.chat_logprobs(c.token_ids, c.logprobs or [],
                                                      request.top_logprobs or 0, as_ids)
                    parser = parsers[c.index]
                    final = c.finish_reason is not None
                    reasoning, content, tool_deltas = parser.stream(c.text, final)
                    if not (reasoning or content or tool_deltas or final or logprobs
                            or with_ids):
                        continue  # text held back (a marker may be starting)
                    yield chunk(c.index, DeltaMessage(content=content or None,
                                                      reasoning=reasoning or None,
                                                      tool_calls=tool_deltas or None),
                                logprobs, parser.finish_reason(c.finish_reason),
                                c.stop_reason,
                                token_ids=list(c.token_ids) if with_ids else None)
            if request.include_usage:
                yield sse(ChatCompletionStreamResponse(
                    id=request_id, created=created, model=model_name, choices=[],
                    usage=self.usage(prompt_tokens, sum(completion_tokens), cached_tokens),
                    system_fingerprint=self.system_fingerprint))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - reported in-stream (headers are sent)
            yield sse_error(e)
        finally:
            await outputs.aclose()
        yield SSE_DONE
