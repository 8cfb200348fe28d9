"""Metrics of the offline `LLM` (`LLM(..., disable_log_stats=False)`, then
`LLM.get_metrics()`): the server's Prometheus metrics (vllm/engine/metrics.py), fed from
the offline loop.

The tracker counts DELTA outputs (new tokens of one step); offline outputs are
cumulative, so each step's outputs are turned into their deltas first.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Iterable

from vllm.engine.metrics import StatsTracker
from vllm.metrics.reader import Metric, get_metrics_snapshot
from vllm.outputs import RequestOutput


class OfflineStats:

    def __init__(self, model_config: Any, cache_config: Any = None,
                 speculative_config: Any = None) -> None:
        self.tracker = StatsTracker(model_config.served_model_name[0],
                                    model_config.max_model_len, log_stats=False,
                                    cache_config=cache_config,
                                    num_spec_tokens=(speculative_config.num_speculative_tokens
                                                     if speculative_config else 0))
        self._seen: dict[str, dict[int, int]] = {}
        """Request id -> tokens already counted per completion index."""

    def on_request_added(self, request_id: str, params: Any, queued: list[Any]) -> None:
        self.tracker.on_request_added(request_id, params,
                                      queued[0].max_tokens if queued else None)

    def on_step(self, outputs: Iterable[Any], scheduler_stats: Any) -> None:
        self.tracker.on_step([self._delta(o) for o in outputs])
        self.tracker.on_scheduler_stats(scheduler_stats)

    def snapshot(self) -> list[Metric]:
        return get_metrics_snapshot(self.tracker.registry)

    def _delta(self, output: Any) -> Any:
        if not isinstance(output, RequestOutput):
            return output  # a pooling output: one, final
        seen = self._seen.setdefault(output.request_id, {})
        completions = []
        for c in output.outputs:
            done = seen.get(c.index, 0)
            completions.append(SimpleNamespace(index=c.index, token_ids=c.token_ids[done:],
                                               finish_reason=c.finish_reason))
            seen[c.index] = len(c.token_ids)
        if output.finished:
            self._seen.pop(output.request_id, None)
        return SimpleNamespace(request_id=output.request_id,
                               prompt_token_ids=output.prompt_token_ids,
                               num_cached_tokens=output.num_cached_tokens,
                               outputs=completions, finished=output.finished,
                               metrics=output.metrics)
