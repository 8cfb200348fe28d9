"""`/score` (+ `/v1/score`) and `/rerank` (+ `/v1/rerank`, `/v2/rerank`).

A cross-encoder (a one-label classifier) reads each query/document pair as one input,
tokenized together (second segment as token type 1 where the model has token types):
the score is its output (sigmoid of the logit by default, the logit itself with
`use_activation: false`). An embedding model (bi-encoder) embeds every distinct text
once; the score is the cosine similarity of the two embeddings. Rerank sorts the
documents by score, best first, and keeps the `top_n` best (0: all).
"""
from __future__ import annotations

from typing import Any

import torch.nn.functional as F

from vllm.entrypoints.openai.errors import BadRequestError
from vllm.entrypoints.openai.protocol import UsageInfo
from vllm.entrypoints.openai.protocol_pooling import (RerankDocument, RerankRequest,
                                                      RerankResponse, RerankResult,
                                                      RerankUsage, ScoreRequest, ScoreResponse,
                                                      ScoreResponseData)
from vllm.entrypoints.openai.serving_engine import PromptInput
from vllm.entrypoints.openai.serving_pooling import OpenAIServingPooling
from vllm.entrypoints.score_utils import cross_encoder_prompt, pair_inputs, score_text
from vllm.pooling_params import PoolingParams


class OpenAIServingScores(OpenAIServingPooling):

    async def create_score(self, request: ScoreRequest) -> ScoreResponse:
        try:
            first, second = pair_inputs(*request.pair())
        except ValueError as e:
            raise BadRequestError(str(e)) from None
        self.check_num_prompts(len(second), _second_field(request), "pairs")
        model, scores, num_tokens = await self._scores(request, first, second)
        return ScoreResponse(model=model, data=[ScoreResponseData(index=i, score=s)
                                                for i, s in enumerate(scores)],
                             usage=UsageInfo(prompt_tokens=num_tokens,
                                             total_tokens=num_tokens, completion_tokens=0))

    async def create_rerank(self, request: RerankRequest) -> RerankResponse:
        if not request.documents:
            raise BadRequestError("documents must not be empty.", param="documents")
        self.check_num_prompts(len(request.documents), "documents", "documents")
        model, scores, num_tokens = await self._scores(
            request, [request.query] * len(request.documents), list(request.documents))
        order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
        if request.top_n:
            order = order[:request.top_n]
        results = [RerankResult(index=i, document=RerankDocument(text=request.documents[i]),
                                relevance_score=scores[i]) for i in order]
        return RerankResponse(model=model, results=results,
                              usage=RerankUsage(prompt_tokens=num_tokens,
                                                total_tokens=num_tokens))

    # ------------------------------------------------------------ scoring
    async def _scores(self, request: Any, first: list, second: list
                      ) -> tuple[str, list[float], int]:
        """(model name, one score per pair, prompt tokens used)."""
        model = self.check_model(request.model)
        await self.check_engine()
        task = self.model_config.pooling_task
        if self.model_config.runner_type != "pooling" or task is None:
            raise BadRequestError("The model does not support Score API: it is not a "
                                  "pooling model.", param="model")
        try:
            texts_1 = [score_text(x) for x in first]
            texts_2 = [score_text(x) for x in second]
        except ValueError as e:
            raise BadRequestError(str(e)) from None
        if task == "embed":
            return (model, *await self._bi_encoder(request, texts_1, texts_2))
        if getattr(self.model_config.hf_config, "num_labels", 0) != 1:
            raise BadRequestError("Scoring API is only enabled for num_labels == 1.")
        return (model, *await self._cross_encoder(request, texts_1, texts_2))

    async def _cross_encoder(self, request: Any, texts_1: list[str], texts_2: list[str]
                             ) -> tuple[list[float], int]:
        prompts, params = [], []
        for a, b in zip(texts_1, texts_2):
            self.check_prompt_chars(len(a) + len(b), "documents")
            prompt, split = await self.run_blocking(
                cross_encoder_prompt, self.tokenizer, a, b, self.model_config.hf_config)
            ids = self.truncate(prompt["prompt_token_ids"], request.truncate_prompt_tokens,
                                self.max_model_len, request.truncation_side or "right",
                                specials=True)
            p = PoolingParams(task="classify", use_activation=request.use_activation)
            if split is not None and split < len(ids):
                p.extra_kwargs = {"compressed_token_type_ids": split}
            prompts.append(PromptInput(ids))
            params.append(p)
        outputs = await self.pool(prompts, params, request.model, request.request_id)
        return ([float(o.outputs.data.reshape(-1)[0]) for o in outputs],
                sum(len(p.token_ids) for p in prompts))

    async def _bi_encoder(self, request: Any, texts_1: list[str], texts_2: list[str]
                          ) -> tuple[list[float], int]:
        texts = list(dict.fromkeys(texts_1 + texts_2))
        prompts = await self.pooling_prompts(texts, request, param=None)  # pairs bounded
        params = PoolingParams(task="embed", use_activation=request.use_activation)
        outputs = await self.pool(prompts, [params] * len(prompts), request.model,
                                  request.request_id)
        vectors = {t: o.outputs.data.float() for t, o in zip(texts, outputs)}
        scores = [float(F.cosine_similarity(vectors[a], vectors[b], dim=0))
                  for a, b in zip(texts_1, texts_2)]
        return scores, sum(len(p.token_ids) for p in prompts)


def _second_field(request: ScoreRequest) -> str:
    """The field of a score request that holds the documents side of its pairs."""
    for name in ("text_2", "data_2", "documents"):
        if getattr(request, name, None) is not None:
            return name
    return "text_2"
