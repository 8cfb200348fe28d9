"""The Transformers modeling backend (`--model-impl transformers`): models that have
no native class here run through their `transformers` modeling code, with our linear
layers, paged attention and LM head (see causal.py)."""
from vllm.model_executor.models.transformers.causal import TransformersForCausalLM
from vllm.model_executor.models.transformers.support import (TransformersBackendUnsupported,
                                                             resolve_transformers_class)

__all__ = ["TransformersForCausalLM", "TransformersBackendUnsupported",
           "resolve_transformers_class"]
