"""LLaVA-1.5 offline: greedy tokens equal transformers' for 1 and 2 images of different
sizes; the encoder runs once per image; bad multimodal input is refused by name."""
from __future__ import annotations

import pytest

from tests.multimodal.conftest import hf_greedy, random_image
from vllm import LLM, SamplingParams

PROMPTS = [("USER: <image> describe it. ASSISTANT:", [(0, 40, 56)]),
           ("USER: <image> and <image> compare. ASSISTANT:", [(1, 64, 64), (2, 24, 48)])]


@pytest.fixture(scope="module")
def llm(tiny_llava):
    return LLM(tiny_llava, dtype="float32", max_model_len=512,
               limit_mm_per_prompt={"image": 2})


def _params() -> SamplingParams:
    return SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def test_greedy_matches_transformers(llm, tiny_llava):
    prompts = [(text, [random_image(*spec) for spec in specs]) for text, specs in PROMPTS]
    outs = llm.generate([{"prompt": t, "multi_modal_data": {"image": ims}}
                         for t, ims in prompts], _params(), use_tqdm=False)
    for (text, images), out in zip(prompts, outs):
        expected = hf_greedy(tiny_llava, "LlavaForConditionalGeneration", text, images, 8)
        assert list(out.outputs[0].token_ids) == expected


def test_single_image_not_in_list_and_chat(llm, tiny_llava):
    image = random_image(3, 32, 32)
    out = llm.generate({"prompt": PROMPTS[0][0], "multi_modal_data": {"image": image}},
                       _params(), use_tqdm=False)[0]
    expected = hf_greedy(tiny_llava, "LlavaForConditionalGeneration", PROMPTS[0][0],
                         [image], 8)
    assert list(out.outputs[0].token_ids) == expected


@pytest.mark.parametrize("mm_data,match", [
    ({"image": [random_image(0, 8, 8)] * 3}, "At most 2 image"),
    ({"video": []}, "modality 'video'"),
    ({"image": "not an image"}, r"multi_modal_data\['image'\]\[0\]"),
])
def test_bad_multimodal_input_is_refused(llm, mm_data, match):
    with pytest.raises(ValueError, match=match):
        llm.generate({"prompt": "USER: <image> hi", "multi_modal_data": mm_data},
                     _params(), use_tqdm=False)


def test_placeholder_count_must_match(llm):
    with pytest.raises(ValueError, match="image placeholder|<image> tokens"):
        llm.generate({"prompt": "USER: no placeholder here",
                      "multi_modal_data": {"image": random_image(0, 32, 32)}},
                     _params(), use_tqdm=False)


def test_text_model_refuses_images(tiny_model_factory):
    llm = LLM(tiny_model_factory("llama"), dtype="float32", max_model_len=256)
    with pytest.raises(ValueError, match="multi_modal_data"):
        llm.generate({"prompt": "hi", "multi_modal_data": {"image": random_image(0, 8, 8)}},
                     _params(), use_tqdm=False)


def test_chat_with_image_parts_matches_transformers(llm, tiny_llava):
    import base64
    import io

    from transformers import AutoTokenizer
    first, second = random_image(5, 40, 40), random_image(6, 32, 48)
    buf = io.BytesIO()
    second.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    messages = [{"role": "user", "content": [
        {"type": "image_pil", "image_pil": first},
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "Same?"}]}]
    out = llm.chat(messages, _params(), use_tqdm=False)[0]
    text = AutoTokenizer.from_pretrained(tiny_llava).apply_chat_template(
        [{"role": "user", "content": "<image>\n<image>\nSame?"}], tokenize=False,
        add_generation_prompt=True)
    expected = hf_greedy(tiny_llava, "LlavaForConditionalGeneration", text,
                         [first, second], 8)
    assert list(out.outputs[0].token_ids) == expected
