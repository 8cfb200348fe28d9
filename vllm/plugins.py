"""Out-of-tree platforms and general plugins, found through entry points.

`vllm.platform_plugins`: each entry point is a function returning the qualified
name of a Platform class, or None when its device is absent; at most one may
activate. `vllm.general_plugins`: functions run once in every process.
`VLLM_PLUGINS` (comma-separated entry-point names) filters both groups: unset loads
every plugin, set but empty loads none (vLLM's reading: an empty list of names).
"""
from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import Any, Callable, Optional

from vllm import envs

logger = logging.getLogger(__name__)

_general_plugins_loaded = False


def _allowed_names() -> Optional[set[str]]:
    """The plugin names to load; None (unset) for all of them."""
    raw = envs.VLLM_PLUGINS
    if raw is None:
        return None
    return {n.strip() for n in raw.split(",") if n.strip()}


def load_plugins_by_group(group: str) -> dict[str, Callable[[], Any]]:
    allowed = _allowed_names()
    plugins = {}
    for ep in entry_points(group=group):
        if allowed is not None and ep.name not in allowed:
            continue
        try:
            plugins[ep.name] = ep.load()
        except Exception:
            logger.exception("Failed to load plugin %s from group %s", ep.name, group)
    return plugins


def load_platform_plugin() -> Optional[str]:
    """Qualified name of the one activated out-of-tree platform, or None."""
    activated = {}
    for name, func in load_plugins_by_group("vllm.platform_plugins").items():
        try:
            qualname = func()
        except Exception:
            logger.exception("Platform plugin %s failed", name)
            continue
        if qualname is not None:
            activated[name] = qualname
    if len(activated) > 1:
        raise RuntimeError(f"Only one platform plugin can be activated, found: "
                           f"{sorted(activated)}")
    if activated:
        name, qualname = next(iter(activated.items()))
        logger.info("Platform plugin %s is activated: %s", name, qualname)
        return qualname
    return None


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
