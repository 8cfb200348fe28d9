"""Qwen3-VL-MoE offline: greedy tokens equal transformers' for prompts with 0, 1 and 2
images of different sizes (experts in two layers, a dense MLP in the third); the hub's
transposed stacked-expert layout loads to the same tokens; TP=2 equal to TP=1."""
from __future__ import annotations

import os
import shutil

import pytest

from tests.multimodal.conftest import (QWEN_VL_IMAGE, make_tiny_qwen3_vl, qwen_vl_hf_greedy,
                                       random_image)
from vllm import LLM, SamplingParams

HF_CLS = "Qwen3VLMoeForConditionalGeneration"
PROMPTS = [(f"User: {QWEN_VL_IMAGE} describe it. Assistant:", [(0, 40, 56)]),
           (f"User: {QWEN_VL_IMAGE} and {QWEN_VL_IMAGE} compare. Assistant:",
            [(1, 64, 64), (2, 24, 48)]),
           ("User: hello there. Assistant:", [])]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_qwen3_vl(str(tmp_path_factory.mktemp("tiny-qwen3_vl_moe")), moe=True)


@pytest.fixture(scope="module")
def llm(tiny):
    return LLM(tiny, dtype="float32", max_model_len=512, limit_mm_per_prompt={"image": 2})


def _requests(prompts):
    return [{"prompt": t, "multi_modal_data": {"image": [random_image(*s) for s in specs]}}
            if specs else t for t, specs in prompts]


def _greedy(llm, prompts=PROMPTS):
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    return [list(o.outputs[0].token_ids)
            for o in llm.generate(_requests(prompts), params, use_tqdm=False)]


def test_greedy_matches_transformers(llm, tiny):
    model = llm.collective_rpc(lambda worker: worker.model_runner.model)[0]
    assert type(model).__name__ == HF_CLS
    for (text, specs), ours in zip(PROMPTS, _greedy(llm)):
        images = [random_image(*s) for s in specs] or None
        assert ours == qwen_vl_hf_greedy(tiny, text, images, 8, hf_cls=HF_CLS)


def test_hub_expert_layout_loads(llm, tiny, tmp_path):
    """The hub's files keep each layer's experts as [E, hidden, 2 * inter] and
    [E, inter, hidden] (transformers 5 transposes them on load)."""
    from safetensors.torch import load_file, save_file
    hub = str(tmp_path / "hub")
    shutil.copytree(tiny, hub)
    path = os.path.join(hub, "model.safetensors")
    tensors = load_file(path)
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj",
                                                   "experts.down_proj"))]:
        tensors[name] = tensors[name].transpose(1, 2).contiguous()
    assert tensors["model.language_model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 64,
                                                                                        96)
    save_file(tensors, path, metadata={"format": "pt"})
    hub_llm = LLM(hub, dtype="float32", max_model_len=512, limit_mm_per_prompt={"image": 2})
    assert _greedy(hub_llm) == _greedy(llm)


@pytest.mark.timeout(300)
def test_tp2_matches_tp1(llm, tiny):
    expected = _greedy(llm)
    tp2 = LLM(tiny, dtype="float32", max_model_len=512, limit_mm_per_prompt={"image": 2},
              tensor_parallel_size=2, distributed_executor_backend="mp",
              kv_cache_memory_bytes=16 << 20)
    try:
        assert _greedy(tp2) == expected
    finally:
        tp2.llm_engine.shutdown()
