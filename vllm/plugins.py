"""Out-of-tree platforms and general plugins, found through entry points.

`vllm.platform_plugins`: each entry point is a function returning the qualified
name of a Platform class, or None when its device is absent; at most one may
activate. `vllm.general_plugins`: functions run once in every process.
`VLLM_PLUGINS` (comma-separated entry-point names) filters both groups: unset loads
every plugin, set but empty loads none (vLLM's reading: an empty list of names).
"""
from __future__ import annotations

import logging

from vllm.platforms.plugin_loader import load_platform_plugin, load_plugins_by_group

__all__ = ["load_general_plugins", "load_platform_plugin", "load_plugins_by_group"]

logger = logging.getLogger(__name__)

_general_plugins_loaded = False


def load_general_plugins() -> None:
    """Run every general plugin once per process (called by engines and workers).

    The platform is resolved first (its plugin loaded, its settings applied), as
    vLLM's plugin documentation orders them: a general plugin may ask which platform
    it runs on, and a spawned worker, whose first call this is, had loaded the
    general plugins before any platform plugin."""
    global _general_plugins_loaded
    if _general_plugins_loaded:
        return
    _general_plugins_loaded = True
    from vllm.platforms import current_platform
    logger.debug("Platform for the general plugins: %s", current_platform.device_name)
    for name, func in load_plugins_by_group("vllm.general_plugins").items():
        try:
            func()
            logger.info("General plugin %s loaded.", name)
        except Exception:
            logger.exception("General plugin %s failed", name)
