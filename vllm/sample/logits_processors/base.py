"""What one built-in sampling knob owns (`BuiltinLogitsProcessor`), and its per-row state.

A knob (temperature, top-k/top-p, penalties, logit_bias, ...) is one class that says:

- whether a request activates it (`activates`), and, for a knob whose effect ends with
  the output length (min_tokens), whether it is still in force for a row (`in_force`);
- from which output count a greedy row may skip it (`argmax_from`: the greedy fast
  path, `needs_only_argmax`), and whether it holds speculative drafts back;
- its persistent per-row state in the input batch (`new_state`: a `RowState` whose
  rows are written when a request gets one, moved on condense, cleared on removal,
  like vLLM's `BatchUpdate`), which is never rebuilt per step;
- its inputs for a batch of logits rows (`build`), how it changes the logits
  (`apply`), and its fixed-shape form for the HPU (`fixed_form`: dense [B, V] or
  neutral rows, so warmup compiles every shape serving meets).

Two stages, as in vLLM's sampler: "logits" knobs edit the logits every row sees
(greedy rows too) before the argmax; "probs" knobs (temperature, min-p, top-k/top-p)
shape the distribution random rows sample from, after it, and so keep the argmax.
The table of knobs, in the order they apply, is `BUILTIN_PROCESSORS`
(logits_processors/__init__.py); adding a knob is one file and one entry there.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch

from vllm.sample.metadata import SamplingMetadata, SamplingRow
from vllm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from vllm.sample.logits_processors.dense import DenseForms


class RowState:
    """A knob's per-row state in a `SamplingState` of fixed size (no-ops by default)."""

    def write_row(self, index: int, row: SamplingRow) -> None:
        """Row `index` now samples for `row` (its token lists are read, not copied)."""

    def clear_row(self, index: int) -> None:
        """Row `index` no longer holds a request."""

    def move_row(self, src: int, dst: int) -> None:
        """Row `src`'s request moves to the free row `dst` (condense)."""

    def record_tokens(self, rows: Sequence[int], token_ids: Sequence[int]) -> None:
        """token_ids[i] was just appended to row rows[i]'s output."""


class ColumnState(RowState):
    """Per-row values of a knob in CPU tensors: one column per value, written from the
    row's params by `values(params)` (in `dtypes` order)."""

    def __init__(self, num_rows: int, defaults: dict[str, tuple[torch.dtype, float]],
                 values: Callable[[SamplingParams], tuple]) -> None:
        self.columns = {name: torch.full((num_rows,), default, dtype=dtype)
                        for name, (dtype, default) in defaults.items()}
        self._values = values

    def write_row(self, index: int, row: SamplingRow) -> None:
        for column, value in zip(self.columns.values(), self._values(row.params)):
            column[index] = _fit(column, value)

    def move_row(self, src: int, dst: int) -> None:
        for column in self.columns.values():
            column[dst] = column[src]

    def gather(self, name: str, index: torch.Tensor) -> torch.Tensor:
        """The column's values at state rows `index` (a CPU tensor)."""
        return self.columns[name].index_select(0, index)


@dataclass
class BuildContext:
    """What `build` reads: state rows `rows` (logits row i samples for state row
    rows[i]), their `SamplingRow`s, which are greedy, the knob's own `RowState`."""
    rows: Sequence[int]
    srows: Sequence[SamplingRow]
    greedy: list[bool]
    index: torch.Tensor
    """`rows` as a CPU int64 tensor."""
    vocab_size: int
    device: torch.device | str
    md: SamplingMetadata
    states: dict[str, RowState] = field(default_factory=dict)

    @property
    def params(self) -> list[SamplingParams]:
        return [r.params for r in self.srows]

    def random_params(self) -> list[SamplingParams]:
        return [r.params for r, g in zip(self.srows, self.greedy) if not g]


class BuiltinLogitsProcessor:
    """One knob of the table (see the module docstring). Subclasses set `name` and
    `stage`, and override what their knob needs."""

    name: str = ""
    stage: str = "logits"
    """"logits" (before the argmax, every row) or "probs" (random rows, after it)."""

    # ------------------------------------------------------------- requests
    def activates(self, params: SamplingParams) -> bool:
        """Whether a request with these params uses the knob at all."""
        raise NotImplementedError

    def in_force(self, row: SamplingRow) -> bool:
        """Whether the knob acts on the row now (default: whenever it activates)."""
        return self.activates(row.params)

    expires = False
    """Whether `in_force` can turn False as the output grows (metadata cached with the
    knob in force expires then)."""

    def argmax_from(self, params: SamplingParams) -> Optional[int]:
        """Output count from which a greedy row's token is the raw argmax as far as this
        knob goes (None: never). "probs" knobs never touch a greedy row."""
        if self.stage == "probs" or not self.activates(params):
            return 0
        return None

    def holds_drafts_back(self, params: SamplingParams, num_output_tokens: int) -> bool:
        """Whether the knob's effect on a row depends on the output so far, so drafts
        (which change it row by row) cannot be verified in one pass."""
        return False

    # ---------------------------------------------------------------- state
    def new_state(self, num_rows: int) -> Optional[RowState]:
        """The knob's per-row state in the input batch (None: it keeps none)."""
        return None

    # ---------------------------------------------------------------- batch
    def build(self, ctx: BuildContext) -> Optional[Any]:
        """The knob's inputs for a batch ("logits" knobs: kept in `md.logits_inputs`,
        None when no row uses it; "probs" knobs set their `md` fields themselves)."""
        raise NotImplementedError

    def apply(self, logits: torch.Tensor, inputs: Any, static_shapes: bool) -> torch.Tensor:
        """"logits" knobs: the float32 logits with the knob applied (may be in place)."""
        raise NotImplementedError

    def apply_probs(self, logits: torch.Tensor, md: SamplingMetadata,
                    sampler: Any) -> torch.Tensor:
        """"probs" knobs: the random rows' logits shaped by the knob (in place)."""
        raise NotImplementedError

    def per_step(self, inputs: Any) -> bool:
        """Whether its fixed-shape form depends on the latest output (then metadata in
        fixed shapes serves one step only)."""
        return False

    def fixed_form(self, inputs: Optional[Any], md: SamplingMetadata, dense: "DenseForms",
                   state: Optional[RowState] = None) -> Optional[Any]:
        """The knob in fixed shapes ([N, V] or neutral rows whatever the requests ask):
        "logits" knobs fold into `dense` (returning None) or return their own inputs
        (`state`: the knob's per-row state in the batch, when there is one); "probs"
        knobs set neutral `md` fields where absent."""
        raise NotImplementedError


_F32_MAX = float(torch.finfo(torch.float32).max)


def _fit(column: torch.Tensor, value: float) -> float:
    """`value` clamped into a float32 column's finite range: SamplingParams accepts any
    finite float (temperature=1e300 samples uniformly, as in vLLM), which a float32
    tensor cannot hold (torch raises: the engine loop would die on a request knob)."""
    if column.dtype == torch.float32:
        return max(-_F32_MAX, min(_F32_MAX, float(value)))
    return value
