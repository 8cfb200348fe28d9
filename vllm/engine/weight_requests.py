"""The payload of vLLM's weight-transfer requests, whichever form the caller used.

`LLM.update_weights(WeightTransferUpdateRequest(update_info=...))`,
`LLM.update_weights({"update_info": ...})` and the server's JSON body all carry one
dict for the workers; this is the one place that unwraps them.
"""
from __future__ import annotations

from typing import Any


def request_info(request: Any, key: str) -> dict:
    """`request[key]` of a dict, or `request.<key>` of a request object; ValueError
    naming the key otherwise."""
    info = request.get(key) if isinstance(request, dict) else getattr(request, key, None)
    if not isinstance(info, dict):
        raise ValueError(f"Expected a request with {key!r}: a dict such as {{{key!r}: "
                         f"{{...}}}} or a WeightTransfer*Request, got {request!r:.200}.")
    return info
