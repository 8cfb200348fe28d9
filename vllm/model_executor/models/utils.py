"""Helpers shared by the decoder-only model files: PP layer split, config reading."""
from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

from vllm.distributed import get_pp_group
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead


def default_weight_loader(param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
    """Copy a whole (unsharded) checkpoint tensor into `param`, casting its dtype."""
    if param.shape != loaded_weight.shape:
        raise ValueError(f"shape mismatch: checkpoint {tuple(loaded_weight.shape)}, parameter "
                         f"{tuple(param.shape)}.")
    param.data.copy_(loaded_weight)


class PPMissingLayer(nn.Identity):
    """Placeholder for a module that lives on another pipeline stage.

    Keeping it in place keeps parameter names (and the layer indices in them)
    global on every stage; it has no parameters, so nothing is loaded into it.
    """


def attach_lm_head(model: nn.Module, config: Any, prefix: str, is_first_stage: bool,
                   is_last_stage: bool, tie_to: Optional[nn.Module] = None) -> None:
    """Give `model` its LM head for this pipeline stage: `lm_head` and
    `logits_processor` on the last stage (the head sharing `tie_to`'s weight when the
    embedding is tied and lives on this stage too), a `PPMissingLayer` elsewhere."""
    if not is_last_stage:
        model.lm_head = PPMissingLayer()
        return
    model.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, prefix=prefix)
    if tie_to is not None and is_first_stage:
        model.lm_head.tie_weights(tie_to)
    model.logits_processor = LogitsProcessor(config.vocab_size)


def get_pp_indices(num_layers: int, pp_rank: int, pp_size: int) -> tuple[int, int]:
    """[start, end) of the decoder layers owned by stage `pp_rank`.

    Layers are split evenly; the remainder goes one layer each to the stages just
    before the last one (the first and last stages also hold the embedding and the
    LM head), as vLLM does.
    """
    if pp_size > num_layers:
        raise ValueError(f"pipeline_parallel_size ({pp_size}) must not exceed the number of "
                         f"hidden layers ({num_layers}).")
    sizes = [num_layers // pp_size] * pp_size
    for i in range(2, num_layers % pp_size + 2):
        sizes[-i] += 1
    start = sum(sizes[:pp_rank])
    return start, start + sizes[pp_rank]


def make_layers(num_layers: int, layer_fn: Callable[[str], nn.Module],
                prefix: str) -> tuple[int, int, nn.ModuleList]:
    """Build this stage's layers as `layer_fn(f"{prefix}.{i}")` at global index i."""
    pp = get_pp_group()
    start, end = get_pp_indices(num_layers, pp.rank_in_group, pp.world_size)
    layers = nn.ModuleList([layer_fn(f"{prefix}.{i}") if start <= i < end else PPMissingLayer()
                            for i in range(num_layers)])
    return start, end, layers


def rope_config(config: Any) -> tuple[float, Optional[dict[str, Any]]]:
    """(rope_theta, scaling dict or None) from a transformers 4 or 5 config.

    transformers 5 puts everything in `rope_parameters`; 4.x had `rope_theta`
    and `rope_scaling` side by side.
    """
    params = dict(getattr(config, "rope_parameters", None) or {})
    legacy = getattr(config, "rope_scaling", None)
    if not params and legacy:
        params = dict(legacy)
    theta = params.get("rope_theta", getattr(config, "rope_theta", None) or 10000.0)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if "original_max_position_embeddings" not in params and getattr(
            config, "original_max_position_embeddings", None):  # Phi-3 keeps it outside
        params["original_max_position_embeddings"] = config.original_max_position_embeddings
    return float(theta), (params if rope_type not in (None, "default") else None)


def head_dim_of(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def partial_rotary_factor_of(config: Any) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("partial_rotary_factor",
                            getattr(config, "partial_rotary_factor", None) or 1.0))


def sliding_window_of(config: Any, layer_idx: int) -> Optional[int]:
    """The attention window of decoder layer `layer_idx`, None for full attention.

    transformers 5 configs list `layer_types` ("sliding_attention"/"full_attention");
    older Qwen2-style configs have `use_sliding_window` and window only the layers from
    `max_window_layers` on; Mistral/Mixtral/Phi-3 window every layer when
    `sliding_window` is set.
    """
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    types = getattr(config, "layer_types", None)
    if types:
        return int(window) if types[layer_idx] == "sliding_attention" else None
    first = getattr(config, "max_window_layers", None)
    if first is not None and layer_idx < first:
        return None
    return int(window)


_PARTIAL_UPDATE = contextvars.ContextVar("vllm_partial_weight_update", default=False)


@contextlib.contextmanager
def weight_update_scope() -> Iterator[None]:
    """`load_weights` calls inside take a subset of the weights (an in-place update,
    vllm/distributed/weight_transfer/): parameters that receive nothing keep their
    values, and a tensor no parameter takes is an error, not a warning (a misspelt
    name would otherwise leave the old weight serving silently)."""
    token = _PARTIAL_UPDATE.set(True)
    try:
        yield
    finally:
        _PARTIAL_UPDATE.reset(token)


def check_loaded(params: dict[str, nn.Parameter], loaded: set[str],
                 ignored: list[str]) -> set[str]:
    """The end of every `load_weights`: warn about checkpoint tensors nothing took, and
    fail naming the parameters no tensor filled (a parameter marked `optional` may stay
    as built). Returns `loaded`. Inside `weight_update_scope` the rules of a partial
    update apply instead."""
    if _PARTIAL_UPDATE.get():
        if ignored:
            raise ValueError(f"Unknown weight name(s) for this model: "
                             f"{', '.join(ignored[:8])}"
                             f"{' ...' if len(ignored) > 8 else ''}.")
        return loaded
    if ignored:
        logging.getLogger(__name__).warning(
            "Ignored %d checkpoint tensors with no matching parameter: %s", len(ignored),
            ", ".join(ignored[:8]))
    missing = sorted(n for n in set(params) - loaded
                     if not getattr(params[n], "optional", False))
    if missing:
        raise ValueError(f"The checkpoint has no weights for {len(missing)} parameters, "
                         f"e.g. {', '.join(missing[:5])}.")
    return loaded
