"""Pipeline stages of a `transformers` model, from its `base_model_pp_plan`.

transformers names the modules a pipeline cuts (`embed_tokens`, `layers`, `norm`) and
what flows between them (`hidden_states`). A stage keeps its share of the decoder
layers (split as the native models split them, `get_pp_indices`) and swaps the rest for
`SkippedLayer`, which hands the hidden states through; the embedding stays on the first
stage and the final norm on the last (`StageIdentity` elsewhere). A later stage feeds
the hidden states it received to the library's forward as `inputs_embeds` (the
embedding is the only thing that reads the ids), so the model's own rotary and layer
loop run unchanged; its layers' residual adds live inside each layer, so the hidden
states are all that travels between stages.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm.model_executor.models.transformers.support import refuse
from vllm.model_executor.models.utils import get_pp_indices

_NEEDED = ("embed_tokens", "layers", "norm")


class SkippedLayer(nn.Module):
    """A decoder layer of another stage: returns the hidden states it is given."""

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states


class StageIdentity(nn.Module):
    """The embedding of a later stage or the final norm of an earlier one."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return x


def split_stages(base: nn.Module, config: Any, rank: int, size: int) -> tuple[int, int]:
    """Keep this stage's modules of `base`; [start, end) of its decoder layers."""
    num_layers = config.num_hidden_layers
    if size == 1:
        return 0, num_layers
    plan = dict(getattr(config, "base_model_pp_plan", None) or {})
    missing = [name for name in _NEEDED if name not in plan or not hasattr(base, name)]
    if missing:
        raise refuse(config, f"pipeline parallelism needs the model's base_model_pp_plan "
                     f"to name {', '.join(_NEEDED)} (missing: {', '.join(missing)}); use "
                     "--pipeline-parallel-size 1")
    start, end = get_pp_indices(num_layers, rank, size)
    for i in range(num_layers):
        if not start <= i < end:
            base.layers[i] = SkippedLayer()
    if rank > 0:
        base.embed_tokens = StageIdentity()
    if rank < size - 1:
        base.norm = StageIdentity()
    return start, end
