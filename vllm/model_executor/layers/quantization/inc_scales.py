"""INC's scale methods: from a measured max-abs to a per-tensor fp8 scale.

A scale here is a dequantization scale `s` (x ~= fp8(x / s) * s). The maxabs
methods map the measured max-abs to a share of the fp8 range, the backoff (INC's
defaults: 0.25 of it for activations, 0.5 for weights, leaving room for values
beyond the calibration data): `s = maxabs / (backoff * FP8_FULLSCALE)`.

| scale_method | s |
|---|---|
| unit_scale | 1 |
| maxabs_arbitrary | as above |
| maxabs_pow2 | rounded up to a power of two (x / s is then exact in every format) |
| maxabs_hw | rounded up to a power of two the hardware applies as an exponent bias |

FP8_FULLSCALE is 448, float8_e4m3fn's largest value: Gaudi 3's fp8, and the format
the fake HPU and the CPU emulate (torch's float8 casts). Gaudi 2 saturates e4m3 at
240 and has only four hardware scales; its numerics are not emulated, so
`device_for_scales` accepts GAUDI3 only. Gaudi 3's exponent bias spans 0..62
around the default 7, so its hardware scales are 2^-55 .. 2^7; rounding up keeps
every calibrated value inside the backoff share of the range.
"""
from __future__ import annotations

import math

FP8_FULLSCALE = 448.0
HW_SCALE_RANGE = {"GAUDI3": (2.0 ** -55, 2.0 ** 7)}
_MIN_MAXABS = 1e-12
"""A tensor measured all zero (never seen, or zero weights) still gets a finite scale."""


def _pow2_ceil(x: float) -> float:
    return 2.0 ** math.ceil(math.log2(x))


def compute_scale(maxabs: float, method: str, backoff: float,
                  device: str = "GAUDI3") -> float:
    """The dequantization scale of one tensor whose measured max-abs is `maxabs`."""
    if method == "unit_scale":
        return 1.0
    arbitrary = max(float(maxabs), _MIN_MAXABS) / (backoff * FP8_FULLSCALE)
    if method == "maxabs_arbitrary":
        return arbitrary
    if method == "maxabs_pow2":
        return _pow2_ceil(arbitrary)
    if method == "maxabs_hw":
        low, high = HW_SCALE_RANGE[device]
        return min(max(_pow2_ceil(arbitrary), low), high)
    raise ValueError(f"scale_method={method!r} is not supported.")
