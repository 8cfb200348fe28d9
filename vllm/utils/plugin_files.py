"""Loading a user's Python file by path (`--tool-parser-plugin`, `--reasoning-parser-plugin`).

The file is run once as a module named after its path, so running it again (the flag
validated at start-up, then read by the server) does not register its parsers twice.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType


def import_file(path: str, flag: str) -> ModuleType:
    """The module of `path`, run on first use; ValueError naming `flag` when unreadable."""
    if not os.path.isfile(path):
        raise ValueError(f"{flag} {path!r} is not a readable Python file.")
    name = "vllm_user_plugin_" + os.path.abspath(path).replace(os.sep, "_").replace(".", "_")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{flag} {path!r} cannot be imported as a Python module.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        del sys.modules[name]
        raise
    return module
