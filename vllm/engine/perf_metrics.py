"""Model FLOPs and bytes estimates for `--enable-mfu-metrics`, and the devices' peaks.

vLLM's counters `vllm:estimated_flops_per_gpu_total`, `vllm:estimated_read_bytes_per_gpu_total`
and `vllm:estimated_write_bytes_per_gpu_total` grow by an analytic estimate of each
step's work, per device (divided by tensor x pipeline parallel size). The estimate is
shape arithmetic from the model's config, not a hardware counter:

- FLOPs per computed token: 2 x the active linear parameters (attention projections,
  MLP or the routed experts, LM head), plus attention 4 x layers x heads x head_dim x
  the tokens it attends to;
- bytes read: the weights once per step, and the KV cache each token attends to;
- bytes written: the KV of each computed token.

Model FLOPs utilization is `rate(vllm:estimated_flops_per_gpu_total[1m]) /
vllm:peak_flops_per_gpu`: the second is this server's own gauge, from PEAK_FLOPS below
(dense bf16 figures from the vendors' data sheets; none on CPU, whose peak depends on
cores, clocks and instruction sets: no gauge there).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

PEAK_FLOPS = {
    "Gaudi2": 432e12,   # Intel Gaudi 2 (HL-225), bf16 MME
    "Gaudi3": 1835e12,  # Intel Gaudi 3 (HL-325), bf16 MME
    "A100": 312e12,
    "H100": 989e12,
    "H200": 989e12,
    "B200": 2250e12,
    "L40S": 362e12,
}
"""Dense bf16 peak FLOP/s per device model name."""


def device_model(platform: Any) -> Optional[str]:
    """The PEAK_FLOPS key of this machine's accelerator, if known. On the HPU the
    generation comes from the device name (GAUDI2, GAUDI3); the fake HPU stands in for
    a Gaudi 2."""
    kind = getattr(platform, "device_type", None) or getattr(platform, "device_name", "")
    if kind == "hpu":
        return _gaudi_generation()
    if kind == "cuda":
        try:
            import torch
            name = torch.cuda.get_device_name(0)
        except Exception:  # noqa: BLE001 - no device visible here
            return None
        return next((k for k in PEAK_FLOPS if k in name), None)
    return None


def _gaudi_generation() -> str:
    from vllm import envs
    if envs.VLLM_USE_FAKE_HPU:
        return "Gaudi2"
    try:
        import habana_frameworks.torch.hpu as hthpu
        name = str(hthpu.get_device_name()).upper()
    except Exception:  # noqa: BLE001 - the runtime answers in the worker only
        return "Gaudi2"
    return "Gaudi3" if "GAUDI3" in name else "Gaudi2"


@dataclass
class ModelShape:
    """What the estimate needs from an HF config (per device)."""
    linear_params: float
    """Active parameters a token multiplies (per device)."""
    weight_bytes: float
    """All weights, read once per step (per device)."""
    attn_flops_per_context_token: float
    """FLOPs one token spends per token it attends to (per device)."""
    kv_bytes_per_token: float
    """KV cache bytes one token holds (per device)."""

    @classmethod
    def from_hf_config(cls, hf: Any, dtype_bytes: int = 2, kv_bytes: int = 2,
                       num_devices: int = 1) -> "ModelShape":
        text = getattr(hf, "text_config", None) or hf
        h = int(getattr(text, "hidden_size", 0) or 0)
        layers = int(getattr(text, "num_hidden_layers", 0) or 0)
        heads = int(getattr(text, "num_attention_heads", 1) or 1)
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(text, "head_dim", None) or (h // heads if heads else 0))
        vocab = int(getattr(text, "vocab_size", 0) or 0)
        inter = int(getattr(text, "intermediate_size", 0) or 0)
        attn = h * heads * head_dim * 2 + 2 * h * kv_heads * head_dim
        experts = int(getattr(text, "num_local_experts", None)
                      or getattr(text, "num_experts", None) or 0)
        active = int(getattr(text, "num_experts_per_tok", None) or 0)
        expert_inter = int(getattr(text, "moe_intermediate_size", None) or inter)
        if experts and active:
            mlp_active, mlp_all = 3 * h * expert_inter * active, 3 * h * expert_inter * experts
        else:
            mlp_active = mlp_all = 3 * h * inter
        active_params = layers * (attn + mlp_active) + h * vocab
        all_params = layers * (attn + mlp_all) + 2 * h * vocab
        n = max(1, num_devices)
        return cls(linear_params=active_params / n, weight_bytes=all_params * dtype_bytes / n,
                   attn_flops_per_context_token=4.0 * layers * heads * head_dim / n,
                   kv_bytes_per_token=2.0 * layers * kv_heads * head_dim * kv_bytes / n)


@dataclass
class PerfEstimate:
    flops: float = 0.0
    read_bytes: float = 0.0
    write_bytes: float = 0.0


class PerfModel:
    """Turns the tokens a step computed into FLOPs and bytes (per device)."""

    def __init__(self, shape: ModelShape) -> None:
        self.shape = shape

    def step(self) -> PerfEstimate:
        """A step's fixed cost: reading the weights once."""
        return PerfEstimate(read_bytes=self.shape.weight_bytes)

    def tokens(self, num_tokens: int, context_start: int) -> PerfEstimate:
        """`num_tokens` computed at positions context_start+1 .. context_start+num_tokens
        (each attends to the tokens up to and including itself)."""
        if num_tokens <= 0:
            return PerfEstimate()
        s = self.shape
        attended = num_tokens * context_start + num_tokens * (num_tokens + 1) / 2
        return PerfEstimate(
            flops=2.0 * s.linear_params * num_tokens
            + s.attn_flops_per_context_token * attended,
            read_bytes=s.kv_bytes_per_token * (context_start + num_tokens),
            write_bytes=s.kv_bytes_per_token * num_tokens)
