"""The CPU attention backend: torch_sdpa's paged attention (vllm/attention/backends/
torch_sdpa.py) plus the native kernels (cpu_ops.cpp, prefill_ops.cpp) where they run.

The torch backend calls four hooks that this class fills: K/V rows written to the
cache by one kernel call (float and fp8 caches), the decode rows of the metadata's
block table by the paged decode kernel, and the prefills the CPU runner marked
`flash` by the blocked prefill kernel. The CPU runner builds metadata with a decode
block table or flash prefills only for this backend (`native_attention`).
"""
from __future__ import annotations

import torch

from vllm.attention.backends.torch_sdpa import TorchSDPABackendImpl, TorchSDPAMetadata
from vllm.cpu import cpu_ops, prefill_ops


class CpuAttentionImpl(TorchSDPABackendImpl):
    """forward(layer, q, k, v, kv_cache, metadata): see vllm.attention.layer.Attention."""

    def _write_kv_native(self, key: torch.Tensor, value: torch.Tensor,
                         kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> bool:
        """`cpu_ops.write_kv` where it can store these rows (views of one fused
        projection, or two tensors of equal row stride, on CPU)."""
        if not (key.stride(-1) == 1 and value.stride(-1) == 1
                and key.stride(0) == value.stride(0) and key.dtype == kv_cache.dtype
                and kv_cache.is_contiguous() and cpu_ops.usable(kv_cache)):
            return False
        cpu_ops.write_kv(key, value, kv_cache, slot_mapping)
        return True

    def _write_fp8_kv_native(self, kq: torch.Tensor, vq: torch.Tensor, kv_cache: torch.Tensor,
                             slot_mapping: torch.Tensor, dtype: torch.dtype) -> bool:
        if not (kv_cache.device.type == "cpu" and kv_cache.is_contiguous()
                and cpu_ops.supports(dtype)):
            return False
        cpu_ops.write_kv(kq, vq, kv_cache, slot_mapping)
        return True

    def _decode_rows_native(self, query: torch.Tensor, kv_cache: torch.Tensor,
                            md: TorchSDPAMetadata, layer, out: torch.Tensor,
                            k_scale: float = 1.0, v_scale: float = 1.0) -> None:
        cpu_ops.decode_attention(query, kv_cache, md.decode_block_table, md.decode_seq_lens,
                                 layer.num_heads, md.block_size, layer.scale, out,
                                 k_scale, v_scale)

    def _prefills_native(self, query: torch.Tensor, kv_cache: torch.Tensor,
                         md: TorchSDPAMetadata, layer, out: torch.Tensor) -> None:
        f = md.flash
        prefill_ops.prefill_attention(query, kv_cache, f.block_table, f.query_start,
                                      f.query_len, f.context_len, layer.num_heads,
                                      md.block_size, layer.scale, out)
