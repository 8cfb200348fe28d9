"""GPTQ: error-compensating int weight quantization (Frantar et al., 2022), written for
this project from the paper's algorithm, and the GPTQ checkpoint writer.

Round-to-nearest (RTN) rounds every weight on its own. GPTQ quantizes a layer's input
columns one at a time and spreads each column's rounding error over the columns not
yet quantized, weighted by the inverse Hessian of the layer's squared output error on
calibration inputs X: H = 2 X^T X / n. With the upper Cholesky factor U of H^-1
(dampened: H + damp * mean(diag H) * I), quantizing column j with error e = (w_j -
q_j) / U[j, j] updates the remaining columns by -e U[j, j+1:] (the optimal
compensation of the Optimal Brain Surgeon step). Columns go in blocks so the update of
the columns after a block is one matrix product. A group's scale and zero point are
chosen when its first column comes up, from the group's weights as the earlier errors
left them. `act_order` quantizes the columns in decreasing diag(H) order (groups then
follow that order, recorded in g_idx).

The checkpoint is AutoGPTQ's layout (quant_method "gptq", checkpoint_format "gptq"):
qweight int32 [K/8, N] packed along the input, qzeros int32 [G, N/8] packed along the
output holding zero - 1, scales float16 [G, N], g_idx int32 [K]; G = ceil(K / group),
so an input size that the group size does not divide gets a shorter last group.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from typing import Optional

import torch

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class GPTQArgs:
    bits: int = 4
    group_size: int = 128
    """-1: one group per output row (per channel)."""
    sym: bool = False
    act_order: bool = False
    damp: float = 0.01
    """Added to H's diagonal as a fraction of its mean (keeps H invertible and the
    updates small where the calibration inputs say little)."""
    block: int = 128
    mse_clip: bool = False
    """Shrink each group's min/max range to the candidate (1.0, 0.98, ... 0.8) that
    minimizes the group's squared rounding error (GPTQ's `mse` grid search)."""
    static_groups: bool = False
    """Every group's grid from the original weights, before any column is quantized,
    groups staying runs of consecutive inputs (g_idx = k // group) even with
    `act_order`: the checkpoint needs no input permutation at run time (the engine's
    fused decode layer takes it), at the cost of grids that do not see the updates."""
    true_sequential: bool = False
    """Quantize a layer's linears in execution order (qkv, o, gate/up, down), each
    from inputs through the parts already quantized (one more calibration pass each)."""


@dataclass
class QuantizedLinear:
    q: torch.Tensor        # [N, K] int64, 0 .. 2^bits - 1, natural input order
    scales: torch.Tensor   # [G, N] float16
    zeros: torch.Tensor    # [G, N] int64
    g_idx: torch.Tensor    # [K] int64

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [N, K] the checkpoint stands for."""
        s = self.scales.float()[self.g_idx].t()
        z = self.zeros[self.g_idx].t()
        return (self.q - z).float() * s


def group_params(w: torch.Tensor, bits: int, sym: bool, mse_clip: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale float16-exact [N], zero [N]) for the columns w [N, g], GPTQ's min/max grid
    (the range always holds 0; symmetric: zero in the middle of the grid)."""
    if not mse_clip:
        return _grid(w.amin(1), w.amax(1), bits, sym)
    best = best_err = None
    for shrink in torch.linspace(1.0, 0.8, 11).tolist():
        scale, zero = _grid(w.amin(1) * shrink, w.amax(1) * shrink, bits, sym)
        _, deq = _qdq(w, scale[:, None], zero[:, None], 2 ** bits - 1)
        err = ((w - deq) ** 2).sum(1)
        if best is None:
            best, best_err = (scale, zero), err
            continue
        better = err < best_err
        best = (torch.where(better, scale, best[0]), torch.where(better, zero, best[1]))
        best_err = torch.where(better, err, best_err)
    return best


def _grid(lo: torch.Tensor, hi: torch.Tensor, bits: int, sym: bool
          ) -> tuple[torch.Tensor, torch.Tensor]:
    qmax = 2 ** bits - 1
    lo = lo.clamp(max=0)
    hi = hi.clamp(min=0)
    if sym:
        hi = torch.maximum(-lo, hi)
        lo = -hi
    scale = ((hi - lo) / qmax).clamp(min=1e-6).half().float()
    if sym:
        zero = torch.full_like(scale, (qmax + 1) // 2)
    else:
        zero = torch.round(-lo / scale).clamp(0, qmax)
    return scale, zero


def _qdq(col: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, qmax: int):
    q = torch.clamp(torch.round(col / scale) + zero, 0, qmax)
    return q, (q - zero) * scale


def rtn_quantize(w: torch.Tensor, args: GPTQArgs) -> QuantizedLinear:
    """Round-to-nearest on the same grid (GPTQ without error propagation)."""
    return _quantize(w.float(), None, args)


def gptq_quantize(w: torch.Tensor, hessian: torch.Tensor, args: GPTQArgs) -> QuantizedLinear:
    """GPTQ of w [N, K] (float) given H [K, K] = 2 X^T X / n of its inputs."""
    return _quantize(w.float(), hessian.double(), args)


def _quantize(w: torch.Tensor, h: Optional[torch.Tensor], args: GPTQArgs) -> QuantizedLinear:
    n, k = w.shape
    group = k if args.group_size == -1 else args.group_size
    qmax = 2 ** args.bits - 1
    w = w.clone()
    perm = torch.arange(k)
    groups = -(-k // group)
    scales, zeros = torch.empty(groups, n), torch.empty(groups, n)
    if h is not None:
        h = h.clone()
        dead = torch.diag(h) == 0          # inputs never active: weight irrelevant
        h[dead, dead] = 1
        w[:, dead] = 0
    static = args.static_groups and h is not None
    if static:
        for g in range(groups):
            scales[g], zeros[g] = group_params(w[:, g * group:(g + 1) * group], args.bits,
                                               args.sym, args.mse_clip)
    if h is not None:
        if args.act_order:
            perm = torch.argsort(torch.diag(h), descending=True, stable=True)
            w, h = w[:, perm], h[perm][:, perm]
        h += args.damp * torch.diag(h).mean() * torch.eye(k, dtype=h.dtype)
        u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)),
                                  upper=True).float()
    q = torch.empty(n, k)
    block = max(group, args.block // group * group) if group < k else args.block
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        wb = w[:, b0:b1].clone()
        err = torch.zeros_like(wb)
        for i in range(b1 - b0):
            col = b0 + i
            if col % group == 0 and not static:  # the grid from the updated weights
                rest = torch.cat([wb[:, i:], w[:, b1:]], 1)[:, :group]
                scales[col // group], zeros[col // group] = group_params(
                    rest, args.bits, args.sym, args.mse_clip)
            g = int(perm[col]) // group if static else col // group
            q[:, col], deq = _qdq(wb[:, i], scales[g], zeros[g], qmax)
            if h is None:
                continue
            e = (wb[:, i] - deq) / u[col, col]
            wb[:, i:] -= e[:, None] * u[col, col:b1][None, :]
            err[:, i] = e
        if h is not None:
            w[:, b1:] -= err @ u[b0:b1, b1:]
    g_idx = torch.empty(k, dtype=torch.int64)
    g_idx[perm] = torch.arange(k) // group   # group of each input, natural order
    if static:
        g_idx = torch.arange(k) // group
    q_nat = torch.empty_like(q)
    q_nat[:, perm] = q
    return QuantizedLinear(q_nat.long(), scales.half(), zeros.long(), g_idx)


class HessianRecorder:
    """Forward pre-hook accumulating X^T X of a linear's inputs (float64)."""

    def __init__(self, k: int) -> None:
        self.xtx = torch.zeros(k, k, dtype=torch.float64)
        self.rows = 0

    def __call__(self, module, args) -> None:
        x = args[0].reshape(-1, args[0].shape[-1]).double()
        self.xtx += x.t() @ x
        self.rows += x.shape[0]

    def hessian(self) -> torch.Tensor:
        return 2 * self.xtx / max(self.rows, 1)


class _Stop(Exception):
    """Ends a calibration forward once the layer being quantized has seen its input."""


STAGES = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"),
          ("down_proj",))
"""A decoder layer's linears in execution order (true-sequential quantization)."""


@torch.no_grad()
def quantize_model(model, batches: list[torch.Tensor], args: GPTQArgs,
                   method: str = "gptq") -> dict[str, QuantizedLinear]:
    """Quantize every decoder linear of a transformers Llama-family `model` in place
    (its weights become the dequantized ones), layer after layer: each layer's
    Hessians come from inputs that went through the already-quantized layers before
    it. Returns {module name: QuantizedLinear}."""
    out: dict[str, QuantizedLinear] = {}
    layers = model.model.layers
    for index, layer in enumerate(layers):
        print(f"{method}: layer {index + 1}/{len(layers)}", flush=True)
        linears = {n: m for n, m in layer.named_modules() if n.rsplit(".", 1)[-1]
                   in LINEAR_NAMES}
        stages = ([[n for n in linears if n.rsplit(".", 1)[-1] in st] for st in STAGES]
                  if args.true_sequential else [list(linears)])
        prefix = _prefix_of(model, layer)
        for stage in stages:
            hessians = (_layer_hessians(model, layer, {n: linears[n] for n in stage},
                                        batches) if method == "gptq" else {})
            for name in stage:
                module = linears[name]
                ql = (gptq_quantize(module.weight, hessians[name], args) if name in hessians
                      else rtn_quantize(module.weight, args))
                module.weight.copy_(ql.dequantize().to(module.weight.dtype))
                out[f"{prefix}.{name}"] = ql
    return out


def _layer_hessians(model, layer, linears: dict, batches: list[torch.Tensor]) -> dict:
    """H of each of `linears` (modules of `layer`) over the calibration batches; each
    forward stops at the end of `layer`."""
    recorders = {n: HessianRecorder(m.in_features) for n, m in linears.items()}
    hooks = [m.register_forward_pre_hook(recorders[n]) for n, m in linears.items()]

    def stop(module, inputs, output):
        raise _Stop
    hooks.append(layer.register_forward_hook(stop))
    try:
        for ids in batches:
            try:
                model(ids[None], use_cache=False)
            except _Stop:
                pass
    finally:
        for hk in hooks:
            hk.remove()
    return {n: r.hessian() for n, r in recorders.items()}


def _prefix_of(model, layer) -> str:
    for name, m in model.named_modules():
        if m is layer:
            return name
    raise ValueError("layer not in model")


def pack_int32(vals: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Unsigned `vals` packed 32/bits per int32 along `dim`, value i of a word in bits
    [i*bits, (i+1)*bits)."""
    per = 32 // bits
    v = vals.movedim(dim, -1).to(torch.int64)
    v = v.reshape(*v.shape[:-1], -1, per)
    shifts = torch.arange(0, 32, bits, dtype=torch.int64)
    words = (v << shifts).sum(-1)
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    return words.movedim(-1, dim).contiguous()


def gptq_tensors(prefix: str, ql: QuantizedLinear, bits: int) -> dict[str, torch.Tensor]:
    return {f"{prefix}.qweight": pack_int32(ql.q.t(), bits, 0),
            f"{prefix}.qzeros": pack_int32(ql.zeros - 1, bits, 1),
            f"{prefix}.scales": ql.scales.contiguous(),
            f"{prefix}.g_idx": ql.g_idx.to(torch.int32)}


def save_gptq(float_dir: str, out_dir: str, quantized: dict[str, QuantizedLinear],
              args: GPTQArgs) -> str:
    """The float checkpoint with each quantized linear's weight replaced by GPTQ
    tensors; config.json gets the quantization_config."""
    from safetensors.torch import load_file, save_file
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(float_dir):
        if not name.endswith(".safetensors") and os.path.isfile(os.path.join(float_dir, name)):
            shutil.copy(os.path.join(float_dir, name), out_dir)
    tensors = {}
    for name in sorted(n for n in os.listdir(float_dir) if n.endswith(".safetensors")):
        tensors.update(load_file(os.path.join(float_dir, name)))
    for prefix, ql in quantized.items():
        del tensors[f"{prefix}.weight"]
        tensors.update(gptq_tensors(prefix, ql, args.bits))
    for name in os.listdir(out_dir):
        if name.endswith(".safetensors.index.json"):
            os.remove(os.path.join(out_dir, name))
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    cfg_path = os.path.join(out_dir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {
        "quant_method": "gptq", "bits": args.bits, "group_size": args.group_size,
        "desc_act": args.act_order, "sym": args.sym, "damp_percent": args.damp,
        "checkpoint_format": "gptq", "lm_head": False}
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
    return out_dir
