"""ExampleConnector, scheduler half: KV in files under a directory all engines share.

vLLM's example connector, for tests and single hosts (a shared or network file system
would do for several). A producer writes the KV of each prompt it computes to
`shared_storage_path/<key>/rank<r>/` (one directory per worker rank, each holding
its shard), the key naming the prompt's token ids (and model, LoRA adapter); a consumer finds a prompt there by computing the same key, so it needs no
`kv_transfer_params`. Unlike vLLM's, which reuses only whole blocks, it loads every
prompt token but the last (the one the consumer computes for its first logits).
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

from vllm.kv_transfer.metadata import ReqMeta, prompt_digest
from vllm.kv_transfer.scheduler_base import KVConnectorSchedulerBase, lora_salt

META_FILE = "meta.json"
"""Written last into an entry: {"num_tokens": N, "token_hash": ...}."""


def entry_salt(model: str, lora_request: Any = None) -> str:
    """Besides the token ids, an entry is named by the model and the LoRA adapter that
    computed its KV (another model's KV of the same shape must not be taken)."""
    return f"{model}|{lora_salt(lora_request)}"


def entry_key(model: str, prompt_token_ids: list[int], lora_request: Any = None) -> str:
    """The name of a prompt's entry (also its `token_hash`)."""
    return prompt_digest(prompt_token_ids, entry_salt(model, lora_request))


def entry_dir(root: str, key: str, rank: int = 0) -> str:
    """Where worker `rank` keeps its shard (and pipeline stage) of the entry's KV."""
    return os.path.join(root, key, f"rank{rank}")


def read_entry_meta(root: str, key: str, rank: int = 0) -> Optional[dict[str, Any]]:
    """The metadata of a rank's part of the entry, or None when that part is not
    complete (the scheduler asks about rank 0; each worker checks its own)."""
    try:
        with open(os.path.join(entry_dir(root, key, rank), META_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class ExampleConnectorScheduler(KVConnectorSchedulerBase):

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        self.root = self.config.get_from_extra_config("shared_storage_path", None)
        self.model = vllm_config.model_config.model
        os.makedirs(self.root, exist_ok=True)

    def _key(self, prompt_token_ids: list[int], lora_request: Any) -> str:
        return entry_key(self.model, prompt_token_ids, lora_request)

    def _salt(self, lora_request: Any) -> str:
        return entry_salt(self.model, lora_request)

    def _available_tokens(self, request: Any) -> int:
        key = self._key(request.prompt_token_ids, request.lora_request)
        meta = read_entry_meta(self.root, key)
        return int(meta["num_tokens"]) if meta else 0

    def _load_meta(self, request: Any, block_ids: list[int], start: int, end: int
                   ) -> ReqMeta:
        key = self._key(request.prompt_token_ids, request.lora_request)
        return ReqMeta(req_id=request.request_id, block_ids=block_ids, start=start, end=end,
                       key=key, token_hash=key)

    def _save_key(self, new_request: Any) -> Optional[str]:
        key = self._key(new_request.prompt_token_ids, new_request.lora_request)
        if read_entry_meta(self.root, key) is not None:
            return None  # already there (the same prompt saved before)
        return key
