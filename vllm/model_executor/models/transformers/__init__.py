"""The Transformers modeling backend (`--model-impl transformers`): models that have
no native class here run through their `transformers` modeling code, with our linear
layers, paged attention and LM head (see causal.py); vision-language models keep the
library's vision tower (multimodal.py)."""
from vllm.model_executor.models.transformers.causal import TransformersForCausalLM
from vllm.model_executor.models.transformers.multimodal import TransformersForMultimodalLM
from vllm.model_executor.models.transformers.support import (TransformersBackendUnsupported,
                                                             is_multimodal_config,
                                                             resolve_transformers_class,
                                                             resolve_transformers_mm_class)

__all__ = ["TransformersForCausalLM", "TransformersForMultimodalLM",
           "TransformersBackendUnsupported", "is_multimodal_config",
           "resolve_transformers_class", "resolve_transformers_mm_class"]
