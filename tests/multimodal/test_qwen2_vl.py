"""Qwen2-VL offline: its vision encoder (LayerNorm blocks, no windows, `embed_dim` wide)
against transformers', per image and padded-and-masked, and greedy tokens equal to
transformers' for prompts with 1 and 2 images of different sizes and text only."""
from __future__ import annotations

import pytest
import torch

from tests.multimodal.conftest import (QWEN_VL_IMAGE, make_tiny_qwen2_5_vl, qwen_vl_hf_greedy,
                                       qwen_vl_hf_inputs, random_image)
from vllm import LLM, SamplingParams

HF_CLS = "Qwen2VLForConditionalGeneration"
PROMPTS = [(f"User: {QWEN_VL_IMAGE} describe it. Assistant:", [(0, 40, 56)]),
           (f"User: {QWEN_VL_IMAGE} and {QWEN_VL_IMAGE} compare. Assistant:",
            [(1, 64, 64), (2, 24, 48)]),
           ("User: hello there. Assistant:", [])]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_qwen2_5_vl(str(tmp_path_factory.mktemp("tiny-qwen2_vl")), qwen2_vl=True)


@pytest.fixture(scope="module")
def llm(tiny):
    return LLM(tiny, dtype="float32", max_model_len=512, limit_mm_per_prompt={"image": 2})


def _images(specs):
    return [random_image(*spec) for spec in specs]


@pytest.mark.parametrize("pad", [False, True])
def test_vision_encoder_matches_transformers(llm, tiny, pad):
    import transformers
    hf = getattr(transformers, HF_CLS).from_pretrained(tiny, dtype=torch.float32).eval()
    inputs = qwen_vl_hf_inputs(tiny, PROMPTS[1][0], _images([(3, 48, 40), (4, 20, 36)]))
    with torch.no_grad():
        expected = hf.model.get_image_features(inputs["pixel_values"],
                                               inputs["image_grid_thw"]).pooler_output
    model = llm.collective_rpc(lambda worker: worker.model_runner.model)[0]
    assert type(model).__name__ == HF_CLS
    items = model.split_mm_data(inputs, 2)
    total = sum(it["pixel_values"].shape[0] for it in items)
    with torch.no_grad():
        ours = model.embed_multimodal(items, pad_to=total + 36 if pad else None)
    assert [o.shape for o in ours] == [e.shape for e in expected]
    for o, e in zip(ours, expected):
        torch.testing.assert_close(o, e, atol=1e-4, rtol=1e-4)


def test_greedy_matches_transformers(llm, tiny):
    prompts = [(text, _images(specs)) for text, specs in PROMPTS]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt": t, "multi_modal_data": {"image": ims}} if ims else t
                         for t, ims in prompts], params, use_tqdm=False)
    for (text, images), out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == qwen_vl_hf_greedy(
            tiny, text, images or None, 8, hf_cls=HF_CLS)


@pytest.mark.timeout(300)
def test_tp2_matches_tp1(llm, tiny):
    """TP=2 over worker processes (the language model sharded, the encoder replicated)
    gives the one-process tokens, images of two sizes included."""
    prompts = [{"prompt": t, "multi_modal_data": {"image": _images(s)}} if s else t
               for t, s in PROMPTS]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    expected = [list(o.outputs[0].token_ids)
                for o in llm.generate(prompts, params, use_tqdm=False)]
    tp2 = LLM(tiny, dtype="float32", max_model_len=512, limit_mm_per_prompt={"image": 2},
              tensor_parallel_size=2, distributed_executor_backend="mp",
              kv_cache_memory_bytes=16 << 20)
    try:
        got = [list(o.outputs[0].token_ids) for o in tp2.generate(prompts, params,
                                                                  use_tqdm=False)]
    finally:
        tp2.llm_engine.shutdown()
    assert got == expected
