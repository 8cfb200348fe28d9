"""ExampleConnector, worker half: one safetensors file per layer under
`shared_storage_path/<key>/rank<r>/`, written into a temporary directory and renamed
into place, so that a consumer never sees half an entry (`meta.json` says it is
complete)."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from vllm.distributed.parallel_state import get_tp_group
from vllm.kv_transfer.example_connector import META_FILE, entry_dir, read_entry_meta
from vllm.kv_transfer.metadata import ReqMeta
from vllm.kv_transfer.worker_base import KVConnectorWorkerBase, KVTransferError


class ExampleConnectorWorker(KVConnectorWorkerBase):

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        self.root = self.config.get_from_extra_config("shared_storage_path", None)
        self.rank = get_tp_group().rank
        os.makedirs(self.root, exist_ok=True)

    def _fetch(self, load: ReqMeta) -> dict[str, torch.Tensor]:
        meta = read_entry_meta(self.root, load.key, self.rank)
        if meta is None or meta.get("token_hash") != load.token_hash:
            raise KVTransferError(f"no complete entry {load.key} under {self.root}")
        if int(meta["num_tokens"]) < load.end:
            raise KVTransferError(f"entry {load.key} holds {meta['num_tokens']} tokens, "
                                  f"{load.end} needed")
        directory = entry_dir(self.root, load.key, self.rank)
        return {name: load_file(os.path.join(directory, f"{name}.safetensors"))["kv"]
                [:, load.start:load.end] for name in self.kv_caches}

    def _publish(self, save: ReqMeta, layers: dict[str, torch.Tensor]) -> None:
        final = entry_dir(self.root, save.key, self.rank)
        if os.path.isdir(final):
            return  # the same prompt, saved by another request already
        os.makedirs(os.path.dirname(final), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".partial-", dir=os.path.dirname(final))
        try:
            for name, data in layers.items():
                save_file({"kv": data.contiguous()}, os.path.join(tmp, f"{name}.safetensors"))
            with open(os.path.join(tmp, META_FILE), "w") as f:
                json.dump({"num_tokens": save.end, "token_hash": save.token_hash}, f)
            os.rename(tmp, final)
        except OSError:
            if not os.path.isdir(final):
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
