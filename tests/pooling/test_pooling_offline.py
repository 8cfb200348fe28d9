"""Offline pooling (LLM.embed / classify / score / encode) against transformers.

References: the Hugging Face model's last hidden state pooled by the formula the pooling
type names (CLS row, mean over the attention mask, last token) and L2-normalized, as
sentence-transformers does (it is not installed here); cross-encoder scores are the
HF classifier's logits (sigmoid by default). All fp32; vectors must agree within 1e-4
cosine.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm import LLM
from vllm.outputs import (ClassificationRequestOutput, EmbeddingRequestOutput,
                          PoolingRequestOutput, ScoringRequestOutput)
from vllm.pooling_params import PoolingParams

TEXTS = ["the cat sat on the mat", "paris is the capital of france",
         "what is machine learning", "a"]


def _cos(a, b) -> float:
    return F.cosine_similarity(torch.as_tensor(a, dtype=torch.float32),
                               torch.as_tensor(b, dtype=torch.float32), dim=0).item()


@torch.no_grad()
def _hf_hidden(path: str, cls_name: str, input_ids: list[int], **kwargs) -> torch.Tensor:
    import transformers
    model = getattr(transformers, cls_name).from_pretrained(path, dtype=torch.float32).eval()
    return model(torch.tensor([input_ids]), **kwargs).last_hidden_state[0]


def _pool(hidden: torch.Tensor, kind: str) -> torch.Tensor:
    vec = {"CLS": hidden[0], "MEAN": hidden.mean(0), "LAST": hidden[-1]}[kind]
    return F.normalize(vec, dim=-1)


@pytest.mark.parametrize("kind,hf_cls,pooling,expected", [
    ("bert", "BertModel", "MEAN", "MEAN"),
    ("bert", "BertModel", None, "CLS"),
    ("xlmr", "XLMRobertaModel", None, "CLS"),
])
def test_encoder_embeddings_match_transformers(encoder_factory, kind, hf_cls, pooling,
                                               expected):
    path = encoder_factory(kind, pooling)
    llm = LLM(model=path, dtype="float32")
    mc = llm.llm_engine.model_config
    assert (mc.runner_type, mc.pooling_task, mc.is_encoder_only) == ("pooling", "embed", True)
    assert mc.pooler_config.pooling_type == expected
    assert not llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    prompts = TEXTS + [{"prompt_token_ids": [7]}]  # one token: a decode row on CPU
    outs = llm.embed(prompts, use_tqdm=False)
    assert all(isinstance(o, EmbeddingRequestOutput) for o in outs)
    for out in outs:
        ref = _pool(_hf_hidden(path, hf_cls, out.prompt_token_ids), expected)
        assert len(out.outputs.embedding) == 64
        assert _cos(out.outputs.embedding, ref) > 1 - 1e-4
        assert abs(torch.tensor(out.outputs.embedding).norm().item() - 1) < 1e-5
    # Batching does not change a vector: the same prompt alone.
    alone = llm.embed(TEXTS[1], use_tqdm=False)[0].outputs.embedding
    assert _cos(alone, outs[1].outputs.embedding) > 1 - 1e-6


def test_decoder_embedder_last_token(tiny_model_factory):
    """Qwen3-Embedding style: a Qwen3ForCausalLM checkpoint with --runner pooling."""
    path = tiny_model_factory("qwen3")
    llm = LLM(model=path, dtype="float32", runner="pooling")
    mc = llm.llm_engine.model_config
    assert (mc.pooling_task, mc.is_encoder_only, mc.pooler_config.pooling_type) == (
        "embed", False, "LAST")
    outs = llm.embed(TEXTS, use_tqdm=False)
    for out in outs:
        ref = _pool(_hf_hidden(path, "Qwen3Model", out.prompt_token_ids), "LAST")
        assert _cos(out.outputs.embedding, ref) > 1 - 1e-4
    raw = llm.encode(TEXTS[:1], PoolingParams(use_activation=False), pooling_task="embed",
                     use_tqdm=False)[0]
    assert isinstance(raw, PoolingRequestOutput)
    ref = _hf_hidden(path, "Qwen3Model", raw.prompt_token_ids)[-1]
    torch.testing.assert_close(raw.outputs.data, ref, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="pooling model"):
        llm.generate("hello", use_tqdm=False)


@pytest.mark.parametrize("kind,hf_cls", [("bert-cls", "BertForSequenceClassification"),
                                          ("xlmr-cls", "XLMRobertaForSequenceClassification")])
def test_cross_encoder_scores_equal_classifier_logits(encoder_factory, kind, hf_cls):
    import transformers
    path = encoder_factory(kind)
    llm = LLM(model=path, dtype="float32")
    assert llm.llm_engine.model_config.pooling_task == "classify"
    query = "what is the capital of france"
    docs = ["paris is the capital of france", "the cat sat on the mat", "berlin germany"]
    tok = transformers.AutoTokenizer.from_pretrained(path)
    hf = getattr(transformers, hf_cls).from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(**tok([query] * 3, docs, return_tensors="pt", padding=True,
                          return_token_type_ids=kind.startswith("bert"))).logits[:, 0]
    scores = llm.score(query, docs, use_tqdm=False)
    assert all(isinstance(s, ScoringRequestOutput) for s in scores)
    got = torch.tensor([s.outputs.score for s in scores])
    torch.testing.assert_close(got, torch.sigmoid(logits), atol=1e-5, rtol=1e-4)
    raw = llm.score([query] * 3, docs, pooling_params=PoolingParams(use_activation=False),
                    use_tqdm=False)
    torch.testing.assert_close(torch.tensor([s.outputs.score for s in raw]), logits,
                               atol=1e-5, rtol=1e-4)
    cls = llm.classify(["paris is the capital of france"], use_tqdm=False)[0]
    assert isinstance(cls, ClassificationRequestOutput) and cls.outputs.num_classes == 1
    with pytest.raises(ValueError, match="Embedding API is not supported"):
        llm.embed("a", use_tqdm=False)


def test_bi_encoder_score_is_cosine(encoder_factory):
    llm = LLM(model=encoder_factory("bert", "MEAN"), dtype="float32")
    emb = [o.outputs.embedding for o in llm.embed(TEXTS[:3], use_tqdm=False)]
    scores = llm.score(TEXTS[0], TEXTS[1:3], use_tqdm=False)
    for s, other in zip(scores, emb[1:]):
        assert s.outputs.score == pytest.approx(_cos(emb[0], other), abs=1e-5)
    with pytest.raises(ValueError, match="must be the same"):
        llm.score(TEXTS[:2], TEXTS[:3], use_tqdm=False)


def test_matryoshka_dimensions_and_refusals(encoder_factory, tiny_model_factory):
    path = encoder_factory("bert", "MEAN")
    plain = LLM(model=path, dtype="float32")
    with pytest.raises(ValueError, match="does not support Matryoshka"):
        plain.embed("a", pooling_params=PoolingParams(dimensions=16), use_tqdm=False)
    with pytest.raises(ValueError, match="cannot overwrite"):
        plain.embed("a", pooling_params=PoolingParams(task="classify"), use_tqdm=False)
    llm = LLM(model=path, dtype="float32", hf_overrides={"is_matryoshka": True})
    full = llm.encode(["the sun is hot"], PoolingParams(use_activation=False),
                      pooling_task="embed", use_tqdm=False)[0].outputs.data
    cut = llm.embed("the sun is hot", pooling_params=PoolingParams(dimensions=16),
                    use_tqdm=False)[0].outputs.embedding
    assert len(cut) == 16
    torch.testing.assert_close(torch.tensor(cut), F.normalize(full[:16], dim=-1))
    with pytest.raises(ValueError, match=r"range \[1, 64\]"):
        llm.embed("a", pooling_params=PoolingParams(dimensions=65), use_tqdm=False)
    with pytest.raises(ValueError, match="maximum context length"):
        llm.embed({"prompt_token_ids": [5] * 200}, use_tqdm=False)
    gen = LLM(model=tiny_model_factory("qwen3"), dtype="float32")
    with pytest.raises(ValueError, match="only supported for pooling models"):
        gen.embed("a", use_tqdm=False)
    with pytest.raises(ValueError, match="runner"):
        LLM(model=path, runner="generate")


def test_async_engine_encode_and_metrics(encoder_factory):
    """EngineClient.encode: one PoolingRequestOutput per request through the async
    engine, whose metrics count the prompt tokens and the finished request."""
    import asyncio

    from vllm import LLM
    from vllm.engine.async_llm_engine import AsyncLLMEngine
    path = encoder_factory("bert", "MEAN")
    reference = LLM(model=path, dtype="float32").embed(TEXTS[0], use_tqdm=False)[0]
    engine = AsyncLLMEngine(LLM(model=path, dtype="float32").llm_engine, log_requests=False,
                            log_stats=False)

    async def main():
        engine.start_background_loop()
        outs = [o async for o in engine.encode(TEXTS[0], PoolingParams(task="embed"), "r1")]
        return outs

    try:
        outs = asyncio.run(main())
    finally:
        engine.shutdown()
    assert len(outs) == 1 and outs[0].finished
    torch.testing.assert_close(outs[0].outputs.data,
                               torch.tensor(reference.outputs.embedding))
    metrics = engine.stats.metrics
    assert metrics.prompt_tokens._value.get() == len(outs[0].prompt_token_ids)
    assert metrics.request_success["stop"]._value.get() == 1


def test_supported_tasks_and_the_wrong_task_named(tmp_path):
    from tests.pooling._pooling_models import make_tiny_encoder
    from vllm import LLM
    llm = LLM(model=make_tiny_encoder(str(tmp_path), "bert", "CLS"), dtype="float32")
    assert llm.supported_tasks == ("embed",)
    with pytest.raises(ValueError, match="pooling_task='token_embed' is not supported"):
        llm.encode(["x"], pooling_task="token_embed")
    with pytest.raises(ValueError, match="Classification API is not supported"):
        llm.encode(["x"], pooling_task="classify")
