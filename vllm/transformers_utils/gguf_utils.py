"""Turn a .gguf file into a cached HF-style model directory, once.

The engine only ever loads HF-style directories. A GGUF file is converted the
first time it is used: tensors are dequantized to float32 and renamed to HF names,
the rotary permutation llama.cpp applies to q/k weights is undone (as transformers
does when it loads a GGUF), and the tokenizer (with its chat template) is exported
through transformers. The result lives under
`$VLLM_CACHE_ROOT/gguf/<stem>-<hash of path, size, mtime>`; editing or replacing the
file therefore yields a new directory, and later calls return at once.

The directory is written to a temporary sibling and renamed into place, so two
processes converting at the same time both end up with one complete copy.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from typing import Any

import numpy as np
import torch

from vllm import envs

logger = logging.getLogger(__name__)

# Bump when the output format changes, so stale cached conversions are not reused.
CONVERTER_VERSION = 1

# general.architecture -> (transformers model_type, HF architecture class name)
_ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
}

# "<arch>.<key>" metadata -> HF config field.
_CONFIG_KEYS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
}

_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Precomputed tensors HF models recompute themselves (llama3 rope frequency factors).
_SKIPPED_TENSORS = {"rope_freqs"}


def converted_dir(gguf_path: str) -> str:
    """Cache directory for this exact file (path, size, modification time, converter)."""
    path = os.path.abspath(gguf_path)
    st = os.stat(path)
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}|v{CONVERTER_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    stem = os.path.splitext(os.path.basename(path))[0]
    return os.path.join(envs.VLLM_CACHE_ROOT, "gguf", f"{stem}-{digest}")


def ensure_converted(gguf_path: str) -> str:
    """The HF-style directory for `gguf_path`, converting the file on first use."""
    if not os.path.isfile(gguf_path):
        raise ValueError(f"GGUF file {gguf_path!r} does not exist.")
    out = converted_dir(gguf_path)
    if os.path.isfile(os.path.join(out, "config.json")):
        return out
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    logger.info("Converting GGUF %s to %s (once)", gguf_path, out)
    start = time.perf_counter()
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(out)}.tmp-")
    try:
        convert_gguf(os.path.abspath(gguf_path), tmp)
        try:
            os.rename(tmp, out)
        except OSError:
            if not os.path.isfile(os.path.join(out, "config.json")):
                raise
            logger.info("Another process converted %s first; using its copy", gguf_path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("Converted GGUF in %.1f s", time.perf_counter() - start)
    return out


def convert_gguf(gguf_path: str, out_dir: str) -> None:
    """Write config.json, generation_config.json, model.safetensors and the tokenizer."""
    from gguf import GGUFReader

    reader = GGUFReader(gguf_path)
    meta = _read_metadata(reader)
    config = _build_config(reader, meta)
    config.save_pretrained(out_dir)
    tensors = _convert_tensors(reader, meta["general.architecture"], config)
    del reader
    from safetensors.torch import save_file
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    del tensors
    gen = {k: getattr(config, k) for k in ("bos_token_id", "eos_token_id")
           if getattr(config, k, None) is not None}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    _export_tokenizer(gguf_path, out_dir)


def _read_metadata(reader: Any) -> dict[str, Any]:
    """Scalar and string metadata (token lists and other arrays are skipped)."""
    from gguf import GGUFValueType

    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if not field.types or field.types[0] == GGUFValueType.ARRAY:
            continue
        meta[key] = field.contents()
    return meta


def _build_config(reader: Any, meta: dict[str, Any]) -> Any:
    import transformers

    arch = meta.get("general.architecture")
    if arch not in _ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: "
                         f"{', '.join(sorted(_ARCHITECTURES))}.")
    model_type, hf_arch = _ARCHITECTURES[arch]
    # llama.cpp stores Mistral models as "llama"; the name tells them apart.
    if arch == "llama" and "mistral" in str(meta.get("general.name", "")).lower():
        model_type, hf_arch = "mistral", "MistralForCausalLM"
    fields: dict[str, Any] = {}
    for key, hf_key in _CONFIG_KEYS.items():
        if f"{arch}.{key}" in meta:
            fields[hf_key] = meta[f"{arch}.{key}"]
    if "vocab_size" not in fields:
        fields["vocab_size"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    head_dim = meta.get(f"{arch}.attention.key_length")
    if head_dim is None and arch == "llama":
        head_dim = meta.get(f"{arch}.rope.dimension_count")
    if head_dim is not None:
        fields["head_dim"] = int(head_dim)
    scaling_type = meta.get(f"{arch}.rope.scaling.type")
    if scaling_type == "linear":
        fields["rope_scaling"] = {"rope_type": "linear",
                                  "factor": float(meta[f"{arch}.rope.scaling.factor"])}
    elif scaling_type not in (None, "none"):
        raise ValueError(f"GGUF rope scaling {scaling_type!r} is not supported; supported: "
                         "none, linear.")
    for key in ("bos", "eos", "padding", "unknown"):
        token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None:
            name = {"padding": "pad", "unknown": "unk"}.get(key, key)
            fields[f"{name}_token_id"] = int(token_id)
    names = {t.name for t in reader.tensors}
    fields["tie_word_embeddings"] = "output.weight" not in names
    config = transformers.AutoConfig.for_model(model_type, **fields)
    config.architectures = [hf_arch]
    config.dtype = torch.float32
    return config


def _reverse_rotary_permutation(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order (interleaved rotary pairs) -> HF's half split.

    llama.cpp reorders each head's rows from [first half, second half] to pairs
    (x0, x_{d/2}, x1, ...); reading the rows as [head, pair, 2] and swapping the
    last two axes restores the original order.
    """
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_tensor_name(gguf_name: str) -> str | None:
    base, _, suffix = gguf_name.rpartition(".")
    if base in _SKIPPED_TENSORS:
        return None
    if base in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[base]}.{suffix}"
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if m and m.group(2) in _LAYER_TENSORS:
        return f"model.layers.{m.group(1)}.{_LAYER_TENSORS[m.group(2)]}.{suffix}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no known HF equivalent.")


def _convert_tensors(reader: Any, arch: str, config: Any) -> dict[str, torch.Tensor]:
    from gguf.quants import dequantize

    permute = arch == "llama"
    out: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = _hf_tensor_name(tensor.name)
        if name is None:
            logger.info("Skipping GGUF tensor %s (recomputed by the model)", tensor.name)
            continue
        w = dequantize(tensor.data, tensor.tensor_type)
        if permute and ".attn_q." in tensor.name:
            w = _reverse_rotary_permutation(w, config.num_attention_heads)
        elif permute and ".attn_k." in tensor.name:
            w = _reverse_rotary_permutation(w, config.num_key_value_heads)
        # Unquantized tensors are read-only views of the mmapped file: copy those only.
        out[name] = torch.from_numpy(np.require(w, np.float32, ["C", "W"]))
    return out


def _export_tokenizer(gguf_path: str, out_dir: str) -> None:
    import transformers

    folder, name = os.path.split(gguf_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.save_pretrained(out_dir)
