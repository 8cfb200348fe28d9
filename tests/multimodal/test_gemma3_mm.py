"""Gemma 3 multimodal (SigLIP tower, pooled projector, Gemma 3 language model with 5:1
sliding / global layers) against transformers on a tiny random checkpoint: the image
features, greedy tokens for prompts with 0, 1 and 2 images where an image's tokens
attend to each other both ways (causal attention gives other tokens: shown), images
never split between steps under a small token budget, the masked attention against a
float64 reference, TP=2, and the fake HPU equal to CPU with 0 compiles after warmup."""
from __future__ import annotations

import pytest
import torch

from tests.multimodal.conftest import assert_fake_hpu_matches, assert_tp2_matches, mm_greedy, random_image
from vllm import LLM

BOI, SOFT, EOI = "<start_of_image>", "<image_soft_token>", "<end_of_image>"
PROMPTS = [(f"User: {BOI} describe it. Assistant:", [(0, 40, 24)]),
           (f"User: {BOI} and {BOI} compare. Assistant:", [(1, 32, 32), (2, 16, 40)]),
           ("User: hello there. Assistant:", [])]


def make_tiny_gemma3(directory: str) -> str:
    """A 2-block SigLIP (32 px, 4 px patches -> 64 patches, pooled to 16 tokens) and a
    4-layer Gemma 3 (3 sliding layers with a window of 8, then a global one), with the
    default model's tokenizer plus Gemma 3's image tokens."""
    import transformers
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    tok = transformers.AutoTokenizer.from_pretrained(resolve_model_path(DEFAULT_MODEL))
    tok.add_special_tokens({"additional_special_tokens": [BOI, SOFT, EOI]})
    boi, soft, eoi = tok.convert_tokens_to_ids([BOI, SOFT, EOI])
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, patch_size=4, image_size=32, vision_use_head=False)
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, max_position_embeddings=1024, sliding_window=8,
                layer_types=["sliding_attention"] * 3 + ["full_attention"],
                query_pre_attn_scalar=16, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config = transformers.Gemma3Config(vision_config=vision, text_config=text,
                                       mm_tokens_per_image=16, image_token_id=soft,
                                       boi_token_id=boi, eoi_token_id=eoi,
                                       tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config)
    with torch.no_grad():  # decisive greedy; norms away from their neutral zero offset
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
            elif "norm" in name:
                p.normal_(0, 0.3)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    Gemma3ImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_gemma3(str(tmp_path_factory.mktemp("tiny-gemma3")))


@pytest.fixture(scope="module")
def llm(tiny):
    return LLM(tiny, dtype="float32", max_model_len=512, limit_mm_per_prompt={"image": 2})


@pytest.fixture(scope="module")
def hf(tiny):
    import transformers
    return transformers.Gemma3ForConditionalGeneration.from_pretrained(
        tiny, dtype=torch.float32).eval()


def _images(specs):
    return [random_image(*spec) for spec in specs]


def _hf_greedy(hf, tiny, text, specs, n=8, bidirectional=True):
    from vllm.multimodal.gemma3_processor import Gemma3ImageProcessor
    proc = Gemma3ImageProcessor.from_pretrained(tiny)
    if specs:
        inputs = proc([text], _images(specs))
        soft = proc.tokenizer.convert_tokens_to_ids(SOFT)
        if bidirectional:
            inputs["token_type_ids"] = (inputs["input_ids"] == soft).long()
    else:
        inputs = dict(proc.tokenizer([text], return_tensors="pt"))
    with torch.no_grad():
        out = hf.generate(**inputs, max_new_tokens=n, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def test_image_features_match_transformers(llm, hf, tiny):
    from vllm.multimodal.gemma3_processor import Gemma3ImageProcessor
    out = Gemma3ImageProcessor.from_pretrained(tiny)([PROMPTS[1][0]], _images(PROMPTS[1][1]))
    with torch.no_grad():
        expected = hf.model.get_image_features(out["pixel_values"]).pooler_output
    model = llm.collective_rpc(lambda worker: worker.model_runner.model)[0]
    with torch.no_grad():
        ours = torch.stack(model.embed_multimodal(model.split_mm_data(out, 2)))
    scale = model.language_model.model.embedding_multiplier
    torch.testing.assert_close(ours * scale, expected, atol=1e-4, rtol=1e-4)


def test_greedy_matches_transformers_with_images_attended_both_ways(llm, hf, tiny):
    got = mm_greedy(llm, PROMPTS)
    for (text, specs), ours in zip(PROMPTS, got):
        assert ours == _hf_greedy(hf, tiny, text, specs)
    # not vacuous: transformers attending the images causally gives other tokens
    assert any(_hf_greedy(hf, tiny, t, s, bidirectional=False) != ours
               for (t, s), ours in zip(PROMPTS[:2], got))


def test_images_are_never_split_between_steps(llm, tiny):
    """A 24-token budget with 16-token images: chunks stop before an image that would
    not fit whole, and the tokens equal the unchunked run."""
    small = LLM(tiny, dtype="float32", max_model_len=512, limit_mm_per_prompt={"image": 2},
                max_num_batched_tokens=24, enable_prefix_caching=False)
    try:
        assert small.llm_engine.vllm_config.scheduler_config.disable_chunked_mm_input
        assert mm_greedy(small, PROMPTS[:2]) == mm_greedy(llm, PROMPTS[:2])
    finally:
        small.llm_engine.shutdown()
    tight = LLM(tiny, dtype="float32", max_model_len=512, max_num_batched_tokens=12,
                enable_prefix_caching=False)
    try:
        with pytest.raises(ValueError, match="multi_modal_data: an image fills 16 tokens"):
            mm_greedy(tight, PROMPTS[:1])
    finally:
        tight.llm_engine.shutdown()


def test_masked_attention_with_image_groups_matches_float64_reference():
    from types import SimpleNamespace
    from vllm.attention.ops.masked_attention import masked_attention
    torch.manual_seed(0)
    t, h, d, window = 12, 2, 8, 6
    layer = SimpleNamespace(num_heads=h, num_kv_heads=h, head_size=d, scale=d ** -0.5,
                            logits_soft_cap=None, sliding_window=window)
    q, k, v = (torch.randn(t, h * d) for _ in range(3))
    groups = torch.tensor([-1, -1, 0, 0, 0, 0, -1, 1, 1, 1, -1, -1])
    pos = torch.arange(t)
    out = masked_attention(layer, q, k, v, pos, pos, groups, groups)
    qd, kd, vd = (x.double().view(t, h, d).transpose(0, 1) for x in (q, k, v))
    scores = qd @ kd.transpose(1, 2) * layer.scale
    same = (groups[:, None] == groups[None, :]) & (groups[:, None] >= 0)
    allowed = ((pos[None, :] <= pos[:, None]) | same) & (pos[None, :] > pos[:, None] - window)
    ref = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ vd
    torch.testing.assert_close(out.double(), ref.transpose(0, 1).reshape(t, h * d),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.timeout(300)
def test_tp2_matches_tp1(llm, tiny):
    assert_tp2_matches(tiny, PROMPTS, mm_greedy(llm, PROMPTS))


def test_fake_hpu_matches_cpu_without_compiles(llm, tiny):
    assert_fake_hpu_matches(tiny, PROMPTS, mm_greedy(llm, PROMPTS, n=6))
