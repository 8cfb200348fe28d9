"""Mistral's native checkpoint format (`--config-format mistral`, `--load-format mistral`).

Mistral publishes models as `params.json` (its own config keys) and
`consolidated*.safetensors` (its own tensor names, with the query and key projections
laid out for interleaved rotary pairs). Here `params.json` becomes the Hugging Face
`MistralConfig` the model classes read, and the tensors are renamed to the Hugging Face
names and their q/k rows reordered to the half-split rotary layout the Llama-family
attention uses. Dense text models only: a `params.json` describing experts, a vision or
audio encoder, adapters or a quantized checkpoint is refused by name.
"""
from __future__ import annotations

import glob
import json
import os
import re
from typing import Any, Iterable, Iterator

import torch

PARAMS_FILE = "params.json"

_REFUSED_KEYS = {
    "moe": "mixture-of-experts models", "vision_encoder": "vision encoders",
    "multimodal": "multimodal models", "audio_encoder": "audio encoders",
    "whisper_model_args": "audio encoders", "quantization": "quantized checkpoints",
    "lora": "adapters", "yarn": "YaRN rope scaling", "llama_4_scaling": "Llama-4 scaling",
}

_LAYER_NAMES = {
    "attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj", "feed_forward.w2": "mlp.down_proj",
    "feed_forward.w3": "mlp.up_proj", "attention_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {"tok_embeddings.weight": "model.embed_tokens.weight",
              "norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)\.(weight|bias)$")


def is_mistral_format(model_path: str) -> bool:
    """A directory in Mistral's format only (params.json, no config.json): what
    --config-format auto reads as mistral, as vLLM."""
    return (os.path.isfile(os.path.join(model_path, PARAMS_FILE))
            and not os.path.isfile(os.path.join(model_path, "config.json")))


def load_params(model_path: str) -> dict[str, Any]:
    path = os.path.join(model_path, PARAMS_FILE)
    if not os.path.isfile(path):
        raise ValueError(f"--config-format mistral: no {PARAMS_FILE} in {model_path}.")
    with open(path) as f:
        return json.load(f)


def mistral_hf_config(model_path: str) -> Any:
    """The transformers MistralConfig of a params.json."""
    from transformers import MistralConfig
    params = load_params(model_path)
    for key, what in _REFUSED_KEYS.items():
        if params.get(key):
            raise ValueError(f"--config-format mistral: {PARAMS_FILE} has {key!r} ({what}); "
                             "only dense text models are read in Mistral's format here. Use "
                             "the model's Hugging Face format (config.json) instead.")
    try:
        dim, n_heads = int(params["dim"]), int(params["n_heads"])
        config = dict(
            hidden_size=dim, num_hidden_layers=int(params["n_layers"]),
            num_attention_heads=n_heads,
            num_key_value_heads=int(params.get("n_kv_heads", n_heads)),
            head_dim=int(params.get("head_dim", dim // n_heads)),
            intermediate_size=int(params["hidden_dim"]),
            rms_norm_eps=float(params.get("norm_eps", 1e-5)),
            vocab_size=int(params.get("vocab_size", 32000)),
        )
    except KeyError as e:
        raise ValueError(f"--config-format mistral: {PARAMS_FILE} in {model_path} lacks "
                         f"{e.args[0]!r}.") from None
    config.update(
        rope_theta=float(params.get("rope_theta", 10000.0)),
        max_position_embeddings=int(params.get("max_position_embeddings",
                                               params.get("max_seq_len", 32768))),
        sliding_window=params.get("sliding_window"),
        tie_word_embeddings=bool(params.get("tied_embeddings", False)),
        bos_token_id=1, eos_token_id=2, architectures=["MistralForCausalLM"],
        torch_dtype=params.get("torch_dtype", "bfloat16"),
    )
    if isinstance(config["sliding_window"], list):
        raise ValueError("--config-format mistral: per-layer sliding windows are not read.")
    return MistralConfig(**config)


def consolidated_files(model_path: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(model_path, "consolidated*.safetensors")))
    if not files:
        raise ValueError(f"--load-format mistral: no consolidated*.safetensors in "
                         f"{model_path}.")
    return files


def interleaved_to_half(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of a q/k projection from interleaved rotary pairs (x0, y0, x1, y1, ...) per
    head to the half-split layout (x0, x1, ..., y0, y1, ...)."""
    rows, cols = weight.shape[0], weight.shape[1:]
    return (weight.reshape(n_heads, rows // n_heads // 2, 2, *cols).transpose(1, 2)
            .reshape(rows, *cols))


def half_to_interleaved(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of `interleaved_to_half` (writing Mistral's format, for tests)."""
    rows, cols = weight.shape[0], weight.shape[1:]
    return (weight.reshape(n_heads, 2, rows // n_heads // 2, *cols).transpose(1, 2)
            .reshape(rows, *cols))


def hf_name(name: str) -> str:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    m = _LAYER.match(name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        raise ValueError(f"--load-format mistral: unexpected tensor {name!r} (only dense "
                         "text models are read in Mistral's format here).")
    return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"


def to_hf_weights(weights: Iterable[tuple[str, torch.Tensor]], hf_config: Any
                  ) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor) of each Mistral-format tensor."""
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", heads) or heads
    for name, tensor in weights:
        out = hf_name(name)
        if out.endswith("self_attn.q_proj.weight"):
            tensor = interleaved_to_half(tensor, heads)
        elif out.endswith("self_attn.k_proj.weight"):
            tensor = interleaved_to_half(tensor, kv_heads)
        yield out, tensor


def iterate_mistral_weights(model_path: str, hf_config: Any
                            ) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    def raw() -> Iterator[tuple[str, torch.Tensor]]:
        for path in consolidated_files(model_path):
            with safe_open(path, framework="pt", device="cpu") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
    return to_hf_weights(raw(), hf_config)
