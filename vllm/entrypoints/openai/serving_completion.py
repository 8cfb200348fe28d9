"""POST /v1/completions: one engine request per prompt, n choices each.

Choice indices run prompt-major: prompt i's j-th completion is choice i * n + j, as in vLLM.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, AsyncIterator, Optional, Union

from vllm.beam_search import BeamSearch
from vllm.entrypoints.openai.errors import BadRequestError
from vllm.entrypoints.openai.protocol import (CompletionRequest, CompletionResponse,
                                              CompletionResponseChoice,
                                              CompletionResponseStreamChoice,
                                              CompletionStreamResponse)
from vllm.entrypoints.openai.serving_engine import (SSE_DONE, OpenAIServing, PromptInput,
                                                   merge_async_iterators, sse, sse_error)
from vllm.entrypoints.openai.stream_interval import batch_stream
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import BeamSearchParams


class OpenAIServingCompletion(OpenAIServing):

    async def create_completion(self, request: CompletionRequest,
                                trace_headers: Optional[dict[str, str]] = None,
                                ) -> Union[CompletionResponse, AsyncIterator[str]]:
        model_name = self.check_model(request.model)
        self.check_supported(request)
        await self.check_engine()
        prompts = await self._prompt_inputs(request)
        response_id, base_id = self.request_ids("cmpl", request.request_id)
        if request.use_beam_search:
            return await self._beam_search(request, prompts, base_id, model_name,
                                           response_id)
        # echo + logprobs returns the prompt's logprobs too, so ask the engine for them.
        prompt_logprobs = request.prompt_logprobs
        if request.echo and request.logprobs is not None and prompt_logprobs is None:
            prompt_logprobs = request.logprobs
        # echo with max_tokens 0 (log-likelihood scoring, e.g. lm-eval): the prompt and its
        # logprobs only. The engine computes one token, which the response leaves out
        # but counts in usage, as vLLM does.
        echo_only = _echo_only(request)
        params = await self.sampling_params(
            request, max_tokens=1 if echo_only else request.max_tokens,
            logprobs=request.logprobs, prompt_logprobs=prompt_logprobs,
            stream=bool(request.stream))
        jobs = []
        for i, prompt in enumerate(prompts):
            request_id = base_id if len(prompts) == 1 else f"{base_id}-{i}"
            jobs.append((request_id, prompt.engine_prompt(request.cache_salt), params))
        # Submit every prompt at once: acceptance happens between engine steps, so
        # awaiting them one by one would cost one step per prompt. The engine checks
        # each; if one is refused, the accepted ones are aborted.
        results = await asyncio.gather(*(self.add_request(*job, request.model, request.priority,
                                                          trace_headers) for job in jobs),
                                       return_exceptions=True)
        streams = [r for r in results if not isinstance(r, BaseException)]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.engine.abort([s.request_id for s in streams])
            if isinstance(errors[0], ValueError):
                raise self.engine_error(errors[0], "prompt", "prompt") from errors[0]
            raise errors[0]
        iterators = [self.engine.iterate(s) for s in streams]
        if request.stream and (request.stream_interval or 1) > 1:
            iterators = [batch_stream(it, request.stream_interval) for it in iterators]
        created = int(time.time())
        if request.stream:
            return self._stream(request, prompts, iterators, response_id, created, model_name)
        return await self._full(request, prompts, iterators, response_id, created, model_name)

    async def _prompt_inputs(self, request: CompletionRequest) -> list[PromptInput]:
        prompt = request.prompt
        if isinstance(prompt, str):
            items: list[Any] = [prompt]
        elif not prompt:
            raise BadRequestError("prompt must not be empty.", param="prompt")
        elif isinstance(prompt[0], int):
            items = [prompt]
        else:
            items = list(prompt)
        self.check_num_prompts(len(items), "prompt")
        texts = [item for item in items if isinstance(item, str)]
        encoded = iter(await self.tokenize_texts(texts, request.add_special_tokens, "prompt",
                                                 request.truncate_prompt_tokens,
                                                 request.truncation_side, request.max_tokens))
        inputs = []
        for item in items:
            if isinstance(item, str):
                ids, text = next(encoded), item
            else:
                ids, text = list(item), None
                self.check_token_ids(ids, "prompt")
            ids = self.truncate(ids, request.truncate_prompt_tokens, self.max_model_len,
                                request.truncation_side, request.max_tokens,
                                specials=text is not None and request.add_special_tokens)
            if not ids:
                raise BadRequestError("The prompt is empty (no tokens).", param="prompt")
            if text is None or request.truncate_prompt_tokens is not None:
                text = None
            inputs.append(PromptInput(ids, text))
        return inputs

    # ---------------------------------------------------------- beam search
    async def _beam_search(self, request: CompletionRequest, prompts: list[PromptInput],
                           base_id: str, model_name: str, response_id: str
                           ) -> Union[CompletionResponse, AsyncIterator[str]]:
        """use_beam_search: `n` beams per prompt (vllm/beam_search.py), each choice one
        finished beam, best first; a stream sends each prompt's choices when its search
        ends."""
        searches = []
        for i, prompt in enumerate(prompts):
            max_tokens = self.beam_search_max_tokens(len(prompt.token_ids), request.max_tokens,
                                                     "prompt", "prompt")
            try:
                params = BeamSearchParams(
                    beam_width=request.n, max_tokens=max_tokens,
                    ignore_eos=request.ignore_eos, temperature=request.temperature or 0.0,
                    length_penalty=request.length_penalty,
                    include_stop_str_in_output=request.include_stop_str_in_output)
            except ValueError as e:
                raise BadRequestError(str(e)) from e
            request_id = base_id if len(prompts) == 1 else f"{base_id}-{i}"
            searches.append(self._run_beam_search(request, prompt, params, request_id))
        created = int(time.time())
        if request.stream:
            return self._stream(request, prompts, searches, response_id, created, model_name)
        return await self._full(request, prompts, searches, response_id, created, model_name)

    async def _run_beam_search(self, request: CompletionRequest, prompt: PromptInput,
                               params: BeamSearchParams, request_id: str
                               ) -> AsyncIterator[RequestOutput]:
        search = BeamSearch([prompt.token_ids], params, self.tokenizer.eos_token_id)
        while not search.done:
            batch = search.batch()
            step = search.steps
            outputs = await asyncio.gather(*(
                self._one_token(f"{request_id}-beam{step}-{j}", ids, search.step_params,
                                request.model) for j, ids in enumerate(batch)))
            search.advance(list(outputs))
        result = search.results(lambda ids: self.decode(
            ids, skip_special_tokens=request.skip_special_tokens))[0]
        plen = len(prompt.token_ids)
        yield RequestOutput(request_id, prompt.text, list(prompt.token_ids), None, [
            CompletionOutput(index=i, text=seq.text, token_ids=seq.tokens[plen:],
                             cumulative_logprob=seq.cum_logprob, logprobs=None,
                             finish_reason=seq.finish_reason, stop_reason=seq.stop_reason)
            for i, seq in enumerate(result.sequences)], finished=True)

    async def _one_token(self, request_id: str, token_ids: list[int], params: Any,
                         model: Optional[str]) -> RequestOutput:
        try:
            stream = await self.add_request(request_id, {"prompt_token_ids": token_ids},
                                            params, model)
        except ValueError as e:
            raise BadRequestError(str(e)) from e
        final = None
        async for output in self.engine.iterate(stream):
            final = output
        return final

    def _prompt_text(self, prompt: PromptInput) -> str:
        return prompt.text if prompt.text is not None else self.decode(prompt.token_ids)

    # ------------------------------------------------------------ full body
    async def _full(self, request: CompletionRequest, prompts: list[PromptInput],
                    iterators: list[Any], request_id: str, created: int,
                    model_name: str) -> CompletionResponse:
        finals: list[Any] = [None] * len(prompts)
        async for i, output in merge_async_iterators(*iterators):
            finals[i] = output
        choices = []
        prompt_tokens = completion_tokens = cached_tokens = 0
        with_ids = bool(request.return_token_ids)
        echo_only = _echo_only(request)
        for i, (prompt, final) in enumerate(zip(prompts, finals)):
            self.check_generation_error(final)
            prompt_tokens += len(prompt.token_ids)
            cached_tokens += final.num_cached_tokens or 0
            prompt_text = self._prompt_text(prompt) if request.echo else ""
            for c in sorted(final.outputs, key=lambda c: c.index):
                completion_tokens += len(c.token_ids)
                if echo_only:
                    c = _prompt_only(c)
                logprobs = None
                if request.logprobs is not None:
                    logprobs = self._logprobs(request, prompt, final, c, prompt_text)
                choices.append(CompletionResponseChoice(
                    index=i * request.n + c.index, text=prompt_text + c.text,
                    logprobs=logprobs, finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason,
                    # vLLM returns whatever prompt logprobs the engine computed: asked
                    # for, or implied by echo + logprobs.
                    prompt_logprobs=(self.prompt_logprobs_json(final.prompt_logprobs)
                                     if final.prompt_logprobs is not None else None),
                    prompt_token_ids=list(prompt.token_ids) if with_ids else None,
                    token_ids=list(c.token_ids) if with_ids else None))
        return CompletionResponse(
            id=request_id, created=created, model=model_name, choices=choices,
            usage=self.usage(prompt_tokens, completion_tokens, cached_tokens),
            system_fingerprint=self.system_fingerprint,
            kv_transfer_params=getattr(finals[0], "kv_transfer_params", None))

    def _logprobs(self, request: CompletionRequest, prompt: PromptInput, final: Any,
                  completion: Any, prompt_text: str) -> Any:
        as_ids = bool(request.return_tokens_as_token_ids)
        token_ids = list(completion.token_ids)
        steps = list(completion.logprobs or [])
        if request.echo:
            prompt_steps = list(final.prompt_logprobs or [None] * len(prompt.token_ids))
            token_ids = list(prompt.token_ids) + token_ids
            steps = prompt_steps + steps
        return self.completion_logprobs(token_ids, steps, request.logprobs or 0, 0, as_ids)

    # --------------------------------------------------------------- stream
    async def _stream(self, request: CompletionRequest, prompts: list[PromptInput],
                      iterators: list[Any], request_id: str, created: int,
                      model_name: str) -> AsyncIterator[str]:
        n = request.n
        sent_text_len = [0] * (len(prompts) * n)   # text offset of each choice so far
        echoed = [not request.echo] * (len(prompts) * n)
        prompt_tokens = [len(p.token_ids) for p in prompts]
        completion_tokens = [0] * (len(prompts) * n)  # per choice (continuous usage)
        cached_tokens = [0] * len(prompts)
        as_ids = bool(request.return_tokens_as_token_ids)
        with_ids = bool(request.return_token_ids)
        ids_sent = [False] * (len(prompts) * n)  # prompt_token_ids go in the first chunk
        echo_only = _echo_only(request)
        try:
            async for i, output in merge_async_iterators(*iterators):
                self.check_generation_error(output)
                cached_tokens[i] = output.num_cached_tokens or 0
                for c in output.outputs:
                    index = i * n + c.index
                    completion_tokens[index] += len(c.token_ids)
                    if echo_only:
                        c = _prompt_only(c)
                    new_ids = list(c.token_ids)
                    text = c.text
                    token_ids, steps = list(c.token_ids), list(c.logprobs or [])
                    if not echoed[index]:
                        echoed[index] = True
                        text = self._prompt_text(prompts[i]) + text
                        token_ids = list(prompts[i].token_ids) + token_ids
                        steps = list(output.prompt_logprobs or
                                     [None] * len(prompts[i].token_ids)) + steps
                    if not text and not token_ids and c.finish_reason is None:
                        continue
                    logprobs = None
                    if request.logprobs is not None:
                        logprobs = self.completion_logprobs(token_ids, steps, request.logprobs,
                                                            sent_text_len[index], as_ids)
                    sent_text_len[index] += len(text)
                    usage = None
                    if request.continuous_usage:
                        usage = self.usage(prompt_tokens[i], completion_tokens[index],
                                           cached_tokens[i])
                    prompt_ids = None
                    if with_ids and not ids_sent[index]:
                        ids_sent[index] = True
                        prompt_ids = list(prompts[i].token_ids)
                    yield sse(CompletionStreamResponse(
                        id=request_id, created=created, model=model_name, usage=usage,
                        system_fingerprint=self._last_chunk_fingerprint(request,
                                                                        c.finish_reason),
                        choices=[CompletionResponseStreamChoice(
                            index=index, text=text, logprobs=logprobs,
                            finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                            prompt_token_ids=prompt_ids,
                            token_ids=new_ids if with_ids else None)]))
            if request.include_usage:
                yield sse(CompletionStreamResponse(
                    id=request_id, created=created, model=model_name, choices=[],
                    usage=self.usage(sum(prompt_tokens), sum(completion_tokens),
                                     sum(cached_tokens)),
                    system_fingerprint=self.system_fingerprint))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - reported in-stream (headers are sent)
            yield sse_error(e)
        yield SSE_DONE


def _echo_only(request: CompletionRequest) -> bool:
    """echo with max_tokens 0: the response is the prompt (and its logprobs) alone."""
    return bool(request.echo) and request.max_tokens == 0


def _prompt_only(completion: CompletionOutput) -> CompletionOutput:
    """The completion with its generated part (text, tokens, logprobs) left out: echo
    with max_tokens 0 shows the prompt alone. Its finish reason stays the engine's, and
    usage still counts the token the engine computed, as vLLM reports both."""
    return dataclasses.replace(completion, text="", token_ids=[], logprobs=None,
                               cumulative_logprob=None)
