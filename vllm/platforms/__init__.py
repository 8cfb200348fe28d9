"""The current platform: recorded build target, else auto-detection.

`current_platform` resolves lazily on first attribute access, so importing vllm
never initialises a device.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
from typing import Any, Optional

from vllm import envs
from vllm.platforms.interface import Platform, PlatformEnum
from vllm.platforms.plugin_loader import load_platform_plugin

logger = logging.getLogger(__name__)

_BUILTIN = {
    "cpu": "vllm.cpu.platform.CpuPlatform",
    "cuda": "vllm.platforms.cuda.CudaPlatform",
    "hpu": "vllm.hpu.platform.HpuPlatform",
}


def _recorded_target() -> str:
    """The target setup.py recorded at build time ('' for a source checkout)."""
    try:
        from vllm._build_info import TARGET_DEVICE  # written by setup.py
        return TARGET_DEVICE
    except ImportError:
        return ""


def _detect_builtin() -> str:
    """VLLM_TARGET_DEVICE at run time, then VLLM_USE_FAKE_HPU, the build target, detection."""
    env = envs.VLLM_TARGET_DEVICE.strip().lower()
    if env:
        if env not in _BUILTIN:
            raise ValueError(f"VLLM_TARGET_DEVICE={env!r}; choose one of {sorted(_BUILTIN)}")
        return env
    if envs.VLLM_USE_FAKE_HPU:
        return "hpu"
    has_habana = importlib.util.find_spec("habana_frameworks") is not None
    recorded = _recorded_target()
    if recorded == "hpu" and not has_habana:
        # Visible, not silent: a +gaudi build off a Gaudi image runs the HPU code
        # path on the CPU stand-ins (vllm/hpu); VLLM_TARGET_DEVICE=cpu picks the CPU.
        logger.warning("This build targets Intel Gaudi but habana_frameworks is not "
                       "installed: running the fake HPU (set VLLM_TARGET_DEVICE=cpu "
                       "for the CPU platform).")
    if recorded in _BUILTIN:
        return recorded
    if has_habana:
        return "hpu"
    try:
        import torch
        if torch.cuda.is_available():
            return "cuda"
    except Exception:  # pragma: no cover - broken torch installs
        pass
    return "cpu"


def resolve_current_platform_cls_qualname() -> str:
    oot = load_platform_plugin()
    if oot is not None:
        return oot
    # A built-in HPU platform chosen here (no entry point: VLLM_TARGET_DEVICE=hpu on
    # another build) applies Gaudi's runtime settings itself when built (HpuPlatform).
    return _BUILTIN[_detect_builtin()]


def _load_cls(qualname: str) -> type:
    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)


_current_platform: Optional[Platform] = None


class _LazyPlatform:
    """Proxy that builds the platform object the first time it is used."""

    def __getattr__(self, name: str) -> Any:
        global _current_platform
        if _current_platform is None:
            qualname = resolve_current_platform_cls_qualname()
            _current_platform = _load_cls(qualname)()
            logger.debug("Current platform: %s", qualname)
        return getattr(_current_platform, name)


def _reset_current_platform() -> None:
    """Forget the resolved platform (tests that change VLLM_TARGET_DEVICE or plugins)."""
    global _current_platform
    _current_platform = None


current_platform: Platform = _LazyPlatform()  # type: ignore[assignment]

__all__ = ["Platform", "PlatformEnum", "current_platform"]
