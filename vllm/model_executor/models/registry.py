"""HF `architectures` name -> model class.

Built-in classes are imported lazily (by module path) so importing the registry
stays cheap. `ModelRegistry.register_model` lets plugins add architectures, as in
vLLM (a class or a "module:Class" string).
"""
from __future__ import annotations

import importlib
import logging
from typing import Any, Iterable, Union

from torch import nn

logger = logging.getLogger(__name__)

_BUILTIN_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM"),
    "Phi3ForCausalLM": ("phi3", "Phi3ForCausalLM"),
    "Gemma2ForCausalLM": ("gemma2", "Gemma2ForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3", "Gemma3ForCausalLM"),
    "GraniteForCausalLM": ("granite", "GraniteForCausalLM"),
    "Qwen2MoeForCausalLM": ("qwen2_moe", "Qwen2MoeForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "BloomForCausalLM": ("bloom", "BloomForCausalLM"),
    "GemmaForCausalLM": ("gemma", "GemmaForCausalLM"),
    "FalconForCausalLM": ("falcon", "FalconForCausalLM"),
    "GPTNeoXForCausalLM": ("gpt_neox", "GPTNeoXForCausalLM"),
    "InternLM2ForCausalLM": ("internlm2", "InternLM2ForCausalLM"),
    "GraniteMoeForCausalLM": ("granitemoe", "GraniteMoeForCausalLM"),
    "DeepseekV2ForCausalLM": ("deepseek_v2", "DeepseekV2ForCausalLM"),
    "DeepseekV3ForCausalLM": ("deepseek_v2", "DeepseekV3ForCausalLM"),
    "Glm4MoeForCausalLM": ("glm4_moe", "Glm4MoeForCausalLM"),
    # state-space (vllm/worker/state_cache.py: state slots instead of KV blocks)
    "Mamba2ForCausalLM": ("mamba2", "Mamba2ForCausalLM"),
    "GraniteMoeHybridForCausalLM": ("granitemoehybrid", "GraniteMoeHybridForCausalLM"),
    "NemotronHForCausalLM": ("nemotron_h", "NemotronHForCausalLM"),
    "JambaForCausalLM": ("jamba", "JambaForCausalLM"),
    "FalconH1ForCausalLM": ("falcon_h1", "FalconH1ForCausalLM"),
    "Qwen3NextForCausalLM": ("qwen3_next", "Qwen3NextForCausalLM"),
    "Qwen3_5ForCausalLM": ("qwen3_next", "Qwen3NextForCausalLM"),
    "Qwen3_5MoeForCausalLM": ("qwen3_next", "Qwen3NextForCausalLM"),
    "GptOssForCausalLM": ("gpt_oss", "GptOssForCausalLM"),
    "Llama4ForCausalLM": ("llama4", "Llama4ForCausalLM"),
    "Llama4ForConditionalGeneration": ("llama4", "Llama4ForConditionalGeneration"),
    # multimodal (image + text; vllm/multimodal)
    "LlavaForConditionalGeneration": ("llava", "LlavaForConditionalGeneration"),
    "Qwen2_5_VLForConditionalGeneration": ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
    "Qwen2VLForConditionalGeneration": ("qwen2_vl", "Qwen2VLForConditionalGeneration"),
    "Qwen3VLForConditionalGeneration": ("qwen3_vl", "Qwen3VLForConditionalGeneration"),
    "Qwen3VLMoeForConditionalGeneration": ("qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration"),
    "Mistral3ForConditionalGeneration": ("mistral3", "Mistral3ForConditionalGeneration"),
    "Gemma3ForConditionalGeneration": ("gemma3_mm", "Gemma3ForConditionalGeneration"),
    # pooling models (encoder-only; vllm/transformers_utils/runner.py picks the runner)
    "BertModel": ("bert", "BertModel"),
    "BertForSequenceClassification": ("bert", "BertForSequenceClassification"),
    "XLMRobertaModel": ("roberta", "XLMRobertaModel"),
    "RobertaModel": ("roberta", "XLMRobertaModel"),
    "XLMRobertaForSequenceClassification": ("roberta", "XLMRobertaForSequenceClassification"),
    "RobertaForSequenceClassification": ("roberta", "XLMRobertaForSequenceClassification"),
}


BIDIRECTIONAL_MM_ARCHS = frozenset({"Gemma3ForConditionalGeneration"})
"""Models whose image tokens attend to each other both ways: an image must never be
split between two steps (SchedulerConfig.disable_chunked_mm_input is forced on)."""


def attends_images_both_ways(architectures: Iterable[str]) -> bool:
    return any(a in BIDIRECTIONAL_MM_ARCHS for a in architectures or ())


class _ModelRegistry:

    def __init__(self) -> None:
        self._models: dict[str, Union[str, type[nn.Module]]] = {
            arch: f"vllm.model_executor.models.{module}:{cls}"
            for arch, (module, cls) in _BUILTIN_MODELS.items()}

    def get_supported_archs(self) -> list[str]:
        return sorted(self._models)

    def register_model(self, model_arch: str,
                       model_cls: Union[str, type[nn.Module]]) -> None:
        """Add or override an architecture: a class, or "package.module:ClassName"."""
        if isinstance(model_cls, str) and ":" not in model_cls:
            raise ValueError(f"model_cls string must look like 'package.module:ClassName', "
                             f"got {model_cls!r}.")
        self._models[model_arch] = model_cls

    def _load(self, arch: str) -> type[nn.Module]:
        entry = self._models[arch]
        if isinstance(entry, str):
            module, name = entry.split(":")
            entry = getattr(importlib.import_module(module), name)
        return entry

    def resolve_model_cls(self, architectures: Union[str, Iterable[str]],
                          model_config: Any = None) -> tuple[type[nn.Module], str]:
        """(class, architecture) for `architectures` under `model_config.model_impl`:
        'vllm' the first natively supported name; 'transformers' the Transformers
        modeling backend; 'auto' (also without a model config) native when registered,
        else the backend (logged), which refuses a model it cannot run naming why."""
        archs = [architectures] if isinstance(architectures, str) else list(architectures or [])
        impl = getattr(model_config, "model_impl", "auto")
        if impl != "transformers":
            for arch in archs:
                if arch in self._models:
                    return self._load(arch), arch
        hf_config = getattr(model_config, "hf_config", None)
        if impl == "vllm" or hf_config is None:
            hint = (" Try --model-impl auto or transformers (the Transformers modeling "
                    "backend)." if impl == "vllm" else "")
            raise ValueError(f"Model architectures {archs} are not supported for now. "
                             f"Supported architectures: {', '.join(self.get_supported_archs())}."
                             f"{hint}")
        from vllm.model_executor.models import transformers as backend
        if backend.is_multimodal_config(hf_config):
            model_cls = backend.TransformersForMultimodalLM
            hf_cls = backend.resolve_transformers_mm_class(hf_config)
        else:
            model_cls = backend.TransformersForCausalLM
            hf_cls = backend.resolve_transformers_class(hf_config)
        if impl == "auto":
            logger.info("%s has no native implementation; using the Transformers modeling "
                        "backend (--model-impl transformers) with %s.", archs, hf_cls.__name__)
        return model_cls, hf_cls.__name__

ModelRegistry = _ModelRegistry()
