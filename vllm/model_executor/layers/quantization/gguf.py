"""GGUF: the weights are dequantized to float when the .gguf file is converted to an
HF-style directory (vllm/transformers_utils/gguf_utils.py), so every layer then takes
the unquantized path. The config exists so `--quantization gguf` means what it says."""
from __future__ import annotations

from typing import Any, Optional

from torch import nn

from vllm.model_executor.layers.quantization.base_config import (LinearMethodBase,
                                                                 QuantizationConfig)


class GGUFConfig(QuantizationConfig):
    name = "gguf"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "GGUFConfig":
        return cls()

    def get_quant_method(self, layer: nn.Module, prefix: str) -> Optional[LinearMethodBase]:
        return None

    def weight_summary(self) -> str:
        return "gguf (dequantized to float on conversion)"
