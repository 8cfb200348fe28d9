"""Entry-point plugins by group, and the one out-of-tree platform among them.

Platform resolution needs the platform plugins, and general plugins run once the
platform is resolved (vllm/plugins.py): this module is what both sides share, so
neither imports the other back.
"""
from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import Any, Callable, Optional

from vllm import envs

logger = logging.getLogger(__name__)


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
