"""The HPU build's plugins, called in-process on the fake HPU.

`register()` (vllm.platform_plugins: hpu): the platform's class path where the HPU is
present, after Gaudi's runtime settings; `register_ops()` (vllm.general_plugins:
hpu_custom_ops): binds the HPU forward of each custom op. The installed shape (entry
points from setup.py on a stub Gaudi image) is checked in tests/hpu/test_install.py.
"""
from __future__ import annotations

import os

import pytest
import torch

from tests.hpu.conftest import platform_env
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.hpu import plugin as hpu_plugin
from vllm.platforms import current_platform

SETTINGS = ("PT_HPU_WEIGHT_SHARING", "PT_HPU_ENABLE_LAZY_COLLECTIVES", "RUNTIME_SCALE_PATCHING")


@pytest.fixture
def unset_settings(monkeypatch):
    """The settings unset, restored (to unset) after the test whatever register() wrote."""
    for name in SETTINGS:
        monkeypatch.setenv(name, "placeholder")  # records the original state for undo
        monkeypatch.delenv(name)
    monkeypatch.setattr(torch._dynamo.config, "disable", False)
    monkeypatch.setenv("VLLM_USE_FAKE_HPU", "1")
    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
    return monkeypatch


def _settings() -> list:
    return [os.environ.get(k) for k in SETTINGS] + [torch._dynamo.config.disable]


def test_register_in_lazy_mode(unset_settings):
    unset_settings.setenv("PT_HPU_LAZY_MODE", "1")
    assert hpu_plugin.register() == "vllm.hpu.platform.HpuPlatform"
    assert _settings() == ["0", "true", None, True]


def test_register_in_compile_mode_keeps_what_the_user_set(unset_settings):
    unset_settings.setenv("PT_HPU_LAZY_MODE", "0")
    unset_settings.setenv("RUNTIME_SCALE_PATCHING", "0")
    assert hpu_plugin.register() == "vllm.hpu.platform.HpuPlatform"
    assert _settings() == ["0", None, "0", False]
    unset_settings.delenv("RUNTIME_SCALE_PATCHING")
    unset_settings.setenv("PT_HPU_WEIGHT_SHARING", "1")
    hpu_plugin.register()
    assert _settings() == ["1", None, "1", False]


def test_register_stands_aside_without_an_hpu(unset_settings):
    """None (vLLM's 'device absent') when another device is named at run time, or
    when neither Gaudi's runtime nor the fake HPU is there; nothing is set."""
    unset_settings.setenv("VLLM_TARGET_DEVICE", "cpu")
    assert hpu_plugin.register() is None
    unset_settings.delenv("VLLM_TARGET_DEVICE")
    unset_settings.delenv("VLLM_USE_FAKE_HPU")
    find_spec = hpu_plugin.importlib.util.find_spec
    unset_settings.setattr(hpu_plugin.importlib.util, "find_spec", lambda name, *a: (
        None if name == "habana_frameworks" else find_spec(name, *a)))
    assert hpu_plugin.register() is None
    assert _settings() == [None, None, None, False]
    unset_settings.setenv("VLLM_TARGET_DEVICE", "hpu")  # asked for: the (fake) HPU
    assert hpu_plugin.register() == "vllm.hpu.platform.HpuPlatform"


def test_builtin_hpu_platform_applies_the_settings_without_the_plugin(unset_settings):
    """Issue 54: VLLM_TARGET_DEVICE=hpu on a build without the HPU entry points (as a
    source checkout's CPU build) chose the HPU platform but skipped Gaudi's runtime
    settings, which only the plugin's register() applied."""
    import vllm.plugins
    from vllm import platforms
    unset_settings.setenv("VLLM_TARGET_DEVICE", "hpu")
    unset_settings.setenv("PT_HPU_LAZY_MODE", "1")
    unset_settings.setattr(platforms, "load_platform_plugin", lambda: None)
    platforms._reset_current_platform()
    try:
        qualname = platforms.resolve_current_platform_cls_qualname()
        assert qualname == hpu_plugin.HPU_PLATFORM
        platforms._load_cls(qualname)()  # the platform, built: settings applied
    finally:
        platforms._reset_current_platform()
    assert _settings() == ["0", "true", None, True]
    unset_settings.setenv("VLLM_TARGET_DEVICE", "cpu")  # another platform: nothing more
    unset_settings.delenv("PT_HPU_WEIGHT_SHARING")
    assert platforms.resolve_current_platform_cls_qualname().endswith("CpuPlatform")
    assert os.environ.get("PT_HPU_WEIGHT_SHARING") is None


def test_register_ops_binds_the_hpu_kernels(monkeypatch):
    """Without the binding an op built on the HPU runs its native forward; after
    `register_ops()` every op with a Gaudi kernel, subclasses included (the scaled
    rotary embeddings), runs it, with the native results."""
    x, positions = torch.randn(5, 16), torch.tensor([0, 3, 7, 8, 30])
    q, k = torch.randn(5, 4 * 16), torch.randn(5, 2 * 16)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
    with platform_env("hpu"):
        assert current_platform.is_hpu()
        _unbind(monkeypatch, "hpu")
        # Only the plugin binds here: the platform's own binding (the worker's device
        # initialization, or the first layer built) is left out.
        from vllm import platforms
        monkeypatch.setattr(platforms._current_platform, "_ops_bound", True)
        unbound = [RMSNorm(16), get_rope(16, 16, 64, 10000.0, scaling)]
        assert [op.forward_method_name for op in unbound] == ["forward_native"] * 2
        hpu_plugin.register_ops()
        bound = [RMSNorm(16), get_rope(16, 16, 64, 10000.0, scaling)]
    assert type(bound[1]).__name__ == "Llama3RotaryEmbedding"
    assert [op.forward_method_name for op in bound] == ["rms_norm_hpu",
                                                        "rotary_embedding_hpu"]
    torch.testing.assert_close(bound[0](x), unbound[0].forward_native(x))
    for got, want in zip(bound[1](positions, q.clone(), k.clone()),
                         unbound[1].forward_native(positions, q.clone(), k.clone())):
        torch.testing.assert_close(got, want)


def _unbind(monkeypatch, device: str) -> None:
    """Every op without its `device` forward, restored when the test ends."""
    for entry in CustomOp.registry.values():
        monkeypatch.setattr(entry, "forwards",
                            {d: fn for d, fn in entry.forwards.items() if d != device})


def test_register_ops_binds_nothing_on_cpu(monkeypatch):
    with platform_env("cpu"):
        _unbind(monkeypatch, "hpu")
        hpu_plugin.register_ops()
        assert not any("hpu" in e.forwards for e in CustomOp.registry.values())
        assert RMSNorm(16).forward_method_name == "rms_norm_cpu"


def test_register_forward_needs_a_registered_op():
    with pytest.raises(ValueError, match="no in-tree custom op named 'nope'"):
        CustomOp.register_forward("nope", "hpu")(lambda self, x: x)
