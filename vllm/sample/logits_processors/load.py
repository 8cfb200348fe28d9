"""Finding the custom logits-processor classes an engine runs, as vLLM does.

Every installed entry point of the group `vllm.logits_processors`, then the
processors the user names (`--logits-processors` / `LLM(logits_processors=[...])`):
classes, or qualified names written `package.module:Class` (vLLM's form) or
`package.module.Class`. Each must subclass `LogitsProcessor`.
"""
from __future__ import annotations

import importlib
import logging
from importlib.metadata import entry_points
from typing import Any, Optional, Sequence

from vllm.sample.logits_processors.interface import LogitsProcessor
from vllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

LOGITSPROCS_GROUP = "vllm.logits_processors"


def load_custom_logitsprocs(specs: Optional[Sequence[Any]]) -> list[type[LogitsProcessor]]:
    """The installed plugins' classes, then those of `specs` (classes or names)."""
    classes = [_checked(ep.load(), ep.value) for ep in entry_points(group=LOGITSPROCS_GROUP)]
    for spec in specs or ():
        classes.append(_checked(spec if isinstance(spec, type) else _resolve(spec), spec))
    return classes


def _resolve(name: str) -> Any:
    if not isinstance(name, str) or not name:
        raise ValueError(f"logits_processors: {name!r} is neither a class nor a qualified "
                         "class name ('package.module:Class' or 'package.module.Class').")
    module_name, sep, qualname = name.partition(":")
    if not sep:
        module_name, _, qualname = name.rpartition(".")
    try:
        obj: Any = importlib.import_module(module_name)
        for attr in qualname.split("."):
            obj = getattr(obj, attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"logits_processors: cannot load {name!r}: {e}") from e
    return obj


def _checked(obj: Any, spec: Any) -> type[LogitsProcessor]:
    if not (isinstance(obj, type) and issubclass(obj, LogitsProcessor)):
        raise ValueError(f"logits_processors: {spec!r} is not a subclass of vLLM's "
                         "LogitsProcessor (vllm.v1.sample.logits_processor).")
    return obj


def validate_params(classes: Sequence[type[LogitsProcessor]],
                    params: SamplingParams) -> None:
    """Every custom processor's `validate_params` on a submitted request (ValueError: the
    request is refused)."""
    for cls in classes:
        cls.validate_params(params)
