"""`stream_interval`: batch a stream's DELTA outputs so each chunk carries at least that
many new tokens (fewer SSE events per request). The first output and the final one go
out at once, as in vLLM."""
from __future__ import annotations

from typing import Any, AsyncIterator


async def batch_stream(outputs: Any, interval: int) -> AsyncIterator[Any]:
    """The outputs of `outputs` (an engine iterator of DELTA RequestOutputs), deltas
    merged until `interval` new tokens are pending. Closing this closes `outputs`."""
    pending = None
    first = True
    try:
        async for output in outputs:
            if pending is None:
                pending = output
            else:
                pending.add(output, aggregate=True)
            new_tokens = sum(len(c.token_ids) for c in pending.outputs)
            if first or pending.finished or new_tokens >= interval:
                yield pending
                pending, first = None, False
        if pending is not None:
            yield pending
    finally:
        await outputs.aclose()
