"""A request's `kv_transfer_params`: where vLLM keeps them, and their check at entry."""
from __future__ import annotations

from typing import Any, Optional

REMOTE_KEYS = ("remote_host", "remote_port", "remote_request_id")
"""What a decode instance needs to pull a prompt's KV (the prefill instance's output
kv_transfer_params carry them)."""


def kv_transfer_params_of(sampling_params: Any) -> Optional[dict[str, Any]]:
    """A request's `kv_transfer_params` (vLLM keeps them in SamplingParams.extra_args)."""
    extra = getattr(sampling_params, "extra_args", None) or {}
    params = extra.get("kv_transfer_params")
    return params if isinstance(params, dict) else None


def check_kv_transfer_params(sampling_params: Any, kv_transfer_config: Any) -> None:
    """ValueError naming `kv_transfer_params` when a request's cannot be honoured: the
    engine has no connector, or a remote prefill lacks the producer's address."""
    extra = getattr(sampling_params, "extra_args", None) or {}
    params = extra.get("kv_transfer_params")
    if params is None:
        return
    if not isinstance(params, dict):
        raise ValueError("kv_transfer_params must be a JSON object.")
    if kv_transfer_config is None:
        raise ValueError("kv_transfer_params: this engine has no KV connector; start it "
                         "with --kv-transfer-config (LLM(kv_transfer_config=...)).")
    if params.get("do_remote_prefill"):
        if not kv_transfer_config.is_kv_consumer:
            raise ValueError("kv_transfer_params.do_remote_prefill: this engine's kv_role "
                             f"is {kv_transfer_config.kv_role}; loading KV needs kv_consumer "
                             "or kv_both.")
        missing = [k for k in REMOTE_KEYS if params.get(k) is None]
        if kv_transfer_config.kv_connector == "P2pZmqConnector" and missing:
            raise ValueError(f"kv_transfer_params: do_remote_prefill needs {missing} (copy "
                             "the prefill instance's output kv_transfer_params).")
    if params.get("do_remote_decode") and not kv_transfer_config.is_kv_producer:
        raise ValueError("kv_transfer_params.do_remote_decode: this engine's kv_role is "
                         f"{kv_transfer_config.kv_role}; saving KV needs kv_producer or "
                         "kv_both.")
