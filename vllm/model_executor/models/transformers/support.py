"""Which `transformers` class the Transformers backend would run, or why it cannot.

The backend runs a model through its own `transformers` modeling code, so that code
must exist in the installed library (remote code is never run), be a decoder-only causal
LM, and route attention through transformers' attention interface
(`_supports_attention_backend`): that interface is the one seam through which our paged
attention replaces the library's.
"""
from __future__ import annotations

from typing import Any


class TransformersBackendUnsupported(ValueError):
    """The model cannot run on the Transformers backend; the message says why."""


def refuse(config: Any, reason: str) -> TransformersBackendUnsupported:
    archs = getattr(config, "architectures", None) or [getattr(config, "model_type", "?")]
    return TransformersBackendUnsupported(
        f"Model architectures {list(archs)} cannot run on the Transformers modeling backend "
        f"(--model-impl transformers): {reason}.")


def _causal_lm_class(config: Any) -> type | None:
    """The library's causal-LM class for this config (by architecture name first, so a
    config shared by several heads picks the checkpoint's own)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if isinstance(cls, type) and arch.endswith("ForCausalLM"):
            return cls
    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        return None


def resolve_transformers_class(config: Any) -> type:
    """The `transformers` causal-LM class the backend builds for `config`.

    Raises TransformersBackendUnsupported naming the reason: an encoder-decoder, code
    only in the model's repository, no causal-LM class, or no attention-interface
    support."""
    if getattr(config, "is_encoder_decoder", False):
        raise refuse(config, "encoder-decoder models are not supported, only decoder-only "
                      "causal LMs")
    cls = _causal_lm_class(config)
    if cls is None:
        if getattr(config, "auto_map", None):
            raise refuse(config, "its modeling code exists only in the model's repository "
                          "(remote code), which is never run; transformers "
                          f"{_version()} has no class for model_type "
                          f"{getattr(config, 'model_type', None)!r}")
        raise refuse(config, f"transformers {_version()} has no causal-LM class for "
                      f"model_type {getattr(config, 'model_type', None)!r}")
    if not getattr(cls, "_supports_attention_backend", False):
        raise refuse(config, f"{cls.__name__} does not route attention through "
                      "transformers' attention interface (_supports_attention_backend is "
                      "False)")
    return cls


def _version() -> str:
    import transformers
    return transformers.__version__
