"""The offline pooling API of `LLM` (vLLM's names and signatures): `encode`, `embed`,
`classify` and `score`.

Each prompt becomes one pooling request (`PoolingParams` with the task set); the engine
runs it in one step and returns a `PoolingRequestOutput`, which the typed methods turn
into vLLM's `EmbeddingRequestOutput` / `ClassificationRequestOutput` /
`ScoringRequestOutput`. `score` pairs its inputs 1 -> 1, 1 -> N or N -> N: with an
embedding model (bi-encoder) it is the cosine similarity of the two embeddings; with a
one-label classifier (cross-encoder) the pair is tokenized as one input (second segment
as token type 1) and the score is the classifier's output (sigmoid of its logit, or
the logit itself with `use_activation=False`).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch.nn.functional as F

from vllm.engine.processor import PromptType
from vllm.lora.request import LoRARequest
from vllm.outputs import (ClassificationRequestOutput, EmbeddingRequestOutput, PoolingOutput,
                          PoolingRequestOutput, ScoringRequestOutput)
from vllm.entrypoints.score_utils import (ScoreInput, cross_encoder_prompt, pair_inputs,
                                         score_text)
from vllm.pooling_params import PoolingParams

class PoolingOfflineMixin:
    """`LLM`'s pooling methods; needs `self.llm_engine`, `_add_requests`, `_run_engine`."""

    def _pooling_task(self) -> Optional[str]:
        mc = self.llm_engine.model_config
        return mc.pooling_task if mc.runner_type == "pooling" else None

    def encode(self, prompts: Union[PromptType, Sequence[PromptType]],
               pooling_params: Union[PoolingParams, Sequence[PoolingParams], None] = None,
               *, use_tqdm: bool = True,
               lora_request: Union[list[LoRARequest], LoRARequest, None] = None,
               pooling_task: Optional[str] = None,
               tokenization_kwargs: Optional[dict[str, Any]] = None
               ) -> list[PoolingRequestOutput]:
        """Pool each prompt's hidden states (`pooling_task`: embed or classify)."""
        self._verify_pooling_task(pooling_task)
        prompt_list = self._normalize_prompts(prompts, None)
        if tokenization_kwargs:
            prompt_list = [self._tokenize(p, tokenization_kwargs) for p in prompt_list]
        params = self._pooling_params(pooling_params, len(prompt_list), pooling_task)
        loras = self._normalize_loras(lora_request, len(prompt_list))
        request_ids = self._add_requests(prompt_list, params, loras)
        return self._run_engine(request_ids, use_tqdm)

    def embed(self, prompts: Union[PromptType, Sequence[PromptType]], *,
              use_tqdm: bool = True,
              pooling_params: Union[PoolingParams, Sequence[PoolingParams], None] = None,
              lora_request: Union[list[LoRARequest], LoRARequest, None] = None,
              tokenization_kwargs: Optional[dict[str, Any]] = None
              ) -> list[EmbeddingRequestOutput]:
        """One embedding vector per prompt."""
        items = self.encode(prompts, pooling_params, use_tqdm=use_tqdm,
                            lora_request=lora_request, pooling_task="embed",
                            tokenization_kwargs=tokenization_kwargs)
        return [EmbeddingRequestOutput.from_base(item) for item in items]

    def classify(self, prompts: Union[PromptType, Sequence[PromptType]], *,
                 pooling_params: Union[PoolingParams, Sequence[PoolingParams], None] = None,
                 use_tqdm: bool = True,
                 lora_request: Union[list[LoRARequest], LoRARequest, None] = None,
                 tokenization_kwargs: Optional[dict[str, Any]] = None
                 ) -> list[ClassificationRequestOutput]:
        """Class probabilities (or logits with use_activation=False) per prompt."""
        items = self.encode(prompts, pooling_params, use_tqdm=use_tqdm,
                            lora_request=lora_request, pooling_task="classify",
                            tokenization_kwargs=tokenization_kwargs)
        return [ClassificationRequestOutput.from_base(item) for item in items]

    def score(self, data_1: Union[ScoreInput, Sequence[ScoreInput]],
              data_2: Union[ScoreInput, Sequence[ScoreInput]], /, *,
              use_tqdm: bool = True, pooling_params: Optional[PoolingParams] = None,
              lora_request: Union[list[LoRARequest], LoRARequest, None] = None,
              tokenization_kwargs: Optional[dict[str, Any]] = None,
              chat_template: Optional[str] = None) -> list[ScoringRequestOutput]:
        """Similarity of each pair (see the module docstring)."""
        task = self._pooling_task()
        if task is None:
            raise ValueError("LLM.score() is only supported for pooling models. Try passing "
                             "`--runner pooling` to use the model as a pooling model.")
        if chat_template is not None:
            raise ValueError("chat_template: score templates are not supported by the "
                             "encoder models served here.")
        first, second = pair_inputs(data_1, data_2)
        if task == "embed":
            return self._bi_encoder_score(first, second, pooling_params, use_tqdm,
                                          lora_request, tokenization_kwargs)
        if getattr(self.llm_engine.model_config.hf_config, "num_labels", 0) != 1:
            raise ValueError("Scoring API is only enabled for num_labels == 1.")
        params = (pooling_params or PoolingParams()).clone()
        if params.task not in (None, "classify"):
            raise ValueError(f"You cannot overwrite params.task={params.task!r} with "
                             "pooling_task='classify'!")
        tokenizer = self.get_tokenizer()
        prompts, param_list = [], []
        for a, b in zip(first, second):
            prompt, split = cross_encoder_prompt(tokenizer, score_text(a), score_text(b),
                                                 self.llm_engine.model_config.hf_config,
                                                 tokenization_kwargs)
            p = params.clone()
            if split is not None:
                p.extra_kwargs = {"compressed_token_type_ids": split}
            prompts.append(prompt)
            param_list.append(p)
        items = self.encode(prompts, param_list, use_tqdm=use_tqdm, lora_request=lora_request,
                            pooling_task="classify")
        return [ScoringRequestOutput.from_base(item) for item in items]

    def _bi_encoder_score(self, first: list[ScoreInput], second: list[ScoreInput],
                          pooling_params: Optional[PoolingParams], use_tqdm: bool,
                          lora_request, tokenization_kwargs
                          ) -> list[ScoringRequestOutput]:
        texts = list(dict.fromkeys(score_text(x) for x in first + second))
        outs = self.encode(texts, pooling_params, use_tqdm=use_tqdm,
                           lora_request=lora_request, pooling_task="embed",
                           tokenization_kwargs=tokenization_kwargs)
        vectors = {t: o.outputs.data for t, o in zip(texts, outs)}
        results = []
        for i, (a, b) in enumerate(zip(first, second)):
            va, vb = vectors[score_text(a)], vectors[score_text(b)]
            sim = F.cosine_similarity(va.float(), vb.float(), dim=0)
            ids = outs[texts.index(score_text(a))].prompt_token_ids + \
                outs[texts.index(score_text(b))].prompt_token_ids
            results.append(ScoringRequestOutput.from_base(PoolingRequestOutput(
                request_id=f"score-{i}", outputs=PoolingOutput(sim.reshape(())),
                prompt_token_ids=ids, num_cached_tokens=0, finished=True)))
        return results

    # ------------------------------------------------------------ helpers
    def _verify_pooling_task(self, pooling_task: Optional[str]) -> None:
        task = self._pooling_task()
        if task is None:
            raise ValueError("LLM.encode() is only supported for pooling models. Try "
                             "passing `--runner pooling` to use the model as a pooling "
                             "model.")
        if pooling_task is None:
            raise ValueError("pooling_task required for `LLM.encode`: use LLM.embed(...) "
                             "or pooling_task='embed', LLM.classify(...) or "
                             "pooling_task='classify', LLM.score(...) for scores.")
        if pooling_task != task:
            api = {"embed": "Embedding API", "classify": "Classification API"}.get(
                pooling_task, f"pooling_task={pooling_task!r}")
            raise ValueError(f"{api} is not supported by this model (its task is "
                             f"{task!r}). Unsupported task: {pooling_task!r} Supported "
                             f"tasks: {[task]}")

    @staticmethod
    def _pooling_params(params: Union[PoolingParams, Sequence[PoolingParams], None],
                        num: int, task: str) -> list[PoolingParams]:
        if params is None:
            params = PoolingParams()
        if isinstance(params, PoolingParams):
            params = [params] * num
        params = list(params)
        if len(params) != num:
            raise ValueError(f"The lengths of prompts ({num}) and pooling_params "
                             f"({len(params)}) must be the same.")
        out = []
        for p in params:
            if not isinstance(p, PoolingParams):
                raise ValueError(f"pooling_params must be PoolingParams, got "
                                 f"{type(p).__name__}.")
            p = p.clone()
            if p.task is not None and p.task != task:
                raise ValueError(f"You cannot overwrite params.task={p.task!r} with "
                                 f"pooling_task={task!r}!")
            p.task = task
            out.append(p)
        return out

    def _tokenize(self, prompt: PromptType, kwargs: dict[str, Any]) -> PromptType:
        """A text prompt tokenized with the caller's tokenizer arguments."""
        return self.llm_engine.processor.tokenize_with(prompt, kwargs)

