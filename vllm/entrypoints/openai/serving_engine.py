"""What the completion, chat and tokenization handlers share.

Model-name checks, prompt tokenization (off the event loop), request -> SamplingParams of
what the client sent (the engine completes and checks them: vllm/engine/params.py), the
engine's context-length errors in vLLM's server wording, logprobs in OpenAI's shapes, and
a merge of several output streams (one per prompt) into one.
"""
from __future__ import annotations

import asyncio
import copy
import json
import logging
import re
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional, Sequence

import vllm.envs as envs
from vllm.engine.params import (MaxTokensTooLargeError, PriorityNotEnabledError,
                                PromptTooLongError, RequestParamsPolicy, truncation_size)
from vllm.engine.protocol import EngineClient
from vllm.entrypoints.openai.errors import (BadRequestError, InternalServerError,
                                            NotFoundError, OpenAIError,
                                            ServiceUnavailableError)
from vllm.entrypoints.openai.protocol import (ChatCompletionLogProb, ChatCompletionLogProbs,
                                              ChatCompletionLogProbsContent, CompletionLogProbs,
                                              Logprob, PromptTokensDetails, SamplingFields,
                                              UsageInfo, random_uuid)
from vllm.entrypoints.openai.serving_models import OpenAIServingModels
from vllm.entrypoints.openai.structured_outputs import (check_structured_outputs,
                                                        structured_outputs_from_request)
from vllm.entrypoints.openai.tokenizer_pool import TokenizerPool
from vllm.sampling_params import LogprobsTooLargeError

logger = logging.getLogger(__name__)

_MODEL_DEFAULTED = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                    "presence_penalty", "frequency_penalty")
"""Sampling fields a request may leave unset (null) for the engine to fill from the
model's generation config, else vLLM's defaults."""

LOGPROB_FLOOR = -9999.0
"""OpenAI clients cannot parse -inf; vLLM clamps logprobs to this value."""


@dataclass
class PromptInput:
    """One prompt ready for the engine: its token ids and, when known, its text."""
    token_ids: list[int]
    text: Optional[str] = None
    multi_modal_data: Optional[dict[str, Any]] = None
    """Images of a chat prompt: the engine's processor expands their placeholders in
    `text`, so `token_ids` are then the unexpanded ones."""

    def engine_prompt(self, cache_salt: Optional[str] = None) -> dict[str, Any]:
        if self.multi_modal_data:
            prompt: dict[str, Any] = {"prompt": self.text,
                                      "multi_modal_data": self.multi_modal_data}
        else:
            prompt = {"prompt_token_ids": self.token_ids}
            if self.text is not None:
                prompt["prompt"] = self.text
        if cache_salt is not None:
            prompt["cache_salt"] = cache_salt
        return prompt


class OpenAIServing:
    """Base of the route handlers; holds the engine, the served names and a tokenizer copy."""

    def __init__(self, engine: EngineClient, models: OpenAIServingModels, *,
                 tokenizer: Any, return_tokens_as_token_ids: bool = False,
                 tokenizer_pool: Optional[TokenizerPool] = None,
                 enable_prompt_tokens_details: bool = False,
                 system_fingerprint: Optional[str] = None) -> None:
        self.engine = engine
        self.models = models
        self.model_config = engine.model_config
        self.max_model_len: int = engine.model_config.max_model_len
        self.tokenizer = tokenizer
        self.return_tokens_as_token_ids = return_tokens_as_token_ids
        self.enable_prompt_tokens_details = enable_prompt_tokens_details
        self.system_fingerprint = system_fingerprint
        """Stamped on completions and chat responses (fingerprint.py); None: null."""
        # Tokenizing and template rendering run on a small pool of threads, never on the
        # event loop, and no single prompt can hold them long (see tokenizer_pool.py).
        self.tokenizer_pool = tokenizer_pool or TokenizerPool(tokenizer)
        self._params_policy: Optional[RequestParamsPolicy] = None

    # --------------------------------------------------------------- checks
    def check_model(self, model: Optional[str]) -> str:
        """The served name to answer with; 404 for a model this server does not serve."""
        if model is None or model == "":
            return self.models.default_name
        if not self.models.is_served(model):
            raise NotFoundError(f"The model `{model}` does not exist.", param="model")
        return model

    async def add_request(self, request_id: str, prompt: Any, params: Any,
                          model: Optional[str], priority: int = 0,
                          trace_headers: Optional[dict[str, str]] = None) -> Any:
        """Queue one engine request, with the LoRA adapter `model` names (if any), the
        request's `priority` (vLLM's extra field) and the client's trace context."""
        extra: dict[str, Any] = {}
        lora = self.models.lora_request_for(model)
        if lora is not None:
            extra["lora_request"] = lora
        if priority:
            extra["priority"] = priority
        if trace_headers:
            extra["trace_headers"] = trace_headers
        return await self.engine.add_request(request_id, prompt, params, **extra)

    @staticmethod
    def request_ids(prefix: str, client_id: Optional[str]) -> tuple[str, str]:
        """(response id, engine id) of a request. A client's request_id (the body's, or
        the X-Request-Id header's) names the response, as in vLLM; the engine's id adds
        a random suffix, so that concurrent requests reusing one id do not collide."""
        if not client_id:
            response_id = f"{prefix}-{random_uuid()}"
            return response_id, response_id
        response_id = f"{prefix}-{client_id}"
        return response_id, f"{response_id}-{random_uuid()[:8]}"

    @staticmethod
    def check_supported(request: Any) -> None:
        refused = request.unsupported_fields()
        if refused is not None:
            field, reason = refused
            raise BadRequestError(reason, param=field)

    async def check_engine(self) -> None:
        if self.engine.is_stopped:
            raise ServiceUnavailableError(str(self.engine.dead_error))

    # ----------------------------------------------------------- tokenizing
    async def run_blocking(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await self.tokenizer_pool.run(fn, *args, **kwargs)

    async def tokenize_text(self, text: str, add_special_tokens: bool, param: str = "prompt",
                            truncate_prompt_tokens: Optional[int] = None,
                            truncation_side: Optional[str] = None,
                            max_tokens: Optional[int] = None) -> list[int]:
        """Token ids of `text`, refusing up front a text too long for any truncation-free
        prompt (it could only waste the tokenizer's time and memory).

        With truncate_prompt_tokens only the tail that can hold the kept tokens is encoded
        (twice the characters they can spell), so a huge text costs no more than a short
        one; the kept tokens are the text's last ones, as in vLLM (its first ones with
        truncation_side='right').
        """
        text = self._text_to_encode(text, param, truncate_prompt_tokens, truncation_side,
                                    max_tokens)
        return await self.tokenizer_pool.encode(text, add_special_tokens)

    async def tokenize_texts(self, texts: Sequence[str], add_special_tokens: bool,
                             param: str = "prompt",
                             truncate_prompt_tokens: Optional[int] = None,
                             truncation_side: Optional[str] = None,
                             max_tokens: Optional[int] = None) -> list[list[int]]:
        """`tokenize_text` of each text, encoded together in one pool job (a batch of
        prompts in one request)."""
        kept = [self._text_to_encode(text, param, truncate_prompt_tokens, truncation_side,
                                     max_tokens) for text in texts]
        return await self.tokenizer_pool.encode_many(kept, add_special_tokens)

    def _text_to_encode(self, text: str, param: str, truncate_prompt_tokens: Optional[int],
                        truncation_side: Optional[str], max_tokens: Optional[int]) -> str:
        """The part of `text` worth encoding: its tail (head with truncation_side='right')
        that can hold the kept tokens, or all of it after the too-long check."""
        keep = check_truncate_prompt_tokens(truncate_prompt_tokens, self.max_model_len,
                                            max_tokens)
        if keep is not None:
            part = 2 * self.tokenizer_pool.max_prompt_chars(keep)
            if len(text) > part:
                text = text[:part] if truncation_side == "right" else text[-part:]
        else:
            self.check_prompt_chars(len(text), param)
        return text

    @staticmethod
    def check_num_prompts(num_prompts: int, param: str, what: str = "prompts") -> None:
        """400 for more prompts in one request than VLLM_MAX_COMPLETION_PROMPTS: each
        becomes an engine request, so one body could otherwise queue thousands (10,000
        took the frontend over a minute) ahead of everybody else's."""
        limit = envs.VLLM_MAX_COMPLETION_PROMPTS
        if num_prompts > limit:
            raise BadRequestError(
                f"{param} holds {num_prompts} {what}; one request may hold at most {limit} "
                f"(VLLM_MAX_COMPLETION_PROMPTS). Split them over several requests.",
                param=param)

    def check_prompt_chars(self, num_chars: int, param: str, what: str = "prompt") -> None:
        """400 for a text with more characters than max_model_len tokens can spell."""
        limit = self.tokenizer_pool.max_prompt_chars(self.max_model_len)
        if num_chars > limit:
            raise BadRequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, your {what} has {num_chars} characters, more than that many tokens "
                f"can hold ({limit} characters at most with this tokenizer). Please reduce "
                f"the length of the input {what}.", param=param)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def check_token_ids(self, token_ids: Sequence[int], param: str) -> None:
        vocab = max(len(self.tokenizer), self.model_config.vocab_size
                    if self.model_config.hf_config is not None else 0)
        if not token_ids or (0 <= min(token_ids) and max(token_ids) < vocab):
            return  # min/max in C: a long list costs the event loop little
        tid = next(t for t in token_ids if not 0 <= t < vocab)
        raise BadRequestError(f"Token id {tid} is out of vocabulary (valid: 0 to "
                              f"{vocab - 1}).", param=param)

    def truncate(self, token_ids: list[int], truncate_prompt_tokens: Optional[int],
                 max_model_len: int, truncation_side: Optional[str] = None,
                 max_tokens: Optional[int] = None, specials: bool = False) -> list[int]:
        """Keep the last `truncate_prompt_tokens` tokens (-1: as many as leave room for
        `max_tokens`), as vLLM does; the first ones with truncation_side='right'.

        `specials`: the ids come from tokenizing text with the tokenizer's special tokens
        (BERT's [CLS] ... [SEP], a BOS). Those stay and the text's tokens between them are
        cut, as the tokenizer's own truncation (what vLLM calls) does: an embedding model
        pooling [CLS] must still see it."""
        keep = check_truncate_prompt_tokens(truncate_prompt_tokens, max_model_len, max_tokens)
        if keep is None or len(token_ids) <= keep:
            return token_ids
        head, tail = self.special_token_ends() if specials else (0, 0)
        if head + tail >= keep:
            head = tail = 0
        body = token_ids[head:len(token_ids) - tail]
        n = keep - head - tail
        body = body[:n] if truncation_side == "right" else body[-n:]
        return token_ids[:head] + body + token_ids[len(token_ids) - tail:]

    def special_token_ends(self) -> tuple[int, int]:
        """(tokens the tokenizer adds before a text, after it) with special tokens on:
        found by tokenizing a word both ways (fast tokenizers add them in their
        post-processor, so no method of the tokenizer says)."""
        cached = getattr(self, "_special_ends", None)
        if cached is None:
            plain = self.tokenizer("hello", add_special_tokens=False)["input_ids"]
            full = self.tokenizer("hello", add_special_tokens=True)["input_ids"]
            cached = (0, 0)
            for start in range(len(full) - len(plain) + 1):
                if full[start:start + len(plain)] == plain:
                    cached = (start, len(full) - start - len(plain))
                    break
            self._special_ends = cached
        return cached

    def check_requested_max_tokens(self, requested: Optional[int],
                                   max_tokens_param: str = "max_tokens") -> None:
        """The body's max_tokens must be positive; the engine resolves the rest."""
        if requested is not None and requested < 1:
            raise BadRequestError(f"{max_tokens_param} must be at least 1, got {requested}.",
                                  param=max_tokens_param)

    def engine_error(self, error: ValueError, what: str, param: str,
                     max_tokens_param: str = "max_tokens",
                     logprobs_param: str = "logprobs") -> BadRequestError:
        """The 400 for a request the engine refused, worded for this API: a prompt too
        long (`param` names it, `what` is "prompt" or "messages"), a max_tokens beyond
        the context, or logprobs above --max-logprobs (named as the request's field);
        otherwise the engine's message."""
        if isinstance(error, LogprobsTooLargeError):
            field = logprobs_param if error.name == "logprobs" else error.name
            return BadRequestError(f"{field}={error.value} is larger than the maximum of "
                                   f"{error.cap} (--max-logprobs).", param=field)
        if isinstance(error, PromptTooLongError):
            return BadRequestError(
                f"This model's maximum context length is {error.max_model_len} tokens. "
                f"However, your request has {error.prompt_len} input tokens. Please reduce "
                f"the length of the input {what}.", param=param)
        if isinstance(error, PriorityNotEnabledError):
            return BadRequestError(str(error), param="priority")
        if isinstance(error, MaxTokensTooLargeError):
            n, requested = error.prompt_len, error.max_tokens
            return BadRequestError(
                f"This model's maximum context length is {error.max_model_len} tokens. "
                f"However, you requested {n + requested} tokens ({n} in the {what}, "
                f"{requested} in the completion). Please reduce the length of the {what} "
                "or completion.", param=max_tokens_param)
        return BadRequestError(str(error))

    def beam_search_max_tokens(self, prompt_len: int, requested: Optional[int],
                               what: str, param: str) -> int:
        """Beam search runs here, as one-token engine requests per step, so its length is
        resolved up front, by the engine's own rules (vllm/engine/params.py)."""
        from vllm.sampling_params import SamplingParams
        if self._params_policy is None:
            self._params_policy = RequestParamsPolicy.from_model_config(self.model_config)
        self.check_requested_max_tokens(requested)
        try:
            self._params_policy.check_prompt_length(prompt_len)
            return self._params_policy.resolve_max_tokens(
                prompt_len, SamplingParams.from_client(max_tokens=requested))
        except ValueError as e:
            raise self.engine_error(e, what, param) from e

    def usage(self, prompt_tokens: int, completion_tokens: int,
              num_cached_tokens: Optional[int] = None) -> UsageInfo:
        """Usage as vLLM reports it: prompt_tokens_details.cached_tokens (prompt tokens
        served from the prefix cache) only with --enable-prompt-tokens-details."""
        details = None
        if self.enable_prompt_tokens_details and num_cached_tokens is not None:
            details = PromptTokensDetails(cached_tokens=num_cached_tokens)
        return UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                         total_tokens=prompt_tokens + completion_tokens,
                         prompt_tokens_details=details)

    def _last_chunk_fingerprint(self, request: Any, finish_reason: Optional[str]
                                ) -> Optional[str]:
        """A stream chunk's system_fingerprint: vLLM stamps only the stream's end, the
        usage chunk when one follows, else each chunk that finishes a choice."""
        if finish_reason is None or request.include_usage:
            return None
        return self.system_fingerprint

    # ------------------------------------------------------------- sampling
    async def sampling_params(self, request: SamplingFields, *, max_tokens: Optional[int],
                        logprobs: Optional[int], prompt_logprobs: Optional[int],
                        stream: bool, structured_outputs: Optional[tuple[Any, str]] = None,
                        max_tokens_param: str = "max_tokens") -> Any:
        """SamplingParams of what the client sent (`SamplingParams.from_client`): the
        engine fills the fields it left unset from the model's generation config and
        resolves max_tokens (None: as many as fit). `structured_outputs` (params, field
        name) replaces the constraint the request's own fields ask for (tool_choice
        does). The constraint is parsed on a pool thread: a large JSON schema takes the
        grammar compiler a second or more, which on the event loop would stall every
        other request and /health (the compilers release the GIL)."""
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        if stream and getattr(request, "prompt_logprobs", None) is not None:
            raise BadRequestError("`prompt_logprobs` are not available when `stream=True`.",
                                  param="prompt_logprobs")
        self.check_requested_max_tokens(max_tokens, max_tokens_param)
        logit_bias = self._logit_bias(request.logit_bias)
        stop = [request.stop] if isinstance(request.stop, str) else request.stop
        kwargs = dict(
            n=request.n, seed=request.seed, stop=stop or [],
            stop_token_ids=request.stop_token_ids or [],
            include_stop_str_in_output=request.include_stop_str_in_output,
            ignore_eos=request.ignore_eos, max_tokens=max_tokens,
            min_tokens=request.min_tokens, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            skip_special_tokens=request.skip_special_tokens,
            spaces_between_special_tokens=request.spaces_between_special_tokens,
            logit_bias=logit_bias, allowed_token_ids=request.allowed_token_ids,
            bad_words=request.bad_words,
            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
            **{name: getattr(request, name, None) for name in _MODEL_DEFAULTED})
        extra_args = dict(getattr(request, "vllm_xargs", None) or {})
        if request.kv_transfer_params is not None:
            extra_args["kv_transfer_params"] = request.kv_transfer_params
        if extra_args:
            kwargs["extra_args"] = extra_args
        if structured_outputs is None:
            structured_outputs = structured_outputs_from_request(request)
        if structured_outputs is not None:
            so_params, so_param = structured_outputs
            await self.run_blocking(check_structured_outputs, so_params, so_param,
                                    self.structured_outputs_config)
            kwargs["structured_outputs"] = so_params
        try:
            return SamplingParams.from_client(**kwargs)
        except (ValueError, TypeError) as e:
            raise BadRequestError(str(e), param=guess_param(str(e), request)) from e

    @staticmethod
    def check_generation_error(output: Any) -> None:
        """A 500 for a request the engine ended with finish reason "error" (its KV could
        not be loaded from a prefill instance, or a custom logits processor raised on
        it): it has no usable completion."""
        if any(c.finish_reason == "error" for c in output.outputs):
            raise InternalServerError(
                f"Request {output.request_id} failed in the engine: its KV cache could not "
                "be loaded from the prefill instance, or a custom logits processor raised "
                "(see the server log).")

    @property
    def structured_outputs_config(self) -> Any:
        vllm_config = getattr(self.engine, "vllm_config", None)
        return getattr(vllm_config, "structured_outputs_config", None)

    @staticmethod
    def _logit_bias(bias: Optional[dict[str, float]]) -> Optional[dict[int, float]]:
        if not bias:
            return None
        out: dict[int, float] = {}
        for key, value in bias.items():
            try:
                token_id = int(key)
            except ValueError:
                raise BadRequestError(f"logit_bias keys must be token ids, got {key!r}.",
                                      param="logit_bias") from None
            out[token_id] = min(100.0, max(-100.0, value))
        return out

    # ------------------------------------------------------------- logprobs
    def token_text(self, token_id: int, logprob: Any = None, as_ids: bool = False) -> str:
        if as_ids or self.return_tokens_as_token_ids:
            return f"token_id:{token_id}"
        decoded = getattr(logprob, "decoded_token", None)
        if decoded is not None:
            return decoded
        return self.tokenizer.decode([token_id])

    def completion_logprobs(self, token_ids: Sequence[int], steps: Sequence[Optional[dict]],
                            num_top: int, text_offset: int, as_ids: bool = False,
                            ) -> CompletionLogProbs:
        """OpenAI's completions logprobs: tokens, token_logprobs, top_logprobs, text_offset.

        `steps[i]` is the engine's {token_id: Logprob} for token i (None for the first
        prompt token, which nothing predicts). top_logprobs keeps the chosen token and the
        `num_top` best ones.
        """
        result = CompletionLogProbs()
        offset = text_offset
        for i, token_id in enumerate(token_ids):
            step = steps[i] if i < len(steps) else None
            chosen = step.get(token_id) if step else None
            token = self.token_text(token_id, chosen, as_ids)
            result.tokens.append(token)
            result.text_offset.append(offset)
            offset += len(token)
            if step is None or chosen is None:
                result.token_logprobs.append(None)
                result.top_logprobs.append(None)
                continue
            result.token_logprobs.append(max(chosen.logprob, LOGPROB_FLOOR))
            top: dict[str, float] = {}
            for tid, lp in step.items():
                if tid == token_id or (lp.rank is not None and lp.rank <= num_top):
                    top.setdefault(self.token_text(tid, lp, as_ids),
                                   max(lp.logprob, LOGPROB_FLOOR))
            result.top_logprobs.append(top)
        return result

    def chat_logprobs(self, token_ids: Sequence[int], steps: Sequence[Optional[dict]],
                      num_top: int, as_ids: bool = False) -> ChatCompletionLogProbs:
        """OpenAI's chat logprobs: content[{token, logprob, bytes, top_logprobs}]."""
        content = []
        for i, token_id in enumerate(token_ids):
            step = (steps[i] if i < len(steps) else None) or {}
            chosen = step.get(token_id)
            token = self.token_text(token_id, chosen, as_ids)
            ranked = sorted(((lp.rank, tid, lp) for tid, lp in step.items()
                             if lp.rank is not None), key=lambda t: t[0])[:num_top]
            top = [ChatCompletionLogProb(
                token=(text := self.token_text(tid, lp, as_ids)),
                logprob=max(lp.logprob, LOGPROB_FLOOR),
                bytes=list(text.encode("utf-8", errors="replace"))) for _, tid, lp in ranked]
            content.append(ChatCompletionLogProbsContent(
                token=token,
                logprob=max(chosen.logprob, LOGPROB_FLOOR) if chosen is not None
                else LOGPROB_FLOOR,
                bytes=list(token.encode("utf-8", errors="replace")), top_logprobs=top))
        return ChatCompletionLogProbs(content=content)

    @staticmethod
    def prompt_logprobs_json(prompt_logprobs: Any) -> Optional[list[Optional[dict[int, Logprob]]]]:
        if prompt_logprobs is None:
            return None
        return [None if step is None else
                {tid: Logprob(logprob=max(lp.logprob, LOGPROB_FLOOR), rank=lp.rank,
                              decoded_token=lp.decoded_token) for tid, lp in step.items()}
                for step in prompt_logprobs]


# -------------------------------------------------------------------- helpers
def check_truncate_prompt_tokens(value: Optional[int], max_model_len: int,
                                 max_tokens: Optional[int] = None) -> Optional[int]:
    """How many prompt tokens truncate_prompt_tokens keeps (None: no truncation); the
    engine's rule (params.truncation_size), its ValueError as the client's 400."""
    try:
        return truncation_size(value, max_model_len, max_tokens)
    except ValueError as e:
        raise BadRequestError(str(e), param="truncate_prompt_tokens") from e


def copy_tokenizer(tokenizer: Any) -> Any:
    """A private tokenizer for the server thread (the engine thread keeps its own)."""
    try:
        return copy.deepcopy(tokenizer)
    except Exception:  # noqa: BLE001 - sharing is the safe fallback for read-only use
        return tokenizer


_FIELD_RE = re.compile(r"[A-Za-z_]+")


def guess_param(message: str, request: Any) -> Optional[str]:
    """The request field an engine ValueError names (its first word usually is one)."""
    names = set(type(request).model_fields)
    aliases = {"max_tokens": "max_tokens", "logprobs": "logprobs"}
    for word in _FIELD_RE.findall(message)[:6]:
        if word in names or word in aliases:
            if word == "max_tokens" and "max_completion_tokens" in names and \
                    getattr(request, "max_completion_tokens", None) is not None:
                return "max_completion_tokens"
            return word
    return None


def sse(data: Any) -> str:
    """One server-sent event carrying a JSON payload."""
    text = data if isinstance(data, str) else data.model_dump_json()
    return f"data: {text}\n\n"


async def parsed_chunks(chunks: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    """A chat completion stream read back as dicts, up to its [DONE] (for the routes
    served by the chat code: Responses, Anthropic Messages); the stream is closed when
    the reader stops, which aborts its request if it had not finished."""
    try:
        async for text in chunks:
            payload = text.removeprefix("data: ").strip()
            if payload == "[DONE]":
                return
            yield json.loads(payload)
    finally:
        await chunks.aclose()


SSE_DONE = "data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
"""Headers of every event-stream response (no caching, no proxy buffering)."""


def sse_error(err: BaseException) -> str:
    """A stream's error event: the OpenAI error body (500 only for unexpected faults)."""
    if isinstance(err, OpenAIError):
        body = err.to_response()
    elif isinstance(err, ValueError):
        body = BadRequestError(str(err)).to_response()
    else:
        from vllm.engine.protocol import EngineDeadError
        status = 503 if isinstance(err, EngineDeadError) else 500
        from vllm.entrypoints.openai.errors import error_type_for, make_error
        body = make_error(str(err) or type(err).__name__, error_type_for(status), status)
    return sse(body.model_dump_json())


async def merge_async_iterators(*iterators: AsyncIterator[Any]) -> AsyncIterator[tuple[int, Any]]:
    """Yield (index, item) from several async iterators as items arrive.

    When the consumer stops early (or fails), every source is closed, which aborts its
    request in the engine.
    """
    if len(iterators) == 1:
        try:
            async for item in iterators[0]:
                yield 0, item
        finally:
            await _aclose(iterators[0])
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, iterator: AsyncIterator[Any]) -> None:
        try:
            async for item in iterator:
                await queue.put((index, item))
            await queue.put((index, done))
        except BaseException as e:  # noqa: BLE001 - forwarded to the consumer
            await queue.put((index, e))
            if isinstance(e, asyncio.CancelledError):
                raise

    tasks = [asyncio.create_task(pump(i, it)) for i, it in enumerate(iterators)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for it in iterators:
            await _aclose(it)


async def _aclose(iterator: Any) -> None:
    close = getattr(iterator, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass
