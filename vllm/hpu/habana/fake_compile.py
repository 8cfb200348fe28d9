"""The fake HPU's torch.compile backend, and shape-only warmup passes.

On Gaudi, `hpu_backend` turns each graph dynamo hands it into a device binary;
warmup exists to pay for those compiles before serving, and the dummy passes'
arithmetic is nearly free on the device. On the fake HPU the backend runs the
graph eagerly on the CPU (inductor's C++ code generation would take minutes per
bucket), so dynamo traces and guards exactly as on hardware, but every warmup
pass also pays for its arithmetic: at max_model_len=512, 8 sequences (71 buckets
on SmolLM2-135M) that CPU math, not dynamo, was nearly all of the warmup time.

`fake_hpu_backend` therefore keeps, per compiled graph, the shapes and strides
of its outputs (dynamo's traced example values). Inside `shape_only_regions()`
(the warmup of the fake HPU's torch.compile mode) a compiled region returns
zeros of those shapes instead of computing: dynamo still looks up, guards and
traces every region at every bucket shape, which is what warmup is for, while
the eager parts around the regions (attention, the logits) run as before on
zero activations. A graph that writes in place to an input, a parameter or a
buffer (or a view of one), or whose outputs are not all traced tensors, always
computes: skipping it could lose state.
Outside the context every graph computes, so serving is unchanged.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import operator
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
from torch import fx
from torch.multiprocessing.reductions import StorageWeakRef

logger = logging.getLogger(__name__)

_shape_only_depth = 0
"""> 0 inside `shape_only_regions()`; compiled regions then skip their arithmetic."""

_INPLACE_OPERATORS = frozenset({
    operator.setitem, operator.delitem, operator.iadd, operator.isub, operator.imul,
    operator.itruediv, operator.ifloordiv, operator.imod, operator.ipow, operator.imatmul,
    operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift})


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """One graph output: a graph input passed through (`input_index`), or a new tensor."""
    input_index: Optional[int]
    size: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float32
    device: torch.device = torch.device("cpu")

    def materialize(self, args: Sequence[Any]) -> torch.Tensor:
        if self.input_index is not None:
            return args[self.input_index]
        return torch.empty_strided(self.size, self.stride, dtype=self.dtype,
                                   device=self.device).zero_()


def _mutated_args(node: fx.Node) -> Optional[list[Any]]:
    """The arguments an in-place node writes to: the tensor of an in-place method
    (`mul_`) or operator (`+=`, `x[i] = ...`), every tensor argument of a mutable op;
    [] for a pure node."""
    if node.op == "call_method":
        name = str(node.target)
        return [node.args[0]] if name.endswith("_") and not name.startswith("__") else []
    if node.op != "call_function":
        return []
    target = node.target
    if target in _INPLACE_OPERATORS:
        return [node.args[0]]
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return list(node.args) + list(node.kwargs.values()) if schema.is_mutable else []
    name = getattr(target, "__name__", "")
    return [node.args[0]] if name.endswith("_") and not name.startswith("_") else []


def _storage(value: Any) -> Optional[StorageWeakRef]:
    if not isinstance(value, torch.Tensor):
        return None
    return StorageWeakRef(value.untyped_storage())


def _writes_outside(node: fx.Node, external: set[StorageWeakRef]) -> bool:
    """True when `node` writes in place to memory that outlives the graph: an input,
    a parameter or buffer, or a view of one (the traced example values share storage
    exactly where the real tensors do). In-place ops on the graph's own
    intermediates (`silu(x).mul_(y)`) only change values nobody else sees."""
    for arg in _mutated_args(node):
        if not isinstance(arg, fx.Node):
            continue
        storage = _storage(arg.meta.get("example_value"))
        if storage is None or storage in external:
            return True
    return False


def _static_size(value: Any) -> Optional[tuple[int, ...]]:
    try:
        return tuple(int(s) for s in value.shape)
    except (TypeError, ValueError):  # a symbolic size (dynamic shapes)
        return None


def output_specs(gm: fx.GraphModule) -> Optional[list[OutputSpec]]:
    """What `gm` returns, when its outputs may be replaced by zeros; else None."""
    placeholders: dict[fx.Node, int] = {}
    external: set[StorageWeakRef] = set()
    output = None
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            if node.op == "placeholder":
                placeholders[node] = len(placeholders)
            storage = _storage(node.meta.get("example_value"))
            if storage is not None:
                external.add(storage)
        elif node.op == "output":
            output = node
        elif _writes_outside(node, external):
            return None
    if output is None or not isinstance(output.args[0], (tuple, list)):
        return None
    specs = []
    for out in output.args[0]:
        if not isinstance(out, fx.Node):
            return None
        if out in placeholders:
            specs.append(OutputSpec(placeholders[out]))
            continue
        value = out.meta.get("example_value")
        size = _static_size(value) if isinstance(value, torch.Tensor) else None
        if size is None:
            return None
        specs.append(OutputSpec(None, size, tuple(int(s) for s in value.stride()),
                                value.dtype, value.device))
    return specs


def fake_hpu_backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Dynamo backend of the fake HPU: runs `gm` eagerly, or, inside
    `shape_only_regions()`, returns zeros shaped like its outputs."""
    specs = output_specs(gm)
    if specs is None:
        logger.debug("fake HPU backend: graph with %d nodes always computes (in-place ops "
                     "or untraced outputs).", len(gm.graph.nodes))
        return gm.forward

    def run(*args: Any) -> Any:
        if _shape_only_depth > 0:
            return tuple(spec.materialize(args) for spec in specs)
        return gm.forward(*args)

    return run


@contextlib.contextmanager
def shape_only_regions() -> Iterator[None]:
    """Within the block, graphs compiled by `fake_hpu_backend` skip their arithmetic."""
    global _shape_only_depth
    _shape_only_depth += 1
    try:
        yield
    finally:
        _shape_only_depth -= 1
