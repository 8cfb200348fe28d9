"""`quant_method: gptq` checkpoints (AutoGPTQ / GPTQModel / optimum): 4 or 8 bits,
any `group_size` of GROUP_SIZES, `desc_act` (activation order through `g_idx`),
`sym` either way, checkpoint_format gptq (zeros stored minus one) or gptq_v2. An input
size that is not a multiple of the group size has a shorter last group, as GPTQ
writes it (ceil(K/group_size) scale rows, g_idx = k // group_size)."""
from __future__ import annotations

from typing import Any, Optional

from torch import nn

from vllm.model_executor.layers.quantization.base_config import (LinearMethodBase,
                                                                 QuantizationConfig,
                                                                 check_field)
from vllm.model_executor.layers.quantization.int_weights import GPTQLinearMethod

GROUP_SIZES = (-1, 16, 32, 64, 128, 256, 512, 1024)


def check_group_size(config: dict[str, Any], method: str) -> int:
    return check_field(config, method, "group_size", GROUP_SIZES)


class GPTQConfig(QuantizationConfig):
    name = "gptq"

    def __init__(self, bits: int, group_size: int, desc_act: bool, sym: bool,
                 v2: bool) -> None:
        self.bits, self.group_size, self.desc_act, self.sym, self.v2 = (
            bits, group_size, desc_act, sym, v2)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "GPTQConfig":
        bits = check_field(config, cls.name, "bits", (4, 8))
        group_size = check_group_size(config, cls.name)
        desc_act = check_field(config, cls.name, "desc_act", (True, False), False)
        sym = check_field(config, cls.name, "sym", (True, False), True)
        fmt = check_field(config, cls.name, "checkpoint_format", ("gptq", "gptq_v2"), "gptq")
        check_field(config, cls.name, "lm_head", (False,), False)
        if config.get("dynamic"):
            raise ValueError("quantization_config.dynamic (per-module gptq overrides) is not "
                             "supported.")
        return cls(bits, group_size, desc_act, sym, fmt == "gptq_v2")

    def get_quant_method(self, layer: nn.Module, prefix: str) -> Optional[LinearMethodBase]:
        return GPTQLinearMethod(self.bits, self.group_size, self.v2, prefix)

    def weight_summary(self) -> str:
        return (f"gptq int{self.bits} group {self.group_size}"
                f"{' desc_act' if self.desc_act else ''} {'sym' if self.sym else 'asym'}")
