"""Tiny random-weight multimodal checkpoints (saved with their processors) and images."""
from __future__ import annotations

import numpy as np
import pytest


def make_tiny_llava(directory: str) -> str:
    """LLaVA-1.5 layout: a 2-layer CLIP tower (32x32 images, 8x8 patches: 16 image tokens),
    a gelu projector and a 2-layer Llama, with the default model's tokenizer plus an
    `<image>` token, and a LlavaProcessor on the PIL CLIP image processor."""
    import torch
    import transformers
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    tok = transformers.AutoTokenizer.from_pretrained(resolve_model_path(DEFAULT_MODEL))
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_id = tok.convert_tokens_to_ids("<image>")
    vision = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=2, num_attention_heads=4,
                                           image_size=32, patch_size=8, projection_dim=32)
    text = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, max_position_embeddings=1024,
                                    rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
                                    tie_word_embeddings=False)
    config = transformers.LlavaConfig(vision_config=vision, text_config=text,
                                      image_token_index=image_id, vision_feature_layer=-2,
                                      vision_feature_select_strategy="default",
                                      projector_hidden_act="gelu")
    torch.manual_seed(0)
    model = transformers.LlavaForConditionalGeneration(config)
    with torch.no_grad():  # widen near-uniform random logits so greedy is decisive
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
    model.save_pretrained(directory)
    images = CLIPImageProcessorPil(size={"shortest_edge": 32},
                                   crop_size={"height": 32, "width": 32})
    transformers.LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=8,
                                vision_feature_select_strategy="default",
                                image_token="<image>",
                                num_additional_image_tokens=1).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_llava(tmp_path_factory) -> str:
    return make_tiny_llava(str(tmp_path_factory.mktemp("tiny-llava")))


QWEN_VL_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
"""What a Qwen2.5-VL prompt holds for one image."""


def make_tiny_qwen2_5_vl(directory: str, tie_word_embeddings: bool = False,
                         qwen2_vl: bool = False) -> str:
    """Qwen2.5-VL layout: a 4-block vision encoder (4x4 patches, 2x2 merge, windows of
    2x2 merge blocks, full attention in blocks 1 and 3) and a 2-layer M-RoPE Qwen2,
    with the default model's tokenizer plus Qwen's vision tokens, and the checkpoint's
    image processor (small pixel limits: 4 to 36 image tokens). transformers' processor
    class needs torchvision (its video half), so the parts are saved on their own, as
    a checkpoint's files are. Tied embeddings (as Qwen2.5-VL-3B) save no lm_head; untied
    ones make the stronger greedy test (a tied random model repeats its input token).
    `qwen2_vl`: Qwen2-VL's encoder instead (width 32 as `embed_dim`, LayerNorm blocks,
    quick_gelu fc1/fc2 MLP, no windows) in front of the same language model."""
    import torch
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil)

    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    tok = transformers.AutoTokenizer.from_pretrained(resolve_model_path(DEFAULT_MODEL))
    special = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tok.add_special_tokens({"additional_special_tokens": special})
    start, end, image, video = tok.convert_tokens_to_ids(special)
    vision = dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=4,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=16,
                  out_hidden_size=64, fullatt_block_indexes=[1, 3], hidden_act="silu")
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=1024, rms_norm_eps=1e-6, bos_token_id=1,
                eos_token_id=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [2, 3, 3]})
    family = "Qwen2_5_VL"
    if qwen2_vl:
        family = "Qwen2VL"
        vision = dict(depth=3, embed_dim=32, hidden_size=64, mlp_ratio=2, num_heads=4,
                      patch_size=4, spatial_merge_size=2, temporal_patch_size=2,
                      hidden_act="quick_gelu")
    config = getattr(transformers, f"{family}Config")(
        vision_config=vision, text_config=text, image_token_id=image, video_token_id=video,
        vision_start_token_id=start, vision_end_token_id=end,
        tie_word_embeddings=tie_word_embeddings)
    torch.manual_seed(0)
    model = getattr(transformers, f"{family}ForConditionalGeneration")(config)
    with torch.no_grad():  # widen near-uniform random logits so greedy is decisive
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2,
                             min_pixels=16 * 16, max_pixels=48 * 48).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_qwen2_5_vl(tmp_path_factory) -> str:
    return make_tiny_qwen2_5_vl(str(tmp_path_factory.mktemp("tiny-qwen2_5_vl")))


def make_tiny_qwen3_vl(directory: str, moe: bool = False,
                       tie_word_embeddings: bool = False) -> str:
    """Qwen3-VL layout: a 3-block vision encoder (4x4 patches, 2x2 merge, a 4x4 learned
    position table resampled per image, DeepStack from blocks 0 and 1) and a 3-layer
    Qwen3 (head_dim 32, interleaved M-RoPE sections [6, 5, 5]) that takes the DeepStack
    features after its layers 0 and 1; the tokenizer and image processor as
    `make_tiny_qwen2_5_vl` (4 to 36 image tokens). `moe`: Qwen3-VL-MoE, whose language
    model has 4 experts (top 2) in layers 0 and 1 and a dense MLP in layer 2. Tied
    embeddings (as the 2B and 4B checkpoints): transformers ties by the top config."""
    import torch
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil)

    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    tok = transformers.AutoTokenizer.from_pretrained(resolve_model_path(DEFAULT_MODEL))
    special = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tok.add_special_tokens({"additional_special_tokens": special})
    start, end, image, video = tok.convert_tokens_to_ids(special)
    vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=4,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
                  num_position_embeddings=16, deepstack_visual_indexes=[0, 1],
                  hidden_act="gelu_pytorch_tanh")
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, head_dim=32,
                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=1024, rms_norm_eps=1e-6, bos_token_id=1,
                eos_token_id=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [6, 5, 5], "mrope_interleaved": True})
    family = "Qwen3VL"
    if moe:
        family = "Qwen3VLMoe"
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                    decoder_sparse_step=1, mlp_only_layers=[2])
    config = getattr(transformers, f"{family}Config")(
        vision_config=vision, text_config=text, image_token_id=image, video_token_id=video,
        vision_start_token_id=start, vision_end_token_id=end,
        tie_word_embeddings=tie_word_embeddings)
    torch.manual_seed(0)
    model = getattr(transformers, f"{family}ForConditionalGeneration")(config)
    with torch.no_grad():  # widen near-uniform random logits so greedy is decisive
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2,
                             min_pixels=16 * 16, max_pixels=48 * 48).save_pretrained(directory)
    return directory


def qwen_vl_hf_inputs(model_dir: str, prompt: str, images: list) -> dict:
    """transformers' model inputs for a Qwen2.5-VL prompt, made here from the
    checkpoint's image processor and tokenizer (transformers' processor class needs
    torchvision): each image's placeholder expanded to grid / merge^2 pad tokens,
    and the token types the model's own M-RoPE position computation reads."""
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    if not images:
        return dict(tok([prompt], return_tensors="pt"))
    images_out = transformers.AutoImageProcessor.from_pretrained(model_dir)(
        images=images, return_tensors="pt")
    counts = (images_out["image_grid_thw"].prod(-1) // 4).tolist()
    pieces = prompt.split("<|image_pad|>")
    assert len(pieces) == len(counts) + 1
    text = pieces[0] + "".join("<|image_pad|>" * n + p for n, p in zip(counts, pieces[1:]))
    inputs = dict(tok([text], return_tensors="pt"), **images_out)
    inputs["mm_token_type_ids"] = (
        inputs["input_ids"] == tok.convert_tokens_to_ids("<|image_pad|>")).int()
    return inputs


def qwen_vl_hf_greedy(model_dir: str, prompt: str, images: list, max_new_tokens: int,
                      hf_cls: str = "Qwen2_5_VLForConditionalGeneration") -> list[int]:
    """transformers' greedy continuation of a Qwen2.5-VL (or `hf_cls`: Qwen2-VL)
    prompt with `images` (fp32)."""
    import torch
    import transformers
    model = getattr(transformers, hf_cls).from_pretrained(model_dir,
                                                          dtype=torch.float32).eval()
    inputs = qwen_vl_hf_inputs(model_dir, prompt, images)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def random_image(seed: int, width: int, height: int):
    from PIL import Image
    pixels = np.random.RandomState(seed).randint(0, 255, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def hf_greedy(model_dir: str, model_cls_name: str, prompt: str, images: list,
              max_new_tokens: int) -> list[int]:
    """transformers' greedy continuation of `prompt` with `images` (fp32)."""
    import torch
    import transformers
    proc = transformers.AutoProcessor.from_pretrained(model_dir)
    model = getattr(transformers, model_cls_name).from_pretrained(model_dir,
                                                                  dtype=torch.float32)
    inputs = proc(text=[prompt], images=images, return_tensors="pt")
    with torch.no_grad():
        out = model.eval().generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def mm_greedy(engine, prompts: list, n: int = 8) -> list[list[int]]:
    """Greedy tokens of (text, [random_image specs]) prompts (no specs: text only)."""
    from vllm import SamplingParams
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    reqs = [{"prompt": t, "multi_modal_data": {"image": [random_image(*s) for s in specs]}}
            if specs else t for t, specs in prompts]
    return [list(o.outputs[0].token_ids) for o in engine.generate(reqs, params,
                                                                 use_tqdm=False)]


def assert_tp2_matches(model_dir: str, prompts: list, expected: list) -> None:
    """TP=2 over worker processes gives `expected` (the one-process tokens)."""
    from vllm import LLM
    tp2 = LLM(model_dir, dtype="float32", max_model_len=512, limit_mm_per_prompt={"image": 2},
              tensor_parallel_size=2, distributed_executor_backend="mp",
              kv_cache_memory_bytes=16 << 20)
    try:
        assert mm_greedy(tp2, prompts) == expected
    finally:
        tp2.llm_engine.shutdown()


def assert_fake_hpu_matches(model_dir: str, prompts: list, expected: list,
                            check_runner=None) -> None:
    """The fake HPU (small buckets, lazy mode) gives `expected` (the CPU's 6 greedy tokens)
    with nothing compiled after warmup; `check_runner(runner)` may look at the runner."""
    from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env, release, runner_of
    with platform_env("hpu", **dict(SMALL_BUCKETS, PT_HPU_LAZY_MODE="1")):
        hpu = make_llm(model=model_dir, max_model_len=256, max_num_seqs=4, block_size=16,
                       kv_cache_memory_bytes=1 << 20, limit_mm_per_prompt={"image": 2})
        try:
            runner = runner_of(hpu)
            if check_runner is not None:
                check_runner(runner)
            got = mm_greedy(hpu, prompts, n=6)
            assert runner.tracker.num_compiles_after_warmup == 0, \
                runner.tracker.compiled_labels[True]
        finally:
            release(hpu)
    assert got == expected
