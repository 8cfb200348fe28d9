"""The INC (Intel Neural Compressor) FP8 json config that `QUANT_CONFIG` points at.

The schema is INC's (Gaudi's "Run Inference Using FP8" guide), read the same way
whether or not `neural-compressor` is installed:

| field | values (default) | used for |
|---|---|---|
| mode | MEASURE, QUANTIZE (QUANTIZE) | calibration run / quantized run |
| observer | maxabs (maxabs) | the statistic MEASURE records |
| scale_method | unit_scale, maxabs_arbitrary, maxabs_hw, maxabs_pow2 (unit_scale) | scales from the statistics (inc_scales.py) |
| allowlist / blocklist | {"types": [...], "names": [...]} (empty) | which linear layers are measured and quantized |
| dump_stats_path | path prefix (./stats) | where MEASURE writes and QUANTIZE reads `<prefix>_hooks_maxabs.json` |
| measure_exclude | OUTPUT, NONE (OUTPUT) | OUTPUT: inputs and weights only; NONE: outputs too |
| scale_params | {"input_backoff": 0.25, "weight_backoff": 0.5} | share of the fp8 range a measured max-abs maps to |
| device_for_scales | GAUDI3 (GAUDI3) | the hardware scale set of maxabs_hw |

Every other key INC defines is refused (ValueError naming it) rather than ignored;
unknown keys too. With `neural-compressor` importable the file is first parsed by
INC's own `FP8Config.from_json_file` (so INC's validation runs and a file INC
rejects is rejected here too); the fields above are then read from the json.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

MODES = ("MEASURE", "QUANTIZE")
SCALE_METHODS = ("unit_scale", "maxabs_arbitrary", "maxabs_hw", "maxabs_pow2")
MEASURE_EXCLUDE = ("OUTPUT", "NONE")
DEVICES_FOR_SCALES = ("GAUDI3",)
_KNOWN = {"mode", "observer", "scale_method", "allowlist", "blocklist", "dump_stats_path",
          "measure_exclude", "scale_params", "device_for_scales", "fp8_config", "method",
          "scale_format", "dynamic_quantization", "whitelist", "blacklist"}
"""Keys accepted (fp8_config / method / scale_format / dynamic_quantization only with
the values that describe what this engine does)."""


@dataclass(frozen=True)
class ModuleFilter:
    """INC's allowlist / blocklist: module names (regular expressions searched in the
    module name) and types (class names; "Linear" matches every linear layer)."""
    types: tuple[str, ...] = ()
    names: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.types and not self.names


@dataclass(frozen=True)
class IncJsonConfig:
    path: str
    mode: str = "QUANTIZE"
    observer: str = "maxabs"
    scale_method: str = "unit_scale"
    allowlist: ModuleFilter = field(default_factory=ModuleFilter)
    blocklist: ModuleFilter = field(default_factory=ModuleFilter)
    dump_stats_path: str = "./stats"
    measure_exclude: str = "OUTPUT"
    input_backoff: float = 0.25
    weight_backoff: float = 0.5
    device_for_scales: str = "GAUDI3"

    @property
    def measure(self) -> bool:
        return self.mode == "MEASURE"

    def stats_file(self, rank: int = 0, world_size: int = 1, ext: str = "json") -> str:
        """INC's measurement file name: `<dump_stats_path>_hooks_maxabs[_<rank>_<world>].ext`
        (the rank suffix only when the model is split over several cards)."""
        suffix = "" if world_size <= 1 else f"_{rank}_{world_size}"
        return f"{self.dump_stats_path}_hooks_maxabs{suffix}.{ext}"


def _err(path: str, key: str, value: Any, allowed: Any) -> ValueError:
    return ValueError(f"QUANT_CONFIG {path}: {key}={value!r} is not supported; supported: "
                      f"{allowed}.")


def _choice(raw: dict, path: str, key: str, allowed: tuple[str, ...], default: str,
            upper: bool) -> str:
    value = raw.get(key, default)
    norm = value.upper() if upper and isinstance(value, str) else (
        value.lower() if isinstance(value, str) else value)
    if norm not in allowed:
        raise _err(path, key, value, ", ".join(allowed))
    return norm


def _filter(raw: dict, path: str, key: str) -> ModuleFilter:
    value = raw.get(key, {})
    if not isinstance(value, dict) or set(value) - {"types", "names"}:
        raise ValueError(f"QUANT_CONFIG {path}: {key} must be an object with 'types' and "
                         f"'names' lists, got {value!r}.")
    parts = {}
    for sub in ("types", "names"):
        items = value.get(sub, [])
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ValueError(f"QUANT_CONFIG {path}: {key}.{sub} must be a list of strings, "
                             f"got {items!r}.")
        parts[sub] = tuple(items)
    return ModuleFilter(**parts)


def _backoffs(raw: dict, path: str) -> tuple[float, float]:
    params = raw.get("scale_params", {})
    if not isinstance(params, dict) or set(params) - {"input_backoff", "weight_backoff"}:
        raise ValueError(f"QUANT_CONFIG {path}: scale_params may hold input_backoff and "
                         f"weight_backoff only, got {params!r}.")
    out = []
    for key, default in (("input_backoff", 0.25), ("weight_backoff", 0.5)):
        value = params.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise ValueError(f"QUANT_CONFIG {path}: scale_params.{key}={value!r} must be a "
                             "number in (0, 1].")
        out.append(float(value))
    return out[0], out[1]


def _refuse_unsupported(raw: dict, path: str) -> None:
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise ValueError(f"QUANT_CONFIG {path}: unknown or unsupported field(s) "
                         f"{', '.join(unknown)}; supported: {', '.join(sorted(_KNOWN))}.")
    if "whitelist" in raw or "blacklist" in raw:
        raise ValueError(f"QUANT_CONFIG {path}: whitelist/blacklist were renamed allowlist/"
                         "blocklist in INC; use those.")
    if raw.get("observer", "maxabs") != "maxabs":
        raise _err(path, "observer", raw["observer"], "maxabs")
    if raw.get("dynamic_quantization", False) not in (False, "false", "False"):
        raise _err(path, "dynamic_quantization", raw["dynamic_quantization"],
                   "false (static scales from the measurement)")
    fmt = raw.get("scale_format", "scalar")
    if not isinstance(fmt, str) or fmt.lower() not in ("scalar", "const"):
        raise _err(path, "scale_format", fmt, "scalar, const")
    for key, want in (("fp8_config", "E4M3"), ("method", "HOOKS")):
        if key in raw and str(raw[key]).upper() != want:
            raise _err(path, key, raw[key], want)


def _validate_with_inc(path: str) -> None:
    """Let neural-compressor parse the file when it is installed (it is on Gaudi images)."""
    try:
        from neural_compressor.torch.quantization import FP8Config  # type: ignore
    except ImportError:
        return
    try:
        FP8Config.from_json_file(path)
    except Exception as e:  # INC raises assorted types for a bad file
        raise ValueError(f"QUANT_CONFIG {path}: neural-compressor rejected the file: {e}"
                         ) from e
    logger.info("QUANT_CONFIG %s parsed by neural-compressor's FP8Config.", path)


def load_inc_json(path: str) -> IncJsonConfig:
    """Parse and validate the file at `path`; ValueError naming the field and the path."""
    if not path:
        raise ValueError("quantization='inc' needs QUANT_CONFIG=<path to INC's json config> "
                         "(mode MEASURE or QUANTIZE); QUANT_CONFIG is not set.")
    if not os.path.isfile(path):
        raise ValueError(f"QUANT_CONFIG={path!r}: no such file.")
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"QUANT_CONFIG {path}: not valid json: {e}") from e
    if not isinstance(raw, dict):
        raise ValueError(f"QUANT_CONFIG {path}: the top level must be an object.")
    _refuse_unsupported(raw, path)
    _validate_with_inc(path)
    dump = raw.get("dump_stats_path", "./stats")
    if not isinstance(dump, str) or not dump or dump.endswith(("/", os.sep)):
        raise ValueError(f"QUANT_CONFIG {path}: dump_stats_path={dump!r} must be a path "
                         "prefix such as ./inc_output/measure (a directory plus a file prefix).")
    input_backoff, weight_backoff = _backoffs(raw, path)
    return IncJsonConfig(
        path=path,
        mode=_choice(raw, path, "mode", MODES, "QUANTIZE", upper=True),
        scale_method=_choice(raw, path, "scale_method", SCALE_METHODS, "unit_scale",
                             upper=False),
        allowlist=_filter(raw, path, "allowlist"), blocklist=_filter(raw, path, "blocklist"),
        dump_stats_path=dump,
        measure_exclude=_choice(raw, path, "measure_exclude", MEASURE_EXCLUDE, "OUTPUT",
                                upper=True),
        input_backoff=input_backoff, weight_backoff=weight_backoff,
        device_for_scales=_choice(raw, path, "device_for_scales", DEVICES_FOR_SCALES,
                                  "GAUDI3", upper=True))
