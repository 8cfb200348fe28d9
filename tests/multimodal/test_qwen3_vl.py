"""Qwen3-VL offline: the vision tower (learned position table resampled per image, main
and DeepStack mergers) against transformers', per image and padded-and-masked; the
interleaved M-RoPE tables against transformers'; greedy tokens equal transformers' for
prompts with 0, 1 and 2 images of different sizes (and DeepStack shown to change them)
and for chat with image parts; bad image inputs refused;
chunked prefill that cuts images across steps, with preemption; TP=2 equal to TP=1."""
from __future__ import annotations

import pytest
import torch

from tests.multimodal.conftest import (QWEN_VL_IMAGE, make_tiny_qwen3_vl, qwen_vl_hf_greedy,
                                       qwen_vl_hf_inputs, random_image)
from vllm import LLM, SamplingParams

HF_CLS = "Qwen3VLForConditionalGeneration"
PROMPTS = [(f"User: {QWEN_VL_IMAGE} describe it. Assistant:", [(0, 40, 56)]),
           (f"User: {QWEN_VL_IMAGE} and {QWEN_VL_IMAGE} compare. Assistant:",
            [(1, 64, 64), (2, 24, 48)]),
           ("User: hello there. Assistant:", [])]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_qwen3_vl(str(tmp_path_factory.mktemp("tiny-qwen3_vl")))


@pytest.fixture(scope="module")
def hf_model(tiny):
    import transformers
    return getattr(transformers, HF_CLS).from_pretrained(tiny, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llm(tiny):
    return LLM(tiny, dtype="float32", max_model_len=512, limit_mm_per_prompt={"image": 2})


def _images(specs):
    return [random_image(*spec) for spec in specs]


def _params(n: int = 8) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def _our_model(llm):
    return llm.collective_rpc(lambda worker: worker.model_runner.model)[0]


def _requests(prompts):
    return [{"prompt": t, "multi_modal_data": {"image": _images(s)}} if s else t
            for t, s in prompts]


@pytest.mark.parametrize("pad", [False, True])
def test_vision_encoder_matches_transformers(llm, hf_model, tiny, pad):
    """Two images of different grids in one call: the main embeddings and each
    DeepStack layer's, per-image segments and padded-and-masked (the HPU layout)."""
    inputs = qwen_vl_hf_inputs(tiny, PROMPTS[1][0], _images([(3, 48, 40), (4, 20, 36)]))
    with torch.no_grad():
        expected = hf_model.model.get_image_features(inputs["pixel_values"],
                                                     inputs["image_grid_thw"])
    model = _our_model(llm)
    assert type(model).__name__ == HF_CLS
    items = model.split_mm_data(inputs, 2)
    total = sum(it["pixel_values"].shape[0] for it in items)
    with torch.no_grad():
        ours = model.embed_multimodal(items, pad_to=total + 36 if pad else None)
    assert len(ours) == 2
    for i, out in enumerate(ours):
        main, deepstack = model.split_deepstack(out)
        torch.testing.assert_close(main, expected.pooler_output[i], atol=1e-4, rtol=1e-4)
        assert len(deepstack) == len(expected.deepstack_features) == 2
        for ours_layer, theirs in zip(deepstack, expected.deepstack_features):
            torch.testing.assert_close(ours_layer, theirs[i], atol=1e-4, rtol=1e-4)


def test_interleaved_mrope_tables_match_transformers(llm, hf_model):
    rope = _our_model(llm).language_model.model.rotary_emb
    assert rope.mrope_interleaved and rope.mrope_section == [6, 5, 5]
    positions = torch.stack([torch.arange(40), torch.arange(40) % 7 + 3,
                             torch.arange(40) // 5 + 1])
    cos, sin = rope._tables(positions, torch.float32)
    hf_rope = hf_model.model.language_model.rotary_emb
    hf_cos, hf_sin = hf_rope(torch.zeros(1, dtype=torch.float32), positions[:, None, :])
    torch.testing.assert_close(cos[:, 0], hf_cos[0])
    half = hf_sin.shape[-1] // 2  # our sin table carries rotate_half's sign
    torch.testing.assert_close(sin[:, 0, half:], hf_sin[0, :, half:])
    torch.testing.assert_close(-sin[:, 0, :half], hf_sin[0, :, :half])


def test_greedy_matches_transformers(llm, tiny):
    outs = llm.generate(_requests(PROMPTS), _params(), use_tqdm=False)
    for (text, specs), out in zip(PROMPTS, outs):
        assert list(out.outputs[0].token_ids) == qwen_vl_hf_greedy(
            tiny, text, _images(specs) or None, 8, hf_cls=HF_CLS)


def test_deepstack_changes_the_tokens(llm, tiny, monkeypatch):
    """transformers without the DeepStack additions continues an image prompt
    differently: the greedy match above depends on them."""
    import transformers
    cls = getattr(transformers, "Qwen3VLTextModel")
    monkeypatch.setattr(cls, "_deepstack_process", lambda self, hidden, mask, embeds: hidden)
    text, specs = PROMPTS[1]
    without = qwen_vl_hf_greedy(tiny, text, _images(specs), 8, hf_cls=HF_CLS)
    ours = llm.generate(_requests([PROMPTS[1]]), _params(), use_tqdm=False)[0]
    assert list(ours.outputs[0].token_ids) != without


def test_chunked_prefill_and_preemption(tiny):
    """8-token steps cut every image across steps (the DeepStack rows of an image
    arrive over several passes); 8 blocks of 16 tokens for two requests that grow to
    ~95 and ~65 tokens: one is preempted and recomputed."""
    llm = LLM(tiny, dtype="float32", max_model_len=128, max_num_batched_tokens=8,
              num_gpu_blocks_override=8, enable_prefix_caching=False,
              limit_mm_per_prompt={"image": 2})
    prompts = [(f"User: {QWEN_VL_IMAGE} and {QWEN_VL_IMAGE} compare. Assistant:",
                [(9, 48, 48), (10, 24, 40)]),
               (f"User: {QWEN_VL_IMAGE} describe it. Assistant:", [(11, 40, 32)])]
    outs = llm.generate(_requests(prompts), _params(30), use_tqdm=False)
    assert llm.llm_engine.get_stats().num_preemptions > 0
    for (text, specs), out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == qwen_vl_hf_greedy(
            tiny, text, _images(specs), 30, hf_cls=HF_CLS)


@pytest.mark.timeout(300)
def test_tp2_matches_tp1(llm, tiny):
    """TP=2 over worker processes (the language model sharded, the encoder and the
    DeepStack additions replicated) gives the one-process tokens."""
    params = _params()
    expected = [list(o.outputs[0].token_ids)
                for o in llm.generate(_requests(PROMPTS), params, use_tqdm=False)]
    tp2 = LLM(tiny, dtype="float32", max_model_len=512, limit_mm_per_prompt={"image": 2},
              tensor_parallel_size=2, distributed_executor_backend="mp",
              kv_cache_memory_bytes=16 << 20)
    try:
        got = [list(o.outputs[0].token_ids)
               for o in tp2.generate(_requests(PROMPTS), params, use_tqdm=False)]
    finally:
        tp2.llm_engine.shutdown()
    assert got == expected


def test_tied_word_embeddings_checkpoint(tmp_path):
    """As Qwen3-VL-2B / 4B: no lm_head tensor, the tie recorded on the top config
    (the text config's own default says otherwise; transformers follows the top)."""
    model_dir = make_tiny_qwen3_vl(str(tmp_path), tie_word_embeddings=True)
    llm = LLM(model_dir, dtype="float32", max_model_len=256)
    text, specs = PROMPTS[0]
    out = llm.generate(_requests([PROMPTS[0]]), _params(4), use_tqdm=False)[0]
    assert list(out.outputs[0].token_ids) == qwen_vl_hf_greedy(model_dir, text, _images(specs),
                                                               4, hf_cls=HF_CLS)


def test_chat_with_image_parts_matches_transformers(llm, tiny):
    from transformers import AutoTokenizer
    first, second = random_image(7, 40, 40), random_image(8, 32, 48)
    messages = [{"role": "user", "content": [
        {"type": "image_pil", "image_pil": first},
        {"type": "image_pil", "image_pil": second},
        {"type": "text", "text": "Same?"}]}]
    out = llm.chat(messages, _params(), use_tqdm=False)[0]
    text = AutoTokenizer.from_pretrained(tiny).apply_chat_template(
        [{"role": "user", "content": f"{QWEN_VL_IMAGE}\n{QWEN_VL_IMAGE}\nSame?"}],
        tokenize=False, add_generation_prompt=True)
    assert list(out.outputs[0].token_ids) == qwen_vl_hf_greedy(
        tiny, text, [first, second], 8, hf_cls=HF_CLS)


@pytest.mark.parametrize("prompt,specs,match", [
    ("User: no placeholder here", [(12, 32, 32)], "image placeholders"),
    (f"User: {QWEN_VL_IMAGE} three", [(13, 16, 16)] * 3, "At most 2 image"),
])
def test_bad_image_input_is_refused(llm, prompt, specs, match):
    with pytest.raises(ValueError, match=match):
        llm.generate({"prompt": prompt, "multi_modal_data": {"image": _images(specs)}},
                     _params(), use_tqdm=False)
