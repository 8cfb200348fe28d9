"""Config classes for model types transformers does not ship (their repositories carry
them as remote code, which this engine never runs): written here from the documented
fields and registered with `AutoConfig`, so such checkpoints load like any other."""
from __future__ import annotations

from vllm.transformers_utils.configs.internlm2 import InternLM2Config

_REGISTERED = False


def register_configs() -> None:
    """Make `AutoConfig` know the model types above (once per process)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AutoConfig, CONFIG_MAPPING
    for cls in (InternLM2Config,):
        if cls.model_type not in CONFIG_MAPPING:
            AutoConfig.register(cls.model_type, cls)
    _REGISTERED = True


__all__ = ["InternLM2Config", "register_configs"]
