"""The `vllm` logger: one handler with vLLM's line format, level from VLLM_LOGGING_LEVEL."""
from __future__ import annotations

import logging
import sys

_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
_configured = False


def init_logger(name: str) -> logging.Logger:
    _configure_root()
    return logging.getLogger(name)


def _configure_root() -> None:
    global _configured
    if _configured:
        return
    _configured = True
    root = logging.getLogger("vllm")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%m-%d %H:%M:%S"))
        root.addHandler(handler)
    from vllm import envs
    root.setLevel(envs.VLLM_LOGGING_LEVEL.upper())
    root.propagate = True


_configure_root()
