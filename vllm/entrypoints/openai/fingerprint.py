"""The `system_fingerprint` of completions and chat responses, as vLLM builds it.

OpenAI's fingerprint identifies the backend configuration a response came from, so a
client can tell when outputs may change. vLLM fills it (it used to send null), in one of
four modes chosen by `--fingerprint-mode`:

- `full` (default): `vllm-<version>[-tp<N>][-pp<N>][-dp<N>][-ep]-<hash8>`;
- `hash`: `vllm-<version>-<hash8>` (parallelism left out);
- `custom`: the literal `--fingerprint-value`;
- `none`: null.

`hash8` is the first 8 hex digits of a hash over the settings that change what the
engine computes (model and revision, dtype, quantization, context length, KV cache
dtype and block size, speculative decoding, LoRA, device). It is computed once per
server, so a request pays one attribute read.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Optional

from vllm.version import __version__

FINGERPRINT_MODES = ("full", "hash", "custom", "none")


def build_system_fingerprint(vllm_config: Any, mode: str = "full",
                             custom_value: Optional[str] = None) -> Optional[str]:
    """The fingerprint for `vllm_config` in `mode` (see the module docstring)."""
    if mode not in FINGERPRINT_MODES:
        raise ValueError(f"--fingerprint-mode {mode!r}: choose one of "
                         f"{', '.join(FINGERPRINT_MODES)}.")
    if mode == "none":
        return None
    if mode == "custom":
        return custom_value
    parts = [f"vllm-{__version__}"]
    if mode == "full":
        parts += _parallelism(getattr(vllm_config, "parallel_config", None))
    parts.append(config_hash(vllm_config)[:8])
    return "-".join(parts)


def config_hash(vllm_config: Any) -> str:
    """sha256 (hex) of the settings that change the engine's outputs; "nohash" without a
    config (an engine that does not expose one)."""
    if vllm_config is None:
        return "nohash"
    model = vllm_config.model_config
    cache = getattr(vllm_config, "cache_config", None)
    factors = {
        "model": model.model, "revision": getattr(model, "revision", None),
        "tokenizer": getattr(model, "tokenizer", None),
        "dtype": str(getattr(model, "torch_dtype", getattr(model, "dtype", None))),
        "quantization": getattr(model, "quantization", None),
        "max_model_len": model.max_model_len,
        "hf_overrides": getattr(model, "hf_overrides", None),
        "kv_cache_dtype": getattr(cache, "cache_dtype", None),
        "block_size": getattr(cache, "block_size", None),
        "speculative": repr(getattr(vllm_config, "speculative_config", None)),
        "lora": getattr(vllm_config, "lora_config", None) is not None,
        "device": str(getattr(getattr(vllm_config, "device_config", None), "device", None)),
    }
    text = json.dumps(factors, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _parallelism(parallel: Any) -> list[str]:
    """The non-trivial parallel degrees, as vLLM names them in the fingerprint."""
    if parallel is None:
        return []
    parts = [f"{name}{size}" for name, size in (
        ("tp", getattr(parallel, "tensor_parallel_size", 1)),
        ("pp", getattr(parallel, "pipeline_parallel_size", 1)),
        ("dp", getattr(parallel, "data_parallel_size", 1))) if size > 1]
    if getattr(parallel, "enable_expert_parallel", False):
        parts.append("ep")
    return parts
