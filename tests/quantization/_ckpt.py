"""Quantized test checkpoints made by `compressed-tensors` (a library we did not write,
driven by benchmarks/quantize_checkpoint.py), and the references they give.

`quantize_with_library(float_dir, scheme)` loads a float model with transformers,
lets compressed-tensors attach its quantization scheme, sets every scale with the
library's own `calculate_qparams` from the weights' (and, for static activation
schemes, calibration inputs') ranges, and returns that model: its forward is the
library's quantize-dequantize (QDQ) simulation, the reference the engine must match.
`save_compressed` then writes it in the library's compressed format, which the engine
loads.
"""
from __future__ import annotations

import os

import torch

from benchmarks.quantize_checkpoint import quantize_with_library, save_compressed  # noqa: F401


@torch.no_grad()
def reference_greedy(model, ids: list[int], max_new_tokens: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                         min_new_tokens=max_new_tokens, pad_token_id=0)
    return out[0, len(ids):].tolist()


def float_dir(tmp_root: str, arch: str = "llama") -> str:
    from tests.conftest import make_tiny_model
    path = os.path.join(tmp_root, f"float-{arch}")
    if not os.path.isdir(path):
        make_tiny_model(path, arch)
    return path
