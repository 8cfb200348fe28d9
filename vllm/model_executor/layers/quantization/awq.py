"""`quant_method: awq` checkpoints (AutoAWQ, `version: gemm`): 4-bit weights with
zero points, packed along the output in AWQ's order (int_weights.py)."""
from __future__ import annotations

from typing import Any, Optional

from torch import nn

from vllm.model_executor.layers.quantization.base_config import (LinearMethodBase,
                                                                 QuantizationConfig,
                                                                 all_or_none, check_field,
                                                                 checkpoint_names)
from vllm.model_executor.layers.quantization.gptq import check_group_size
from vllm.model_executor.layers.quantization.int_weights import AWQLinearMethod


class AWQConfig(QuantizationConfig):
    name = "awq"

    def __init__(self, group_size: int, not_converted: list[str]) -> None:
        self.group_size = group_size
        self.not_converted = not_converted

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "AWQConfig":
        # AutoAWQ writes w_bit / q_group_size in quant_config.json; HF configs bits / group_size.
        config = dict(config)
        for old, new in (("w_bit", "bits"), ("q_group_size", "group_size")):
            if old in config and new not in config:
                config[new] = config[old]
        check_field(config, cls.name, "bits", (4,))
        group_size = check_group_size(config, cls.name)
        check_field(config, cls.name, "zero_point", (True,), True)
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"quantization_config.version={config.get('version')!r} is not "
                             "supported for quant_method='awq'; supported: 'gemm'.")
        return cls(group_size, list(config.get("modules_to_not_convert") or []))

    def get_quant_method(self, layer: nn.Module, prefix: str) -> Optional[LinearMethodBase]:
        skip = [any(m in name for m in self.not_converted) for name in checkpoint_names(prefix)]
        if all_or_none(prefix, self.name, skip):
            return None
        return AWQLinearMethod(4, self.group_size, prefix)

    def weight_summary(self) -> str:
        return f"awq int4 group {self.group_size}"
