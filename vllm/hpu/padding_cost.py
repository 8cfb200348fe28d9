"""The cost model of bucket padding: what one pass computes, padded and real.

One definition serves the bucket planner (which minimises it over a trace), the
runner's padding metrics (which measure it per pass) and the benchmarks, so the
planner's predicted waste and the server's measured waste are the same quantity.

- prompt pass of bucket (B, Q, C): `B * (Q + C * block_size)` token slots, each
  one row through every layer (attention over the context counted as tokens read).
  The real pass: the sum over its sequences of `query_len + context_blocks * block`.
- decode pass of bucket (B, 1, N): `B * row_weight + N * block_size`: B rows through
  the layers and N blocks of KV read by attention, in units of one KV token read.
  A decode row costs about `2 * params / (4 * layers * hidden)` KV-token reads (about
  1000 to 4000 for 100M to 8B models); `DECODE_ROW_WEIGHT` is that ratio's usual
  size, and the planner takes `--decode-row-weight` for another model. The real
  pass: its rows and the KV blocks it needs.

Padding waste = 1 - real / padded, summed over passes. The runner's split of a step's
prompts into passes (`prompt_grouping.py`) weighs this padded compute against a fixed
cost per pass; that cost is not padding and is not counted here.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

DECODE_ROW_WEIGHT = 1024


def prompt_cost(batch_size: int, query_len: int, ctx_blocks: int, block_size: int) -> int:
    return batch_size * (query_len + ctx_blocks * block_size)


def decode_cost(batch_size: int, num_blocks: int, block_size: int,
                row_weight: int = DECODE_ROW_WEIGHT) -> int:
    return batch_size * row_weight + num_blocks * block_size


def waste(real: float, padded: float) -> float:
    return 1.0 - real / padded if padded else 0.0


@dataclass
class PaddingStats:
    """Padded vs real compute per phase and pass counts per bucket, since warmup.

    The runner adds one record per real pass; `snapshot()` is what the engine's
    utility call returns (plain dicts, so it crosses the engine-core process).
    """
    padded: dict[str, int] = field(default_factory=lambda: {"prompt": 0, "decode": 0})
    real: dict[str, int] = field(default_factory=lambda: {"prompt": 0, "decode": 0})
    passes: dict[str, int] = field(default_factory=lambda: {"prompt": 0, "decode": 0})
    bucket_hits: dict[str, int] = field(default_factory=dict)
    """"phase:bs,query,blocks" -> passes run in that bucket."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, phase: str, bucket: tuple[int, int, int], padded: int, real: int) -> None:
        key = f"{phase}:{bucket[0]},{bucket[1]},{bucket[2]}"
        with self._lock:
            self.padded[phase] += padded
            self.real[phase] += real
            self.passes[phase] += 1
            self.bucket_hits[key] = self.bucket_hits.get(key, 0) + 1

    def snapshot(self) -> dict:
        with self._lock:
            return {"padded_tokens": dict(self.padded), "real_tokens": dict(self.real),
                    "passes": dict(self.passes),
                    "padding_waste": {p: waste(self.real[p], self.padded[p])
                                      for p in self.padded},
                    "bucket_hits": dict(self.bucket_hits)}
