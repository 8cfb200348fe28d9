"""Test-side writers of GPTQ and AWQ checkpoints, from the published bit layouts
(written here independently of the engine's unpacking code).

GPTQ (AutoGPTQ / GPTQModel, checkpoint_format "gptq"): qweight int32 [K/(32/b), N],
input k of word r at bits b*(k - r*32/b); qzeros int32 [G, N/(32/b)] packed the same
way along the output, holding zero - 1; scales float16 [G, N]; g_idx int32 [K].
AWQ (AutoAWQ GEMM): qweight int32 [K, N/8] and qzeros [G, N/8], output column
(0, 2, 4, 6, 1, 3, 5, 7)[i] of each run of 8 in nibble i; scales float16 [G, N].
"""
from __future__ import annotations

import json
import os
import shutil

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def pack_words(vals: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Pack unsigned `vals` 32/bits per int32 along `dim`, first value lowest."""
    per = 32 // bits
    v = vals.movedim(dim, -1).to(torch.int64)
    v = v.reshape(*v.shape[:-1], v.shape[-1] // per, per)
    word = torch.zeros(v.shape[:-1], dtype=torch.int64)
    for i in range(per):
        word |= v[..., i] << (bits * i)
    word = torch.where(word >= 2**31, word - 2**32, word)  # two's complement int32
    return word.to(torch.int32).movedim(-1, dim)


def quantize_groups(w: torch.Tensor, bits: int, group: int, sym: bool, g_idx: torch.Tensor):
    """Round-to-nearest quantization of w [N, K] by groups g_idx: (q [N, K], scales
    [G, N] fp16, zeros [G, N] int, dequantized W [N, K] float32 using the fp16 scales)."""
    n, k = w.shape
    groups = int(g_idx.max()) + 1
    qmax = 2**bits - 1
    scales = torch.empty(groups, n)
    zeros = torch.empty(groups, n, dtype=torch.int64)
    for g in range(groups):
        cols = w[:, g_idx == g]
        if sym:
            s = cols.abs().amax(1) / ((qmax + 1) / 2 - 0.5) * 1.0
            z = torch.full((n,), (qmax + 1) // 2, dtype=torch.int64)
        else:
            lo, hi = cols.amin(1).clamp(max=0), cols.amax(1).clamp(min=0)
            s = (hi - lo) / qmax
            z = torch.round(-lo / s).to(torch.int64).clamp(0, qmax)
        scales[g], zeros[g] = s.clamp(min=1e-6), z
    scales = scales.half()
    sf = scales.float()[g_idx].t()      # [N, K]
    zf = zeros[g_idx].t()
    q = torch.round(w / sf + zf).clamp(0, qmax).to(torch.int64)
    return q, scales, zeros, (q - zf).float() * sf


def _rewrite(float_dir: str, out_dir: str, qcfg: dict, per_linear) -> str:
    """Copy a float HF model, replacing every decoder linear by `per_linear(name, w)`'s
    tensors; returns the dequantized float state dict's directory too (out_dir + '-deq')."""
    from safetensors.torch import load_file, save_file
    state = load_file(os.path.join(float_dir, "model.safetensors"))
    quant, deq = {}, {}
    for name, t in state.items():
        module = name.rsplit(".", 2)
        if name.endswith(".weight") and module[-2] in LINEARS:
            tensors, w_deq = per_linear(name[:-len(".weight")], t.float())
            quant.update(tensors)
            deq[name] = w_deq
        else:
            quant[name], deq[name] = t, t
    for path, tensors, extra in ((out_dir, quant, qcfg), (out_dir + "-deq", deq, None)):
        shutil.copytree(float_dir, path)
        save_file({k: v.contiguous() for k, v in tensors.items()},
                  os.path.join(path, "model.safetensors"))
        if extra is not None:
            with open(os.path.join(path, "config.json")) as f:
                cfg = json.load(f)
            cfg["quantization_config"] = extra
            with open(os.path.join(path, "config.json"), "w") as f:
                json.dump(cfg, f)
    return out_dir


def write_gptq(float_dir: str, out_dir: str, bits: int, group_size: int, desc_act: bool,
               sym: bool, seed: int = 0) -> str:
    gen = torch.Generator().manual_seed(seed)
    orders: dict[tuple[str, int], torch.Tensor] = {}

    def per_linear(prefix, w):
        n, k = w.shape
        group = k if group_size == -1 else group_size
        g_idx = torch.arange(k) // group
        if desc_act:  # a random activation order, as GPTQ's act-order produces: one per
            # input, so modules reading the same input (q/k/v, gate/up) share it
            key = (prefix.rsplit(".", 1)[0] + ("" if prefix.endswith(("o_proj", "down_proj"))
                                               else ".in"), k)
            if key not in orders:
                orders[key] = torch.randperm(k, generator=gen)
            g_idx = g_idx[orders[key]]
        q, scales, zeros, w_deq = quantize_groups(w, bits, group, sym, g_idx)
        return {f"{prefix}.qweight": pack_words(q.t(), bits, 0),
                f"{prefix}.qzeros": pack_words(zeros - 1, bits, 1),
                f"{prefix}.scales": scales, f"{prefix}.g_idx": g_idx.to(torch.int32)}, w_deq

    qcfg = {"quant_method": "gptq", "bits": bits, "group_size": group_size,
            "desc_act": desc_act, "sym": sym, "checkpoint_format": "gptq"}
    return _rewrite(float_dir, out_dir, qcfg, per_linear)


def awq_pack(vals: torch.Tensor) -> torch.Tensor:
    """[R, C] 4-bit values -> [R, C/8] int32 in AWQ's GEMM order."""
    r, c = vals.shape
    v = vals.reshape(r, c // 8, 8)[:, :, list(AWQ_ORDER)].reshape(r, c)
    return pack_words(v, 4, 1)


def write_awq(float_dir: str, out_dir: str, group_size: int) -> str:
    def per_linear(prefix, w):
        n, k = w.shape
        group = k if group_size == -1 else group_size
        q, scales, zeros, w_deq = quantize_groups(w, 4, group, False, torch.arange(k) // group)
        return {f"{prefix}.qweight": awq_pack(q.t()), f"{prefix}.qzeros": awq_pack(zeros),
                f"{prefix}.scales": scales}, w_deq

    qcfg = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
            "version": "gemm"}
    return _rewrite(float_dir, out_dir, qcfg, per_linear)
