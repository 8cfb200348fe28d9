"""Vision-language models on the Transformers modeling backend (`--model-impl`): LLaVA
forced through the backend gives the native path's and transformers' greedy tokens with
1 and 2 images; VipLLaVA (no native class) runs through `auto` and gives transformers'
tokens; on the fake HPU the backend gives the CPU's tokens with no compile after warmup;
models the generic path cannot run are refused by name."""
from __future__ import annotations

import pytest

from tests.multimodal.conftest import hf_greedy, random_image
from vllm import LLM, SamplingParams

PROMPTS = [("USER: <image> describe it. ASSISTANT:", [(0, 40, 56)]),
           ("USER: <image> and <image> compare. ASSISTANT:", [(1, 64, 64), (2, 24, 48)]),
           ("USER: <image><image> compare. ASSISTANT:", [(3, 32, 32), (4, 50, 20)])]
MAX_TOKENS = 8


def make_tiny_vipllava(directory: str) -> str:
    """VipLLaVA layout (no native class here): the tiny LLaVA's CLIP tower, tokenizer
    and processor, features of vision layers -2 and -1 concatenated through a
    layer-normed projector, a 2-layer Llama."""
    import torch
    import transformers

    from tests.multimodal.conftest import make_tiny_llava
    make_tiny_llava(directory)  # tokenizer and processor (and a LLaVA we overwrite)
    llava = transformers.LlavaConfig.from_pretrained(directory)
    config = transformers.VipLlavaConfig(vision_config=llava.vision_config.to_dict(),
                                         text_config=llava.text_config.to_dict(),
                                         image_token_index=llava.image_token_index,
                                         vision_feature_layers=[-2, -1],
                                         projector_hidden_act="gelu")
    torch.manual_seed(1)
    model = transformers.VipLlavaForConditionalGeneration(config)
    with torch.no_grad():  # widen near-uniform random logits so greedy is decisive
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tiny_vipllava(tmp_path_factory) -> str:
    return make_tiny_vipllava(str(tmp_path_factory.mktemp("tiny-vipllava")))


def _prompts():
    return [(text, [random_image(*spec) for spec in specs]) for text, specs in PROMPTS]


def _greedy(path: str, **kwargs) -> list[list[int]]:
    llm = LLM(path, dtype="float32", max_model_len=512, limit_mm_per_prompt={"image": 2},
              **kwargs)
    try:
        outs = llm.generate([{"prompt": t, "multi_modal_data": {"image": ims}}
                             for t, ims in _prompts()],
                            SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                           ignore_eos=True), use_tqdm=False)
        assert type(_model_of(llm)).__name__ == (
            "TransformersForMultimodalLM" if kwargs.get("model_impl") != "vllm"
            else "LlavaForConditionalGeneration")
    finally:
        llm.llm_engine.shutdown()
    return [list(o.outputs[0].token_ids) for o in outs]


def _model_of(llm):
    from tests.hpu.conftest import runner_of
    return runner_of(llm).model


def test_llava_forced_through_backend_matches_native_and_transformers(tiny_llava):
    backend = _greedy(tiny_llava, model_impl="transformers")
    assert backend == _greedy(tiny_llava, model_impl="vllm")
    assert backend == [hf_greedy(tiny_llava, "LlavaForConditionalGeneration", t, ims,
                                 MAX_TOKENS) for t, ims in _prompts()]


def test_vipllava_through_auto_matches_transformers(tiny_vipllava, caplog):
    import logging
    with caplog.at_level(logging.INFO):
        out = _greedy(tiny_vipllava)
    assert "no native implementation" in caplog.text
    assert out == [hf_greedy(tiny_vipllava, "VipLlavaForConditionalGeneration", t, ims,
                             MAX_TOKENS) for t, ims in _prompts()]
    with pytest.raises(ValueError, match="not supported"):
        LLM(tiny_vipllava, dtype="float32", max_model_len=512, model_impl="vllm")


def test_fake_hpu_matches_cpu_and_compiles_nothing_after_warmup(tiny_vipllava):
    from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env, release, runner_of
    args = dict(max_model_len=512, max_num_seqs=4, block_size=16,
                kv_cache_memory_bytes=1 << 20, limit_mm_per_prompt={"image": 2})
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    requests = [{"prompt": t, "multi_modal_data": {"image": ims}} for t, ims in _prompts()]
    with platform_env("cpu"):
        llm = make_llm(model=tiny_vipllava, **args)
        try:
            cpu = [list(o.outputs[0].token_ids)
                   for o in llm.generate(requests, params, use_tqdm=False)]
        finally:
            release(llm)
    with platform_env("hpu", **dict(SMALL_BUCKETS, PT_HPU_LAZY_MODE="1")):
        llm = make_llm(model=tiny_vipllava, **args)
        try:
            tracker = runner_of(llm).tracker
            assert "vision 2 images" in " ".join(tracker.compiled_labels[False])
            hpu = [list(o.outputs[0].token_ids)
                   for o in llm.generate(requests, params, use_tqdm=False)]
            assert tracker.num_compiles_after_warmup == 0, tracker.compiled_labels[True]
        finally:
            release(llm)
    assert hpu == cpu


def test_unsupported_models_are_refused_by_name():
    import transformers

    from vllm.model_executor.models.transformers import (TransformersBackendUnsupported,
                                                         resolve_transformers_mm_class)
    from vllm.model_executor.models.transformers.multimodal import (
        TransformersForMultimodalLM)
    gemma = transformers.Gemma3Config(architectures=["Gemma3ForConditionalGeneration"])
    with pytest.raises(TransformersBackendUnsupported, match="both ways.*--model-impl|"
                       "--model-impl.*both ways"):
        resolve_transformers_mm_class(gemma)
    qwen = transformers.Qwen2_5_VLConfig(architectures=["Qwen2_5_VLForConditionalGeneration"])
    with pytest.raises(TransformersBackendUnsupported, match="M-RoPE"):
        resolve_transformers_mm_class(qwen)
    import torch
    crops = {"input_ids": torch.zeros(1, 4, dtype=torch.long),
             "pixel_values": torch.zeros(5, 3, 8, 8)}
    with pytest.raises(TransformersBackendUnsupported, match="crops"):
        TransformersForMultimodalLM.split_mm_data(crops, 1)


def test_processor_needing_a_missing_package_is_refused(tiny_vipllava, monkeypatch):
    import transformers

    from vllm.model_executor.models.transformers import TransformersBackendUnsupported
    from vllm.model_executor.models.transformers.multimodal import (
        TransformersForMultimodalLM)

    def needs_torchvision(*args, **kwargs):
        raise ImportError("this processor requires the torchvision library")
    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", needs_torchvision)
    with pytest.raises(TransformersBackendUnsupported,
                       match="VipLlavaForConditionalGeneration.*torchvision"):
        TransformersForMultimodalLM.load_hf_processor(tiny_vipllava)
