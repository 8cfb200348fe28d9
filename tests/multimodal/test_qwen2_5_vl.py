"""Qwen2.5-VL offline: the vision encoder and the M-RoPE positions against
transformers' own, greedy tokens equal transformers' for 1 and 2 images of different
sizes, chat with image parts, and M-RoPE positions that survive chunked prefill and
preemption."""
from __future__ import annotations

import pytest
import torch

from tests.multimodal.conftest import (QWEN_VL_IMAGE, make_tiny_qwen2_5_vl, qwen_vl_hf_greedy,
                                       qwen_vl_hf_inputs, random_image)
from vllm import LLM, SamplingParams
from vllm.multimodal.mrope import mrope_input_positions

PROMPTS = [(f"User: {QWEN_VL_IMAGE} describe it. Assistant:", [(0, 40, 56)]),
           (f"User: {QWEN_VL_IMAGE} and {QWEN_VL_IMAGE} compare. Assistant:",
            [(1, 64, 64), (2, 24, 48)])]


def _images(specs):
    return [random_image(*spec) for spec in specs]


@pytest.fixture(scope="module")
def hf_model(tiny_qwen2_5_vl):
    import transformers
    return transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        tiny_qwen2_5_vl, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llm(tiny_qwen2_5_vl):
    return LLM(tiny_qwen2_5_vl, dtype="float32", max_model_len=512,
               limit_mm_per_prompt={"image": 2})


def _params(n: int = 8) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def _our_model(llm):
    return llm.collective_rpc(lambda worker: worker.model_runner.model)[0]


@pytest.mark.parametrize("pad", [False, True])
def test_vision_encoder_matches_transformers(llm, hf_model, tiny_qwen2_5_vl, pad):
    """Two images of different grids (several windows each) in one call, per-segment
    and padded-and-masked (the HPU layout)."""
    inputs = qwen_vl_hf_inputs(tiny_qwen2_5_vl, PROMPTS[1][0], _images([(3, 48, 40),
                                                                        (4, 20, 36)]))
    with torch.no_grad():
        expected = hf_model.model.get_image_features(
            inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output
    model = _our_model(llm)
    items = model.split_mm_data(inputs, 2)
    total = sum(it["pixel_values"].shape[0] for it in items)
    with torch.no_grad():
        ours = model.embed_multimodal(items, pad_to=total + 36 if pad else None)
    assert [o.shape for o in ours] == [e.shape for e in expected]
    for o, e in zip(ours, expected):
        torch.testing.assert_close(o, e, atol=1e-4, rtol=1e-4)


def test_mrope_positions_match_transformers(llm, hf_model, tiny_qwen2_5_vl):
    prompt = f"Look {QWEN_VL_IMAGE} then {QWEN_VL_IMAGE} and tell."
    inputs = qwen_vl_hf_inputs(tiny_qwen2_5_vl, prompt, _images([(5, 64, 24), (6, 32, 32)]))
    expected, delta = hf_model.model.get_rope_index(
        inputs["input_ids"], inputs["mm_token_type_ids"], inputs["image_grid_thw"])
    ids = inputs["input_ids"][0].tolist()
    model = _our_model(llm)
    from vllm.multimodal.inputs import placeholder_ranges
    items = model.split_mm_data(inputs, 2)
    runs = placeholder_ranges(ids, model.image_token_id(model.config),
                              [model.num_mm_tokens(model.config, it) for it in items])
    spans = [(off, n, it["image_grid_thw"].view(-1).tolist())
             for (off, n), it in zip(runs, items)]
    ours, our_delta = mrope_input_positions(len(ids), spans, 2)
    assert torch.equal(ours, expected[:, 0]) and our_delta == int(delta) < 0
    text_only, zero = mrope_input_positions(5, [], 2)
    assert zero == 0 and torch.equal(text_only, torch.arange(5).expand(3, -1))


def test_greedy_matches_transformers(llm, tiny_qwen2_5_vl):
    prompts = [(text, _images(specs)) for text, specs in PROMPTS]
    outs = llm.generate([{"prompt": t, "multi_modal_data": {"image": ims}}
                         for t, ims in prompts], _params(), use_tqdm=False)
    for (text, images), out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == qwen_vl_hf_greedy(
            tiny_qwen2_5_vl, text, images, 8)


def test_text_only_prompt_matches_transformers(llm, tiny_qwen2_5_vl):
    out = llm.generate("User: hello there. Assistant:", _params(), use_tqdm=False)[0]
    assert list(out.outputs[0].token_ids) == qwen_vl_hf_greedy(
        tiny_qwen2_5_vl, "User: hello there. Assistant:", None, 8)


def test_chat_with_image_parts_matches_transformers(llm, tiny_qwen2_5_vl):
    from transformers import AutoTokenizer
    first, second = random_image(7, 40, 40), random_image(8, 32, 48)
    messages = [{"role": "user", "content": [
        {"type": "image_pil", "image_pil": first},
        {"type": "image_pil", "image_pil": second},
        {"type": "text", "text": "Same?"}]}]
    out = llm.chat(messages, _params(), use_tqdm=False)[0]
    text = AutoTokenizer.from_pretrained(tiny_qwen2_5_vl).apply_chat_template(
        [{"role": "user", "content": f"{QWEN_VL_IMAGE}\n{QWEN_VL_IMAGE}\nSame?"}],
        tokenize=False, add_generation_prompt=True)
    assert list(out.outputs[0].token_ids) == qwen_vl_hf_greedy(
        tiny_qwen2_5_vl, text, [first, second], 8)


def test_chunked_prefill_and_preemption_keep_mrope_positions(tiny_qwen2_5_vl):
    # 8-token steps cut every image across steps; 8 blocks of 16 tokens for two
    # requests that grow to ~95 and ~65 tokens: one is preempted and recomputed.
    llm = LLM(tiny_qwen2_5_vl, dtype="float32", max_model_len=128, max_num_batched_tokens=8,
              num_gpu_blocks_override=8, enable_prefix_caching=False,
              limit_mm_per_prompt={"image": 2})
    prompts = [(f"User: {QWEN_VL_IMAGE} and {QWEN_VL_IMAGE} compare. Assistant:",
                _images([(9, 48, 48), (10, 24, 40)])),
               (f"User: {QWEN_VL_IMAGE} describe it. Assistant:", _images([(11, 40, 32)]))]
    outs = llm.generate([{"prompt": t, "multi_modal_data": {"image": i}} for t, i in prompts],
                        _params(30), use_tqdm=False)
    assert llm.llm_engine.get_stats().num_preemptions > 0
    for (text, images), out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == qwen_vl_hf_greedy(
            tiny_qwen2_5_vl, text, images, 30)


@pytest.mark.parametrize("prompt,images,match", [
    ("User: no placeholder here", [(12, 32, 32)], "image placeholders"),
    (f"User: {QWEN_VL_IMAGE} three", [(13, 16, 16)] * 3, "At most 2 image"),
])
def test_bad_image_input_is_refused(llm, prompt, images, match):
    with pytest.raises(ValueError, match=match):
        llm.generate({"prompt": prompt, "multi_modal_data": {"image": _images(images)}},
                     _params(), use_tqdm=False)


def test_tied_word_embeddings_checkpoint(tmp_path):
    """As Qwen2.5-VL-3B: no lm_head tensor; transformers 5 records the tie on the top
    config only."""
    model_dir = make_tiny_qwen2_5_vl(str(tmp_path), tie_word_embeddings=True)
    llm = LLM(model_dir, dtype="float32", max_model_len=256)
    text, specs = PROMPTS[0]
    out = llm.generate({"prompt": text, "multi_modal_data": {"image": _images(specs)}},
                       _params(4), use_tqdm=False)[0]
    assert list(out.outputs[0].token_ids) == qwen_vl_hf_greedy(model_dir, text,
                                                               _images(specs), 4)
