"""`/v1/embeddings`, `/pooling` and `/classify`: prompts -> pooling requests -> vectors.

Each input (a string, a list of strings, a list of token ids or a list of such lists)
becomes one engine request with `PoolingParams(task=...)`; all are queued, then their
single outputs gathered in order. Vectors leave as JSON floats or, with
`encoding_format="base64"`, as the base64 of their bytes (`embed_dtype`, `endianness`),
which is what the official `openai` client asks for by default and decodes itself.
"""
from __future__ import annotations

import asyncio
import base64
import sys
import uuid
from typing import Any, Optional

import torch

from vllm.entrypoints.openai.errors import BadRequestError
from vllm.entrypoints.openai.protocol import UsageInfo
from vllm.entrypoints.openai.protocol_pooling import (ClassificationData, ClassificationRequest,
                                                      ClassificationResponse, EmbeddingRequest,
                                                      EmbeddingResponse,
                                                      EmbeddingResponseData, PoolingRequest,
                                                      PoolingResponse, PoolingResponseData)
from vllm.entrypoints.openai.serving_engine import OpenAIServing, PromptInput
from vllm.pooling_params import PoolingParams

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def encode_vector(vector: torch.Tensor, encoding_format: str, embed_dtype: str = "float32",
                  endianness: str = "native") -> Any:
    """A vector as the API returns it: a list of floats, or base64 of its bytes."""
    if encoding_format == "float":
        return vector.float().tolist()
    data = vector.to(_DTYPES[embed_dtype]).contiguous().view(torch.uint8).numpy().tobytes()
    if endianness != "native" and endianness != sys.byteorder:
        width = _DTYPES[embed_dtype].itemsize
        data = b"".join(data[i:i + width][::-1] for i in range(0, len(data), width))
    return base64.b64encode(data).decode("ascii")


class OpenAIServingPooling(OpenAIServing):
    """Embeddings, raw pooling and classification over one pooling model."""

    def __init__(self, *args: Any, chat: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.chat = chat
        """The chat handler, whose template renders `messages` inputs (embeddings)."""

    # ------------------------------------------------------------- routes
    async def create_embedding(self, request: EmbeddingRequest) -> EmbeddingResponse:
        self._check_task("embed", "Embeddings API")
        params = PoolingParams(task="embed", dimensions=request.dimensions,
                               use_activation=request.use_activation)
        model, outputs, usage = await self._run(request, request.input, params)
        data = [EmbeddingResponseData(index=i, embedding=encode_vector(
            o.outputs.data, request.encoding_format, request.embed_dtype, request.endianness))
            for i, o in enumerate(outputs)]
        return EmbeddingResponse(model=model, data=data, usage=usage)

    async def create_pooling(self, request: PoolingRequest) -> PoolingResponse:
        task = request.task or self.model_config.pooling_task
        self._check_task(task, "Pooling API")
        params = PoolingParams(task=task, dimensions=request.dimensions,
                               use_activation=request.use_activation)
        model, outputs, usage = await self._run(request, request.input, params)
        data = [PoolingResponseData(index=i, data=encode_vector(
            o.outputs.data, request.encoding_format, request.embed_dtype, request.endianness))
            for i, o in enumerate(outputs)]
        return PoolingResponse(model=model, data=data, usage=usage)

    async def create_classify(self, request: ClassificationRequest) -> ClassificationResponse:
        self._check_task("classify", "Classification API")
        params = PoolingParams(task="classify", use_activation=request.use_activation)
        model, outputs, usage = await self._run(request, request.input, params)
        labels = getattr(self.model_config.hf_config, "id2label", None) or {}
        data = []
        for i, o in enumerate(outputs):
            probs = o.outputs.data.float().tolist()
            best = max(range(len(probs)), key=probs.__getitem__)
            data.append(ClassificationData(index=i, label=labels.get(best), probs=probs,
                                           num_classes=len(probs)))
        return ClassificationResponse(model=model, data=data, usage=usage)

    # ------------------------------------------------------------ helpers
    def _check_task(self, task: str, api: str) -> None:
        if self.model_config.runner_type != "pooling":
            raise BadRequestError(f"The model does not support {api}: it is not a pooling "
                                  "model (serve it with --runner pooling).", param="model")
        if task != self.model_config.pooling_task:
            raise BadRequestError(f"The model does not support {api} (task {task!r}); its "
                                  f"task is {self.model_config.pooling_task!r}.")

    async def _run(self, request: Any, inputs: Any, params: PoolingParams
                   ) -> tuple[str, list[Any], UsageInfo]:
        """(served model name, one PoolingRequestOutput per input, usage)."""
        model = self.check_model(request.model)
        await self.check_engine()
        chat_body = request.chat_body() if hasattr(request, "chat_body") else None
        if chat_body is not None:
            prompts = [await self._render_chat(chat_body, request)]
        elif inputs is None:
            raise BadRequestError("Give input (or messages).", param="input")
        else:
            prompts = await self.pooling_prompts(inputs, request)
        outputs = await self.pool(prompts, [params] * len(prompts), request.model,
                                  request.request_id)
        n = sum(len(p.token_ids) for p in prompts)
        return model, outputs, UsageInfo(prompt_tokens=n, total_tokens=n,
                                         completion_tokens=0)

    async def _render_chat(self, body: dict[str, Any], request: Any) -> PromptInput:
        """`messages` through the chat template (the server's, or a trusted request's)."""
        import pydantic

        from vllm.entrypoints.openai.errors import validation_error
        from vllm.entrypoints.openai.protocol import ChatCompletionRequest
        if self.chat is None:
            raise BadRequestError("messages are not supported by this route.",
                                  param="messages")
        try:
            chat_request = ChatCompletionRequest.model_validate(body)
        except pydantic.ValidationError as e:
            raise validation_error(e.errors()) from None
        prompt = await self.chat.render_prompt(chat_request)
        ids = self.truncate(prompt.token_ids, request.truncate_prompt_tokens,
                            self.max_model_len, request.truncation_side or "right")
        return PromptInput(ids, prompt.text)

    async def pooling_prompts(self, inputs: Any, request: Any,
                              param: Optional[str] = "input") -> list[PromptInput]:
        """The request's `input` as token-id prompts (tokenized off the event loop,
        truncated as asked); at most VLLM_MAX_COMPLETION_PROMPTS of them (`param` names
        the field in the 400; None: the caller has bounded them)."""
        if isinstance(inputs, str):
            items: list[Any] = [inputs]
        elif inputs and all(isinstance(t, int) for t in inputs):
            items = [list(inputs)]
        else:
            items = list(inputs)
        if not items:
            raise BadRequestError("input must not be empty.", param="input")
        if param is not None:
            self.check_num_prompts(len(items), param)
        prompts = []
        # Pooling keeps a text's beginning by default (vLLM's pooling tokenizers truncate
        # on the right); [CLS] and the other special tokens stay either way.
        side = request.truncation_side or "right"
        encoded = iter(await self.tokenize_texts(
            [item for item in items if isinstance(item, str)], request.add_special_tokens,
            "input", request.truncate_prompt_tokens, side))
        for item in items:
            if isinstance(item, str):
                ids, text = next(encoded), item
            else:
                ids, text = list(item), None
                self.check_token_ids(ids, "input")
            ids = self.truncate(ids, request.truncate_prompt_tokens, self.max_model_len, side,
                                specials=text is not None and request.add_special_tokens)
            prompts.append(PromptInput(ids, text))
        return prompts

    async def pool(self, prompts: list[PromptInput], params: list[PoolingParams],
                   model: Optional[str], request_id: Optional[str]) -> list[Any]:
        """Queue every prompt, then wait for each one's output (in order). A refused
        prompt (too long, bad params) is a 400 naming the engine's reason; the ones
        already queued are aborted."""
        base = request_id or uuid.uuid4().hex
        streams = []
        try:
            for i, (prompt, p) in enumerate(zip(prompts, params)):
                streams.append(await self.add_request(f"{base}-{i}", prompt.engine_prompt(),
                                                      p, model))
        except ValueError as e:
            await self.engine.abort([s.request_id for s in streams])
            raise BadRequestError(str(e), param="input") from None
        return await asyncio.gather(*(self._final(s) for s in streams))

    async def _final(self, stream: Any) -> Any:
        last = None
        async for output in self.engine.iterate(stream):
            last = output
        if last is None or last.outputs.data.numel() == 0:
            raise BadRequestError("The request was aborted.")
        return last
