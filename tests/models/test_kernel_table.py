"""The kernel table (vllm/model_executor/kernels.py): the seam through which model,
attention and sampling code reach a backend's function kernels without importing it."""
from __future__ import annotations

import pytest
import torch

from vllm.model_executor import kernels


def test_a_backend_binds_its_own_device_only(monkeypatch):
    monkeypatch.setattr(kernels, "_bound", {})
    fast = lambda logits: logits.argmax(-1)  # noqa: E731
    assert kernels.register_kernels({"argmax": fast}, "fakedev") == ["argmax"]
    assert kernels.kernel("argmax", "fakedev") is fast
    assert kernels.kernel("argmax", "otherdev")(torch.zeros(1, 3)) is None  # the default
    assert kernels.bound_kernels("fakedev") == {"argmax": fast}


def test_unknown_names_are_refused(monkeypatch):
    monkeypatch.setattr(kernels, "_bound", {})
    with pytest.raises(ValueError, match="no kernel named 'gemm_magic'"):
        kernels.kernel("gemm_magic", "cpu")
    with pytest.raises(ValueError, match="no kernel named gemm_magic"):
        kernels.register_kernels({"gemm_magic": print}, "cpu")


def test_the_current_platform_binds_before_the_lookup():
    """On the CPU platform the native kernels (vllm/cpu/ops.py) come back; every entry
    of a backend's table names a known kernel."""
    from vllm.platforms import current_platform
    if not current_platform.is_cpu():
        pytest.skip("CPU platform only")
    from vllm.cpu.ops import CPU_KERNELS
    assert kernels.kernel("linear") is CPU_KERNELS["linear"]
    assert kernels.bound_kernel("int4_prepare") is None  # the CPU keeps the generic layout


def test_linear_picks_the_kernel_once_per_module(monkeypatch):
    calls = []

    def counting(module, x, weight, bias=None):
        calls.append(module)
        return torch.nn.functional.linear(x, weight, bias)

    layer = torch.nn.Linear(4, 3)
    monkeypatch.setattr(kernels, "kernel", lambda name, device=None: counting)
    x = torch.randn(2, 4)
    torch.testing.assert_close(kernels.linear(layer, x, layer.weight, layer.bias), layer(x))
    monkeypatch.setattr(kernels, "kernel", lambda name, device=None: pytest.fail("again"))
    kernels.linear(layer, x, layer.weight, layer.bias)
    assert calls == [layer, layer]
    assert kernels.LINEAR_ATTR not in layer.state_dict()


def test_the_torch_defaults_match_torch():
    x, w, b = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
    torch.testing.assert_close(kernels.torch_linear(None, x, w, b),
                               torch.nn.functional.linear(x, w, b))
    x_q, w_q = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    xs, ws = torch.full((1, 1), 0.5), torch.full((5,), 2.0)
    want = (x_q.float() @ w_q.float().t()) * 0.5 * 2.0 + b
    torch.testing.assert_close(kernels.torch_fp8_gemm(x_q, xs, w_q, ws, b, torch.float32),
                               want)
