"""The HPU build's vLLM plugins: `register` (platform) and `register_ops` (general).

setup.py declares them for HPU builds only (VLLM_TARGET_DEVICE=hpu, or detected on
a Gaudi image):

    [vllm.platform_plugins]  hpu = vllm.hpu.plugin:register
    [vllm.general_plugins]   hpu_custom_ops = vllm.hpu.plugin:register_ops

This is the shape of vLLM's Gaudi plugin, so tooling that lists or filters vLLM
plugins (`VLLM_PLUGINS=hpu,hpu_custom_ops`) sees the HPU backend as it expects.
`register()` runs once, when the platform is resolved, before any model code:
that is where the Gaudi runtime settings belong, because the bridge reads some of
them when it is first imported. `register_ops()` runs in every process (engine
core, workers) before the model is built.
"""
from __future__ import annotations

import importlib.util
import logging
import os
from typing import Optional

from vllm import envs

logger = logging.getLogger(__name__)

HPU_PLATFORM = "vllm.hpu.platform.HpuPlatform"


def hpu_requested() -> bool:
    """The HPU unless another device is named at run time, where Gaudi's runtime
    (habana_frameworks) is installed or the fake HPU is asked for."""
    target = envs.VLLM_TARGET_DEVICE.strip().lower()
    if target:
        return target == "hpu"
    return envs.VLLM_USE_FAKE_HPU or importlib.util.find_spec("habana_frameworks") is not None


def _set_unless_given(name: str, value: str, applied: dict[str, str]) -> None:
    if not envs.is_set(name):
        os.environ[name] = value
        applied[name] = value


def configure_hpu_runtime() -> dict[str, str]:
    """Gaudi's settings for torch.compile and HPU graphs; returns the variables set.

    - PT_HPU_WEIGHT_SHARING=0: weights are not shared between host and device
      tensors (set before the bridge is imported, which reads it);
    - lazy mode (HPU graphs): torch._dynamo off (the lazy backend cannot run
      torch.compile) and PT_HPU_ENABLE_LAZY_COLLECTIVES=true (tensor parallel with
      HPU graphs needs it);
    - eager / torch.compile mode: RUNTIME_SCALE_PATCHING=1, so FP8 scales are
      patched at run time instead of recompiling a graph per scale.
    A variable the user set is left as given. The lazy mode is the bridge's
    `is_lazy()` (`vllm.hpu`), the one source of truth for it.
    """
    applied: dict[str, str] = {}
    _set_unless_given("PT_HPU_WEIGHT_SHARING", "0", applied)
    import torch

    from vllm.hpu import habana
    if habana.is_lazy():
        torch._dynamo.config.disable = True
        _set_unless_given("PT_HPU_ENABLE_LAZY_COLLECTIVES", "true", applied)
    else:
        _set_unless_given("RUNTIME_SCALE_PATCHING", "1", applied)
    return applied


def apply_runtime_settings() -> None:
    """`configure_hpu_runtime`, logged. The platform layer calls it too when it picks
    the built-in HPU platform without this plugin (VLLM_TARGET_DEVICE=hpu on a build
    without the HPU entry points, or an HPU build off a Gaudi image): the settings
    belong to the HPU platform, however it was chosen. Calling it again sets nothing
    the first call set (a variable already given is kept)."""
    applied = configure_hpu_runtime()
    if applied:
        logger.info("HPU plugin set %s (unset before).",
                    ", ".join(f"{k}={v}" for k, v in applied.items()))


def register() -> Optional[str]:
    """`vllm.platform_plugins` entry point: the HPU platform's class path after
    applying the runtime settings; None where no HPU is present or another device
    was asked for at run time (vLLM's contract for an absent device)."""
    if not hpu_requested():
        return None
    apply_runtime_settings()
    return HPU_PLATFORM


def register_ops() -> None:
    """`vllm.general_plugins` entry point: bind the HPU forward of each custom op
    (vllm/hpu/ops.py) in a process whose platform is the HPU.
    A CPU run of an HPU build (VLLM_TARGET_DEVICE=cpu) imports nothing of Gaudi's."""
    from vllm.platforms import current_platform
    if not current_platform.is_hpu():
        return
    from vllm.hpu.ops import register_hpu_ops
    logger.debug("HPU forwards bound for: %s", ", ".join(register_hpu_ops()))
