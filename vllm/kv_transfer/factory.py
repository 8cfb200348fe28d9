"""Connector names -> their scheduler and worker halves.

The halves are imported by module path only when an engine asks for them, so the
scheduler never imports a worker half (tensors, sockets) and a connector's optional
dependencies are needed only where it runs.
"""
from __future__ import annotations

import enum
import importlib
from dataclasses import dataclass
from typing import Any


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    """The engine core's half: which tokens come from elsewhere, what to save."""
    WORKER = 1
    """A model runner's half: moves KV between its cache and the transfer medium."""


@dataclass(frozen=True)
class _Entry:
    scheduler: str
    """module:Class of the scheduler half."""
    worker: str
    """module:Class of the worker half."""
    required: tuple[str, ...] = ()
    """kv_connector_extra_config keys it needs."""
    optional: tuple[str, ...] = ()
    """kv_connector_extra_config keys it also reads."""


_EXAMPLE = _Entry("vllm.kv_transfer.example_connector:ExampleConnectorScheduler",
                  "vllm.kv_transfer.example_connector_worker:ExampleConnectorWorker",
                  required=("shared_storage_path",))
_CONNECTORS: dict[str, _Entry] = {
    "ExampleConnector": _EXAMPLE,
    "SharedStorageConnector": _EXAMPLE,  # vLLM's earlier name for the same connector
    "P2pZmqConnector": _Entry("vllm.kv_transfer.p2p_zmq_connector:P2pZmqConnectorScheduler",
                              "vllm.kv_transfer.p2p_zmq_worker:P2pZmqConnectorWorker",
                              optional=("timeout_s", "ttl_s")),
    "OffloadingConnector": _Entry(
        "vllm.kv_transfer.offloading_connector:OffloadingConnectorScheduler",
        "vllm.kv_transfer.offloading_worker:OffloadingConnectorWorker",
        required=("cpu_bytes_to_use",)),
}


class KVConnectorFactory:

    @staticmethod
    def names() -> list[str]:
        return list(_CONNECTORS)

    @staticmethod
    def check_name(name: str) -> None:
        if name not in _CONNECTORS:
            raise ValueError(f"kv_transfer_config.kv_connector={name!r} is not supported; "
                             f"choose one of {', '.join(_CONNECTORS)}.")

    @staticmethod
    def check_extra_config(config: Any) -> None:
        entry = _CONNECTORS[config.kv_connector]
        extra = config.kv_connector_extra_config
        for key in entry.required:
            if not extra.get(key):
                raise ValueError(f"kv_transfer_config.kv_connector_extra_config.{key} is "
                                 f"required by {config.kv_connector}.")
        unknown = sorted(set(extra) - set(entry.required) - set(entry.optional))
        if unknown:
            raise ValueError(f"kv_transfer_config.kv_connector_extra_config: unknown key(s) "
                             f"{unknown} for {config.kv_connector}; known: "
                             f"{sorted(entry.required + entry.optional)}.")

    @staticmethod
    def create_connector(vllm_config: Any, role: KVConnectorRole) -> Any:
        """The `role` half of the configured connector, built on `vllm_config`."""
        config = vllm_config.kv_transfer_config
        entry = _CONNECTORS[config.kv_connector]
        path = entry.scheduler if role == KVConnectorRole.SCHEDULER else entry.worker
        module, _, cls = path.partition(":")
        return getattr(importlib.import_module(module), cls)(vllm_config)
