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


BIDIRECTIONAL_IMAGE_MODELS = frozenset({"gemma3", "gemma3n", "paligemma", "shieldgemma2"})
"""model_types whose image tokens attend to each other both ways (the library masks
them so), which the backend's causal paged attention does not do."""


def is_multimodal_config(config: Any) -> bool:
    """A vision-language checkpoint: its config nests a vision config."""
    return getattr(config, "vision_config", None) is not None


def resolve_transformers_mm_class(config: Any) -> type:
    """The `transformers` image-text-to-text class the backend builds for `config`.

    Raises TransformersBackendUnsupported naming the reason: an encoder-decoder, no
    class in the installed library, no attention-interface support, multimodal rotary
    positions (M-RoPE), bidirectional attention among image tokens, or no
    `get_image_features`."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING
    if getattr(config, "is_encoder_decoder", False):
        raise refuse(config, "encoder-decoder models are not supported, only decoder-only "
                      "ones")
    model_type = getattr(config, "model_type", None)
    if model_type in BIDIRECTIONAL_IMAGE_MODELS:
        raise refuse(config, f"{model_type} attends among an image's tokens both ways, "
                      "which the backend's causal attention does not; use the native model "
                      "where one exists")
    text = config.get_text_config() if hasattr(config, "get_text_config") else None
    rope = dict(getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None)
                or {})
    if "mrope_section" in rope or getattr(text, "use_bidirectional_attention", False):
        raise refuse(config, "multimodal rotary positions (M-RoPE) are not supported by the "
                      "generic multimodal path" if "mrope_section" in rope else
                      "bidirectional attention is not supported")
    cls = None
    for arch in getattr(config, "architectures", None) or []:
        found = getattr(transformers, arch, None)
        if isinstance(found, type) and arch.endswith("ForConditionalGeneration"):
            cls = found
            break
    if cls is None:
        try:
            cls = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING[type(config)]
        except KeyError:
            reason = ("its modeling code exists only in the model's repository (remote "
                      "code), which is never run" if getattr(config, "auto_map", None)
                      else f"transformers {_version()} has no image-text-to-text class for "
                      f"model_type {model_type!r}")
            raise refuse(config, reason) from None
    if not getattr(cls, "_supports_attention_backend", False):
        raise refuse(config, f"{cls.__name__} does not route attention through "
                      "transformers' attention interface (_supports_attention_backend is "
                      "False)")
    import sys
    module = sys.modules.get(cls.__module__)
    if any(hasattr(getattr(module, name), "get_rope_index") for name in dir(module)
           if name.endswith("Model") and isinstance(getattr(module, name), type)):
        raise refuse(config, f"{cls.__name__} computes multimodal rotary positions "
                      "(M-RoPE), which the generic multimodal path does not")
    return cls
