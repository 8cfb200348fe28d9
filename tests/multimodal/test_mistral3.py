"""Mistral 3 (Pixtral tower, patch merger, Mistral language model) offline against
transformers on a tiny random checkpoint: the image features per image and padded, the
placeholder block (rows of [IMG] closed by [IMG_BREAK] / [IMG_END]), greedy tokens for
prompts with 0, 1 and 2 images of different sizes, TP=2, bad inputs refused, and the
fake HPU equal to CPU with 0 compiles after warmup."""
from __future__ import annotations

import pytest
import torch

from tests.multimodal.conftest import assert_fake_hpu_matches, assert_tp2_matches, mm_greedy, random_image
from vllm import LLM, SamplingParams

IMG = "[IMG]"
PROMPTS = [(f"User: {IMG} describe it. Assistant:", [(0, 40, 24)]),
           (f"User: {IMG} and {IMG} compare. Assistant:", [(1, 32, 32), (2, 16, 40)]),
           ("User: hello there. Assistant:", [])]


def make_tiny_mistral3(directory: str) -> str:
    """A 2-block Pixtral tower (4x4 patches, 2x2 merge, longest edge 32 px) and a
    2-layer Mistral, with the default model's tokenizer plus Pixtral's image tokens."""
    import transformers
    from transformers.models.pixtral.image_processing_pil_pixtral import (
        PixtralImageProcessorPil)
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    tok = transformers.AutoTokenizer.from_pretrained(resolve_model_path(DEFAULT_MODEL))
    tok.add_special_tokens({"additional_special_tokens": [IMG, "[IMG_BREAK]", "[IMG_END]"]})
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, head_dim=16, patch_size=4, image_size=64,
                  hidden_act="silu")
    text = dict(model_type="mistral", vocab_size=len(tok), hidden_size=64,
                intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, sliding_window=None)
    config = transformers.Mistral3Config(vision_config=vision, text_config=text,
                                         image_token_id=tok.convert_tokens_to_ids(IMG),
                                         spatial_merge_size=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.Mistral3ForConditionalGeneration(config)
    with torch.no_grad():  # widen near-uniform random logits so greedy is decisive
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    PixtralImageProcessorPil(patch_size={"height": 4, "width": 4},
                             size={"longest_edge": 32}).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_mistral3(str(tmp_path_factory.mktemp("tiny-mistral3")))


@pytest.fixture(scope="module")
def llm(tiny):
    return LLM(tiny, dtype="float32", max_model_len=512, limit_mm_per_prompt={"image": 2})


@pytest.fixture(scope="module")
def hf(tiny):
    import transformers
    return transformers.Mistral3ForConditionalGeneration.from_pretrained(
        tiny, dtype=torch.float32).eval()


def _images(specs):
    return [random_image(*spec) for spec in specs]


def _hf_inputs(tiny: str, prompt: str, images: list) -> dict:
    from vllm.multimodal.pixtral_processor import PixtralImageProcessor
    if not images:
        import transformers
        return dict(transformers.AutoTokenizer.from_pretrained(tiny)([prompt],
                                                                    return_tensors="pt"))
    out = PixtralImageProcessor.from_pretrained(tiny)([prompt], images)
    return {k: out[k] for k in ("input_ids", "attention_mask", "pixel_values", "image_sizes")}


def test_placeholder_block_follows_pixtral_rule(tiny):
    """An image resized to H x W px has H/8 x W/8 merged tokens (4 px patches, 2x2
    merge): H/8 rows of W/8 [IMG], each row closed by [IMG_BREAK], the last by
    [IMG_END]."""
    from vllm.multimodal.pixtral_processor import PixtralImageProcessor
    proc = PixtralImageProcessor.from_pretrained(tiny)
    out = proc([f"a {IMG} b"], [random_image(0, 24, 40)])
    (height, width), = out["image_sizes"].tolist()
    assert height == 32 and 0 < width < 32  # the longest edge fits 32 px
    rows, cols = height // 8, width // 8
    block = ("[IMG]" * cols + "[IMG_BREAK]") * (rows - 1) + "[IMG]" * cols + "[IMG_END]"
    assert proc.tokenizer.decode(out["input_ids"][0]).replace(" ", "") == f"a{block}b"


@pytest.mark.parametrize("pad", [False, True])
def test_image_features_match_transformers(llm, hf, tiny, pad):
    inputs = _hf_inputs(tiny, PROMPTS[1][0], _images(PROMPTS[1][1]))
    with torch.no_grad():
        expected = hf.model.get_image_features(inputs["pixel_values"],
                                               inputs["image_sizes"]).pooler_output
    model = llm.collective_rpc(lambda worker: worker.model_runner.model)[0]
    from vllm.multimodal.pixtral_processor import PixtralImageProcessor
    out = PixtralImageProcessor.from_pretrained(tiny)([PROMPTS[1][0]], _images(PROMPTS[1][1]))
    items = model.split_mm_data(out, 2)
    total = sum(it["pixel_values"].shape[0] for it in items)
    with torch.no_grad():
        ours = model.embed_multimodal(items, pad_to=total + 16 if pad else None)
    for o, e, it in zip(ours, expected, items):
        h, w = (int(v) // 2 for v in it["image_grid"].view(-1))
        image_rows = o.view(h, w + 1, -1)[:, :w].reshape(-1, o.shape[-1])
        torch.testing.assert_close(image_rows, e, atol=1e-4, rtol=1e-4)


def test_greedy_matches_transformers(llm, hf, tiny):
    got = mm_greedy(llm, PROMPTS)
    for (text, specs), ours in zip(PROMPTS, got):
        inputs = _hf_inputs(tiny, text, _images(specs))
        with torch.no_grad():
            out = hf.generate(**inputs, max_new_tokens=8, do_sample=False)
        assert ours == out[0, inputs["input_ids"].shape[1]:].tolist()


@pytest.mark.parametrize("prompt,specs,match", [
    ("User: no placeholder here", [(12, 32, 32)], "placeholder"),
    (f"User: {IMG} three", [(13, 16, 16)] * 3, "At most 2 image"),
])
def test_bad_image_input_is_refused(llm, prompt, specs, match):
    with pytest.raises(ValueError, match=match):
        llm.generate({"prompt": prompt, "multi_modal_data": {"image": _images(specs)}},
                     SamplingParams(max_tokens=2), use_tqdm=False)


@pytest.mark.timeout(300)
def test_tp2_matches_tp1(llm, tiny):
    assert_tp2_matches(tiny, PROMPTS, mm_greedy(llm, PROMPTS))


def test_fake_hpu_matches_cpu_without_compiles(llm, tiny):
    def buckets(runner):
        assert runner.vision_encoder.buckets == [64]  # 32 px edge: 64 patches at most
    assert_fake_hpu_matches(tiny, PROMPTS, mm_greedy(llm, PROMPTS, n=6), buckets)
