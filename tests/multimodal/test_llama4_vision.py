"""Llama 4 with images (early fusion) against transformers on a tiny random checkpoint:
the tiles' features through the vision encoder, adapter and projector, the tiling and
placeholder block of the processor, greedy tokens for prompts with 0, 1 and 2 images (one
tile and several tiles plus the global one) where transformers is given the same pixel
tiles, TP=2 and the fake HPU (tiles padded to patch buckets) with 0 compiles after
warmup."""
from __future__ import annotations

import json
import os

import pytest
import torch

from tests.multimodal.conftest import assert_fake_hpu_matches, assert_tp2_matches, mm_greedy, random_image
from vllm import LLM

SPECIAL = ["<|image_start|>", "<|image_end|>", "<|image|>", "<|patch|>",
           "<|tile_x_separator|>", "<|tile_y_separator|>"]
PROMPTS = [("User: <|image|> describe it. Assistant:", [(0, 40, 40)]),
           ("User: <|image|> and <|image|> compare. Assistant:", [(1, 120, 60), (2, 30, 50)]),
           ("User: hello there. Assistant:", [])]


def make_tiny_llama4_vision(directory: str) -> str:
    import transformers
    from tests.models._tiny_families import BASE
    from tests.models.test_llama4 import CASES
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    tok = transformers.AutoTokenizer.from_pretrained(resolve_model_path(DEFAULT_MODEL))
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    text = dict(BASE, **CASES["moe-interleaved"], vocab_size=len(tok))
    vision = dict(hidden_size=32, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=2, image_size=56, patch_size=14,
                  pixel_shuffle_ratio=0.5, projector_input_dim=32, projector_output_dim=32,
                  vision_output_dim=32)
    config = transformers.Llama4Config(text_config=text, vision_config=vision,
                                       image_token_index=tok.convert_tokens_to_ids("<|patch|>"))
    torch.manual_seed(0)
    model = transformers.Llama4ForConditionalGeneration(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    with open(os.path.join(directory, "preprocessor_config.json"), "w") as f:
        json.dump({"image_processor_type": "Llama4ImageProcessor", "max_patches": 4,
                   "size": {"height": 56, "width": 56}}, f)
    return directory


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_llama4_vision(str(tmp_path_factory.mktemp("tiny-llama4-vision")))


@pytest.fixture(scope="module")
def llm(tiny):
    return LLM(tiny, dtype="float32", max_model_len=512, limit_mm_per_prompt={"image": 2},
               kv_cache_memory_bytes=16 << 20)


@pytest.fixture(scope="module")
def hf(tiny):
    import transformers
    return transformers.Llama4ForConditionalGeneration.from_pretrained(
        tiny, dtype=torch.float32).eval()


def _images(specs):
    return [random_image(*spec) for spec in specs]


def _processed(tiny, text, specs):
    from vllm.multimodal.llama4_processor import Llama4ImageProcessor
    return Llama4ImageProcessor.from_pretrained(tiny)([text], _images(specs))


def test_tiling_and_block(tiny):
    """A 120x60 (w x h) image: a 1 x 2 canvas of 56-pixel tiles plus the global tile; its
    block is start, two runs of 4 patches split by one x-separator and closed by a
    y-separator, <|image|>, the global run, end."""
    out = _processed(tiny, "a <|image|> b", [(1, 120, 60)])
    assert out["aspect_ratios"].tolist() == [[1, 2]] and out["pixel_values"].shape[0] == 3
    from vllm.multimodal.llama4_processor import Llama4ImageProcessor
    tok = Llama4ImageProcessor.from_pretrained(tiny).tokenizer
    run = "<|patch|>" * 4
    block = (f"<|image_start|>{run}<|tile_x_separator|>{run}<|tile_y_separator|>"
             f"<|image|>{run}<|image_end|>")
    assert tok.decode(out["input_ids"][0]).replace(" ", "") == f"a{block}b"


def _hf_features(hf, pixels):
    with torch.no_grad():
        feats = hf.get_image_features(pixel_values=pixels).last_hidden_state
        return hf.multi_modal_projector(feats.reshape(-1, feats.shape[-1]))


@pytest.mark.parametrize("pad", [False, True])
def test_image_features_match_transformers(llm, hf, tiny, pad):
    out = _processed(tiny, PROMPTS[1][0], PROMPTS[1][1])
    expected = _hf_features(hf, out["pixel_values"])
    model = llm.collective_rpc(lambda worker: worker.model_runner.model)[0]
    items = model.split_mm_data(out, 2)
    total = sum(model.mm_item_size(it) for it in items)
    patch = model.image_token_id(model.config)
    with torch.no_grad():
        blocks = model.embed_multimodal(items, pad_to=total + 64 if pad else None)
    ids = out["input_ids"][0]
    rows = torch.cat([b[torch.tensor(r)] for b, r in zip(blocks, _patch_rows(ids, patch, items,
                                                                           model))])
    torch.testing.assert_close(rows, expected, atol=1e-4, rtol=1e-4)


def _patch_rows(ids, patch, items, model):
    """Per image, the rows of its block that are patch tokens."""
    out = []
    starts = (ids == int(items[0]["image_special_ids"][0])).nonzero().view(-1).tolist()
    for item, start in zip(items, starts):
        n = model.num_mm_tokens(model.config, item)
        block = ids[start:start + n]
        out.append((block == patch).nonzero().view(-1).tolist())
    return out


def _hf_greedy(hf, tiny, text, specs, n=8):
    import transformers
    if specs:
        out = _processed(tiny, text, specs)
        ids = out["input_ids"]
        embeds = hf.language_model.get_input_embeddings()(ids)
        feats = _hf_features(hf, out["pixel_values"])
        mask = (ids == hf.config.image_token_index)[..., None].expand_as(embeds)
        embeds = embeds.masked_scatter(mask, feats)
    else:
        ids = transformers.AutoTokenizer.from_pretrained(tiny)([text],
                                                               return_tensors="pt").input_ids
        embeds = hf.language_model.get_input_embeddings()(ids)
    with torch.no_grad():
        return hf.language_model.generate(inputs_embeds=embeds, max_new_tokens=n,
                                          do_sample=False)[0].tolist()


def test_greedy_matches_transformers(llm, hf, tiny):
    for (text, specs), ours in zip(PROMPTS, mm_greedy(llm, PROMPTS)):
        assert ours == _hf_greedy(hf, tiny, text, specs)


@pytest.mark.timeout(300)
def test_tp2_matches_tp1(llm, tiny):
    assert_tp2_matches(tiny, PROMPTS, mm_greedy(llm, PROMPTS))


def test_fake_hpu_matches_cpu_without_compiles(llm, tiny):
    assert_fake_hpu_matches(tiny, PROMPTS, mm_greedy(llm, PROMPTS, n=6))
