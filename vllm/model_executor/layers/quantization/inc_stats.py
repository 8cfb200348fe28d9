"""INC's measurement: per-module max-abs statistics, recorded and saved in INC's layout.

The file (`<dump_stats_path>_hooks_maxabs.json`, and the same numbers in a `.npz`
beside it) holds one entry per measured module under "Nodes", keyed by the module
name (this engine's fused names, e.g. `model.layers.0.self_attn.qkv_proj`, as
vLLM-Gaudi's files):

    {"GlobalRank": null, "LocalRank": null, "Mode": "DynamicRange",
     "Nodes": {"<module>": {"inputs": [[maxabs]], "outputs": [[maxabs]],
                            "params": {"weight": [[maxabs]]}}}}

`outputs` is present only with `measure_exclude: NONE` (INC's default excludes
them). The npz holds float32 arrays named `<module>/inputs/0`, `<module>/outputs/0`
and `<module>/params/weight`.

Recording: the linear layers of a MEASURE run fold the max-abs of every input into
a running maximum (a tensor op, no host sync), but only while the runner has armed
the recorder for a real pass, with a mask of the rows that hold real tokens: warmup,
profiling and bucket padding rows never reach the statistics.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Iterator, Optional

import numpy as np
import torch

logger = logging.getLogger(__name__)


class MaxAbsRecorder:
    """Running max-abs of each measured module's input, output and weight."""

    def __init__(self, record_outputs: bool) -> None:
        self.record_outputs = record_outputs
        self.inputs: dict[str, torch.Tensor] = {}
        self.outputs: dict[str, torch.Tensor] = {}
        self.weights: dict[str, float] = {}
        self.armed = False
        self.valid_rows: Optional[torch.Tensor] = None
        self.passes = 0

    @contextlib.contextmanager
    def recording(self, valid_rows: Optional[torch.Tensor]) -> Iterator[None]:
        """Record the passes of the block; `valid_rows` ([rows] bool) marks real tokens
        (None: every row is real)."""
        self.armed, self.valid_rows = True, valid_rows
        try:
            yield
        finally:
            self.armed, self.valid_rows = False, None
            self.passes += 1

    def _maxabs(self, t: torch.Tensor) -> torch.Tensor:
        t2 = t.reshape(-1, t.shape[-1]).abs().float()
        mask = self.valid_rows
        if mask is not None and mask.shape[0] == t2.shape[0]:
            t2 = torch.where(mask.unsqueeze(1), t2, torch.zeros((), dtype=t2.dtype))
        return t2.amax() if t2.numel() else torch.zeros((), dtype=torch.float32)

    @staticmethod
    def _fold(store: dict[str, torch.Tensor], name: str, value: torch.Tensor) -> None:
        old = store.get(name)
        store[name] = value if old is None else torch.maximum(old, value)

    def record(self, name: str, x: torch.Tensor, out: torch.Tensor) -> None:
        if not self.armed:
            return
        self._fold(self.inputs, name, self._maxabs(x))
        if self.record_outputs:
            self._fold(self.outputs, name, self._maxabs(out))

    def set_weight(self, name: str, weight: torch.Tensor) -> None:
        self.weights[name] = float(weight.abs().amax().float()) if weight.numel() else 0.0

    def nodes(self) -> dict[str, dict]:
        """INC's "Nodes" object (modules never run with a real token are left out)."""
        nodes = {}
        for name in sorted(self.weights):
            if name not in self.inputs:
                continue
            node: dict = {"inputs": [[float(self.inputs[name])]]}
            if self.record_outputs:
                node["outputs"] = [[float(self.outputs[name])]]
            node["params"] = {"weight": [[self.weights[name]]]}
            nodes[name] = node
        return nodes


def write_stats(json_path: str, nodes: dict[str, dict]) -> None:
    """Write INC's json and npz measurement files (the directory is created)."""
    directory = os.path.dirname(os.path.abspath(json_path))
    os.makedirs(directory, exist_ok=True)
    doc = {"GlobalRank": None, "LocalRank": None, "Mode": "DynamicRange", "Nodes": nodes}
    tmp = json_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, json_path)
    arrays = {}
    for name, node in nodes.items():
        for kind in ("inputs", "outputs"):
            for i, value in enumerate(node.get(kind, [])):
                arrays[f"{name}/{kind}/{i}"] = np.asarray(value, dtype=np.float32)
        arrays[f"{name}/params/weight"] = np.asarray(node["params"]["weight"], np.float32)
    np.savez(json_path[:-len(".json")] + ".npz", **arrays)
    logger.info("INC measurement of %d modules written to %s (and .npz).", len(nodes),
                json_path)


def _first(value, json_path: str, name: str, kind: str) -> float:
    """The scalar of an INC entry ([[x]] / [x] / x)."""
    while isinstance(value, list) and value:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"INC measurement {json_path}: Nodes[{name!r}].{kind} is not a "
                         f"non-negative number: {value!r}.")
    return float(value)


def read_stats(json_path: str) -> dict[str, dict[str, float]]:
    """{module: {"input": maxabs, "weight": maxabs (if present)}} from INC's json."""
    if not os.path.isfile(json_path):
        raise ValueError(f"INC measurement file {json_path} (from QUANT_CONFIG's "
                         "dump_stats_path) does not exist: run with mode MEASURE first.")
    try:
        with open(json_path, encoding="utf-8") as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"INC measurement {json_path}: not valid json: {e}") from e
    nodes = doc.get("Nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, dict):
        raise ValueError(f"INC measurement {json_path}: no 'Nodes' object.")
    stats = {}
    for name, node in nodes.items():
        if not isinstance(node, dict) or "inputs" not in node:
            raise ValueError(f"INC measurement {json_path}: Nodes[{name!r}] has no 'inputs'.")
        entry = {"input": _first(node["inputs"], json_path, name, "inputs")}
        weight = (node.get("params") or {}).get("weight")
        if weight is not None:
            entry["weight"] = _first(weight, json_path, name, "params.weight")
        stats[name] = entry
    return stats
