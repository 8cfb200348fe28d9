"""torch.compile markers that do not import torch._dynamo.

`torch.compiler.assume_constant_result` imports torch._dynamo (most of a second on a
small CPU) only to set a marker attribute on the function, which dynamo reads when it
traces a call to it. Modules imported at start-up (the native CPU ops, bound when the
first layer is built) mark their functions here instead, so an engine that never
compiles never imports dynamo. Once dynamo is loaded, its own decorator is used.
"""
from __future__ import annotations

import sys
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)

CONSTANT_RESULT_MARKER = "_dynamo_marked_constant"
"""The attribute torch._dynamo.assume_constant_result sets (tests/utils check it still
is the one)."""


def assume_constant_result(fn: F) -> F:
    """Mark `fn` as returning a constant while torch.compile traces (its result becomes
    a constant of the graph; no guard on what it reads)."""
    if "torch._dynamo" in sys.modules:
        import torch
        return torch.compiler.assume_constant_result(fn)
    setattr(fn, CONSTANT_RESULT_MARKER, True)
    return fn
