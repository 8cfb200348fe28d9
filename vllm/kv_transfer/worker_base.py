"""The worker half of a KV connector (vLLM's KVConnectorBase_V1, worker role).

The model runner calls, each step that has connector metadata:

1. `bind_connector_metadata(meta)`, then `start_load_kv()`: fetch the KV of the step's
   loads from the transfer medium (subclasses' `_fetch`: a file, the network);
2. `wait_for_layer_load(layer_name)` for each layer, in order, before the forward:
   write that layer's fetched KV into the requests' cache slots;
3. after the forward, `save_kv_layer(layer_name, kv_layer, attn_metadata)` for each
   layer: copy the KV of the step's saves (prompts a producer completed) to host
   memory, and `wait_for_save()`: publish it (`_publish`);
4. `get_failed_loads()`: the requests whose load failed (the scheduler ends them).

The runner calls the layer hooks around its forward rather than from inside the
attention layers: on Gaudi the forward is a captured graph, which cannot call out.

A load that fails (peer gone, timeout, missing or mismatching data) fails only its
request, never the step: the other requests of the batch go on.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

import torch

from vllm.kv_transfer.kv_io import KVLayerView
from vllm.kv_transfer.metadata import KVConnectorMetadata, KVConnectorOutput, ReqMeta

logger = logging.getLogger(__name__)


class KVTransferError(RuntimeError):
    """One request's KV could not be moved."""


class KVConnectorWorkerBase:

    def __init__(self, vllm_config: Any) -> None:
        self.config = vllm_config.kv_transfer_config
        self.block_size = vllm_config.cache_config.block_size
        self.kv_caches: dict[str, KVLayerView] = {}
        self._meta: Optional[KVConnectorMetadata] = None
        self._fetched: dict[str, dict[str, torch.Tensor]] = {}
        """Loads of this step: request -> layer name -> [parts, tokens, heads, dim]."""
        self._staged: dict[str, dict[str, torch.Tensor]] = {}
        """Saves of this step: request -> layer name -> host copy of its prompt's KV."""
        self._failed: set[str] = set()

    def register_kv_caches(self, kv_caches: dict[str, KVLayerView]) -> None:
        """The layers this rank holds, by name, in forward order."""
        self.kv_caches = dict(kv_caches)

    # ------------------------------------------------------------ metadata
    def bind_connector_metadata(self, meta: KVConnectorMetadata) -> None:
        self._meta = meta

    def clear_connector_metadata(self) -> None:
        self._meta = None
        self._fetched.clear()
        self._staged.clear()

    # ---------------------------------------------------------------- loads
    def start_load_kv(self, forward_context: Any = None) -> None:
        for load in self._meta.loads:
            try:
                layers = self._fetch(load)
                self._check_layers(load, layers)
            except Exception as e:  # noqa: BLE001 - one request's transfer, not the step
                logger.error("KV load of request %s (%d tokens from %s) failed: %s",
                             load.req_id, load.end - load.start, load.key, e)
                self._failed.add(load.req_id)
                continue
            self._fetched[load.req_id] = layers

    def _check_layers(self, load: ReqMeta, layers: dict[str, torch.Tensor]) -> None:
        for name, view in self.kv_caches.items():
            data = layers.get(name)
            want = view.shape_of(load.end - load.start)
            if data is None or tuple(data.shape) != want:
                raise KVTransferError(
                    f"layer {name}: got {None if data is None else tuple(data.shape)}, "
                    f"expected {want} (do both instances run the same model and "
                    "parallel layout?)")

    def wait_for_layer_load(self, layer_name: str) -> None:
        view = self.kv_caches[layer_name]
        for load in self._meta.loads:
            layers = self._fetched.get(load.req_id)
            if layers is not None:
                view.write(load.slot_ids(self.block_size), layers.pop(layer_name))

    def get_failed_loads(self) -> set[str]:
        failed, self._failed = self._failed, set()
        return failed

    # ---------------------------------------------------------------- saves
    def save_kv_layer(self, layer_name: str, kv_layer: KVLayerView,
                      attn_metadata: Any = None) -> None:
        for save in self._meta.saves:
            self._staged.setdefault(save.req_id, {})[layer_name] = kv_layer.read(
                save.slot_ids(self.block_size))

    def wait_for_save(self) -> None:
        for save in self._meta.saves:
            layers = self._staged.pop(save.req_id, {})
            try:
                self._publish(save, layers)
            except Exception as e:  # noqa: BLE001 - the request still completes here
                logger.error("Saving the KV of request %s failed: %s", save.req_id, e)

    # ------------------------------------------------------------- outputs
    def connector_output(self) -> Optional[KVConnectorOutput]:
        failed = self.get_failed_loads()
        return KVConnectorOutput(failed_recving=failed) if failed else None

    def shutdown(self) -> None:
        """Release sockets, threads, buffers."""

    # ----------------------------------------------------------- subclasses
    def _fetch(self, load: ReqMeta) -> dict[str, torch.Tensor]:
        """Layer name -> [parts, load.end - load.start, heads, dim] KV of the load."""
        raise NotImplementedError

    def _publish(self, save: ReqMeta, layers: dict[str, torch.Tensor]) -> None:
        """Make a saved prompt's KV (layer name -> [parts, save.end, heads, dim])
        available to consumers."""
        raise NotImplementedError
