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
