"""`--quantization inc`: Intel Neural Compressor's FP8 flow (calibrate, then quantize).

`QUANT_CONFIG` names INC's json config (inc_config.py). Two runs:

1. **MEASURE**: the model runs in its float dtype; every selected linear layer
   records the max-abs of its input (and output with `measure_exclude: NONE`) over
   the real tokens of every served pass, plus its weight's max-abs (inc_stats.py).
   The statistics are written to `<dump_stats_path>_hooks_maxabs.json` (+ `.npz`)
   when the engine shuts down (`LLMEngine.shutdown()`, also what vLLM-Gaudi's
   `llm.llm_engine.model_executor.shutdown()` triggers) or on demand with
   `LLMEngine.finalize_calibration()` (INC's `finalize_calibration`). Deleting an
   `LLM` without a shutdown writes nothing: garbage collection order is no trigger
   to rely on.
2. **QUANTIZE**: the statistics are loaded; each selected layer gets a per-tensor
   weight scale (from the weight itself) and a static input scale (from the
   measured input max-abs), both by `scale_method` (inc_scales.py). The weight is
   cast to fp8 once; the input is cast with the static scale at run time.

Execution: on HPU through the shim's `cast_to_fp8_v2` + `fp8_gemm_v2` (Gaudi's ops;
emulated with float8 casts on the fake HPU); elsewhere through fp8_utils'
`fp8_linear` (static input scale). Scales on HPU follow `RUNTIME_SCALE_PATCHING`:

- 1 (default in eager / torch.compile mode): scale tensors are buffers the ops read,
  runtime inputs of a graph; `LLMEngine.reload_quant_scales()` rewrites them in
  place, so new scales compile nothing.
- 0 (default in lazy mode): scales are Python floats, constants baked into each
  graph (faster on Gaudi, but every distinct scale value is its own graph). The
  layer declares them through `graph_constants`, which the fake HPU's graph keys
  and the runner's compile accounting include, so a scale change is a compile there
  as on Gaudi.

`PT_HPU_H2D_TRIVIAL_SCALES_MODE` (with runtime scale patching): 1 drops scales equal
to 1.0 from the fp8 casts (no multiply), 2 also from the GEMM. Which scales were
dropped is structure of the graph, so it is a graph constant too: a scale moving to
or from 1.0 recompiles, as Gaudi documents.
"""
from __future__ import annotations

import glob
import logging
import re
from typing import Any, Optional

import torch
from torch import nn

from vllm import envs
from vllm.model_executor.layers.quantization.base_config import (LinearMethodBase,
                                                                 QuantizationConfig,
                                                                 checkpoint_names, make_param)
from vllm.model_executor.layers.quantization.fp8_utils import (fp8_linear,
                                                               scaled_fp8)
from vllm.model_executor.layers.quantization.inc_config import IncJsonConfig, load_inc_json
from vllm.model_executor.layers.quantization.inc_scales import compute_scale
from vllm.model_executor.layers.quantization.inc_stats import (MaxAbsRecorder, read_stats,
                                                               write_stats)

logger = logging.getLogger(__name__)

_WEIGHT_MISMATCH = 0.01
"""Relative difference between the measured and the loaded weight max-abs beyond which
the statistics are taken to come from another model (bf16 vs fp32 rounding is 0.4%)."""


def _on_hpu() -> bool:
    from vllm.platforms import current_platform
    return current_platform.is_hpu()


def resolve_runtime_scale_patching(on_hpu: bool, scale_method: str) -> bool:
    """RUNTIME_SCALE_PATCHING, defaulted by execution mode; checked against the method."""
    explicit = envs.RUNTIME_SCALE_PATCHING
    trivial = envs.PT_HPU_H2D_TRIVIAL_SCALES_MODE
    if trivial not in (0, 1, 2):
        raise ValueError(f"PT_HPU_H2D_TRIVIAL_SCALES_MODE={trivial} is not supported; "
                         "supported: 0, 1, 2.")
    if not on_hpu:
        if explicit is False or trivial:
            raise ValueError("RUNTIME_SCALE_PATCHING=0 and PT_HPU_H2D_TRIVIAL_SCALES_MODE "
                             "apply to the HPU only (off it scales are always tensors); "
                             "unset them.")
        return True
    from vllm.platforms import current_platform
    rsp = (not current_platform.lazy_graph_mode()) if explicit is None else explicit
    if rsp and scale_method == "maxabs_arbitrary":
        raise ValueError("RUNTIME_SCALE_PATCHING=1 needs a hardware-aligned scale_method "
                         "(maxabs_hw, maxabs_pow2, unit_scale); QUANT_CONFIG has "
                         "scale_method='maxabs_arbitrary'. Set RUNTIME_SCALE_PATCHING=0 or "
                         "change scale_method.")
    if trivial and not rsp:
        raise ValueError(f"PT_HPU_H2D_TRIVIAL_SCALES_MODE={trivial} acts on runtime-patched "
                         "scales only; set RUNTIME_SCALE_PATCHING=1 or unset it.")
    return rsp


def _matches(flt, prefix: str, layer: nn.Module) -> bool:
    names = [prefix] + checkpoint_names(prefix)
    if any(re.search(p, n) for p in flt.names for n in names):
        return True
    classes = [c.__name__ for c in type(layer).__mro__]
    return any(t in classes or (t == "Linear" and classes[0].endswith("Linear"))
               for t in flt.types)


class IncConfig(QuantizationConfig):
    name = "inc"

    def __init__(self, cfg: IncJsonConfig) -> None:
        self.cfg = cfg
        self.on_hpu = _on_hpu()
        self.runtime_scale_patching = (False if cfg.measure else
                                       resolve_runtime_scale_patching(self.on_hpu,
                                                                      cfg.scale_method))
        self.trivial_mode = envs.PT_HPU_H2D_TRIVIAL_SCALES_MODE if self.on_hpu else 0
        self.recorder = MaxAbsRecorder(record_outputs=cfg.measure_exclude == "NONE")
        self._stats: Optional[dict[str, dict[str, float]]] = None
        self._stats_path: Optional[str] = None
        self.layers: dict[str, nn.Module] = {}
        """Selected layers by module name (filled while the model is built)."""

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "IncConfig":
        if not config.get("_online", False):
            raise ValueError("quant_method 'inc' is not a checkpoint format: start a float "
                             "checkpoint with --quantization inc and QUANT_CONFIG.")
        cfg = load_inc_json(envs.QUANT_CONFIG)
        if not cfg.measure and cfg.scale_method != "unit_scale":
            pattern = f"{cfg.dump_stats_path}_hooks_maxabs*.json"
            if not glob.glob(pattern):
                raise ValueError(f"QUANT_CONFIG {cfg.path}: no INC measurement at "
                                 f"dump_stats_path={cfg.dump_stats_path!r} (looked for "
                                 f"{cfg.stats_file()}); run with mode MEASURE first.")
        return cls(cfg)

    @property
    def measuring(self) -> bool:
        return self.cfg.measure

    def weight_summary(self) -> str:
        if self.cfg.measure:
            return f"inc MEASURE (float weights; statistics to {self._rank_file()})"
        rsp = ("runtime scale patching" if self.runtime_scale_patching else
               "scales baked into graphs")
        return (f"inc fp8 e4m3 ({self.cfg.scale_method}, static per-tensor scales, {rsp})")

    # ------------------------------------------------------------- layers
    def get_quant_method(self, layer: nn.Module, prefix: str) -> Optional[LinearMethodBase]:
        cfg = self.cfg
        if not cfg.allowlist.empty and not _matches(cfg.allowlist, prefix, layer):
            return None
        if _matches(cfg.blocklist, prefix, layer):
            return None
        self.layers[prefix] = layer
        if cfg.measure:
            return IncMeasureLinearMethod(self.recorder, prefix)
        return IncQuantLinearMethod(self, prefix)

    def _rank_file(self) -> str:
        from vllm.distributed import (get_tensor_model_parallel_rank,
                                      get_tensor_model_parallel_world_size)
        return self.cfg.stats_file(get_tensor_model_parallel_rank(),
                                   get_tensor_model_parallel_world_size())

    def stats(self) -> tuple[dict[str, dict[str, float]], str]:
        """This rank's measurement (read once)."""
        if self._stats is None:
            self._stats_path = self._rank_file()
            self._stats = read_stats(self._stats_path)
        return self._stats, self._stats_path

    def input_maxabs(self, prefix: str, stats: dict, path: str) -> float:
        if self.cfg.scale_method == "unit_scale":
            return 1.0
        if prefix not in stats:
            raise ValueError(f"INC measurement {path} has no entry for layer {prefix!r} "
                             "(measured on another model, or with another allowlist / "
                             "blocklist?).")
        return stats[prefix]["input"]

    # ------------------------------------------------------- run-time calls
    def finalize_calibration(self) -> Optional[str]:
        """MEASURE: write the statistics recorded so far; returns the json path."""
        if not self.cfg.measure:
            return None
        path = self._rank_file()
        nodes = self.recorder.nodes()
        if not nodes:
            logger.warning("INC MEASURE: no pass with real tokens ran; %s not written.", path)
            return None
        write_stats(path, nodes)
        return path

    def reload_scales(self, dump_stats_path: Optional[str] = None) -> int:
        """QUANTIZE: new input scales from another measurement (same layers), applied in
        place; returns how many layers changed."""
        if self.cfg.measure:
            raise ValueError("reload_quant_scales needs QUANT_CONFIG mode QUANTIZE.")
        if dump_stats_path is not None:
            self.cfg = IncJsonConfig(**{**self.cfg.__dict__,
                                        "dump_stats_path": dump_stats_path})
        self._stats = None
        stats, path = self.stats()
        updates = [(layer, self.input_maxabs(prefix, stats, path))
                   for prefix, layer in self.layers.items()]  # all checked before any write
        for layer, maxabs in updates:
            layer.quant_method.set_input_scale(layer, maxabs)
        logger.info("INC: input scales of %d layers reloaded from %s.", len(updates), path)
        return len(updates)


class _IncLinearMethod(LinearMethodBase):
    """Both INC runs load the checkpoint's float weight as it is: the measure run keeps
    it, the quantized run converts it to fp8 after loading."""

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       params_dtype) -> None:
        layer.weight = make_param((sum(output_partition_sizes), input_size_per_partition),
                                  params_dtype, 0, 1, layer.weight_loader)


class IncMeasureLinearMethod(_IncLinearMethod):
    """Float linear layer that feeds the max-abs recorder."""

    def __init__(self, recorder: MaxAbsRecorder, name: str) -> None:
        self.recorder = recorder
        self.name = name

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        self.recorder.set_weight(self.name, layer.weight.data)

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        from vllm.model_executor.kernels import linear
        out = linear(layer, x, layer.weight, bias)
        self.recorder.record(self.name, x, out)
        return out


class IncQuantLinearMethod(_IncLinearMethod):
    """fp8 weight [N, K] with one weight scale, static input scale.

    Layer state after loading: `weight` (fp8), buffers `inc_input_scale`,
    `inc_input_scale_inv`, `inc_weight_scale` (float32 [1]) and `inc_consts`, the
    Python-float copies (s_in, 1/s_in, s_w) that RUNTIME_SCALE_PATCHING=0 bakes in.
    """

    def __init__(self, config: IncConfig, name: str) -> None:
        self.config = config
        self.name = name
        from vllm.model_executor.kernels import kernel
        self.backend_linear = kernel("inc_fp8_linear")

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        cfg = self.config.cfg
        w = layer.weight.data
        w_maxabs = float(w.abs().amax().float())
        maxabs_in = 1.0
        if cfg.scale_method != "unit_scale":
            stats, path = self.config.stats()
            maxabs_in = self.config.input_maxabs(self.name, stats, path)
            measured = stats[self.name].get("weight")
            if measured is not None and abs(measured - w_maxabs) > _WEIGHT_MISMATCH * max(
                    w_maxabs, 1e-12):
                raise ValueError(f"INC measurement {path}: layer {self.name!r} was measured "
                                 f"with weight max-abs {measured:.6g}, this checkpoint's is "
                                 f"{w_maxabs:.6g}: the statistics belong to another model.")
        s_w = compute_scale(w_maxabs, cfg.scale_method, cfg.weight_backoff,
                            cfg.device_for_scales)
        q = scaled_fp8(w, torch.tensor(s_w, dtype=torch.float32, device=w.device))
        layer.weight = nn.Parameter(q, requires_grad=False)
        for name in ("inc_input_scale", "inc_input_scale_inv", "inc_weight_scale"):
            layer.register_buffer(name, torch.ones(1, dtype=torch.float32, device=w.device))
        layer.inc_weight_scale.fill_(s_w)
        layer.inc_consts = (1.0, 1.0, s_w)
        self.set_input_scale(layer, maxabs_in)

    def set_input_scale(self, layer: nn.Module, maxabs: float) -> None:
        """Input scale from a measured max-abs, written in place (graphs keep reading
        the same buffers)."""
        cfg = self.config.cfg
        s_in = compute_scale(maxabs, cfg.scale_method, cfg.input_backoff,
                             cfg.device_for_scales)
        layer.inc_input_scale.fill_(s_in)
        layer.inc_input_scale_inv.fill_(1.0 / s_in)
        layer.inc_consts = (s_in, 1.0 / s_in, layer.inc_consts[2])

    def dropped_scales(self, layer: nn.Module) -> tuple[bool, bool, bool]:
        """(cast scale, gemm input scale, gemm weight scale) left out as trivial."""
        mode = self.config.trivial_mode
        s_in, _, s_w = layer.inc_consts
        return (mode >= 1 and s_in == 1.0, mode >= 2 and s_in == 1.0,
                mode >= 2 and s_w == 1.0)

    def graph_constants(self, layer: nn.Module) -> tuple:
        """What a graph of this layer bakes in (see the module docstring)."""
        if self.config.runtime_scale_patching:
            return self.dropped_scales(layer) if self.config.trivial_mode else ()
        return layer.inc_consts

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        # Gaudi's form (vllm/hpu/ops.py: the scales as tensors or baked-in constants,
        # trivial ones dropped); elsewhere the generic fp8 path.
        out = self.backend_linear(self, layer, x, bias) if self.config.on_hpu else None
        if out is None:
            out = fp8_linear(x, layer.weight, layer.inc_weight_scale, layer.inc_input_scale,
                             bias)
        return out

    def scales(self, layer: nn.Module) -> tuple:
        """(s_in, 1/s_in, s_w): the layer's buffers with runtime scale patching, else
        the Python floats a graph bakes in."""
        if self.config.runtime_scale_patching:
            return (layer.inc_input_scale, layer.inc_input_scale_inv, layer.inc_weight_scale)
        return layer.inc_consts
