"""Traffic traces for the bucket planner: the shapes of the passes a server ran.

A trace is JSON lines: a header with the engine limits, then one line per bucketed
pass, `{"phase": "prompt"|"decode", "batch_size", "query_len", "num_blocks",
"real_tokens"}` with the shape the runner asked a bucket for (before padding) and,
for prompts, the real token slots (query plus context of every sequence). The HPU
runner writes one when `VLLM_BUCKET_TRACE=path` is set.

A ShareGPT-like JSON file (a list of `{"conversations": [{"from": "human", ...},
{"from": "gpt", ...}]}`) is turned into a trace by `simulate`, a first-come
first-served continuous-batching model of the scheduler: every request waits from
the start, each step runs the decodes of the running requests and admits waiting
prompts whole while the sequence and token budgets allow.
"""
from __future__ import annotations

import json
import logging
import math
import os
import threading
from dataclasses import asdict, dataclass
from typing import IO, Any, Optional

logger = logging.getLogger(__name__)

TRACE_FORMAT = "vllm-hpu-bucket-trace"
CHARS_PER_TOKEN = 4
"""ShareGPT text without a tokenizer: the usual ~4 characters per token of English."""


@dataclass(frozen=True)
class EngineLimits:
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    max_num_prefill_seqs: Optional[int] = None

    @property
    def prefill_seqs(self) -> int:
        return self.max_num_prefill_seqs or min(self.max_num_seqs, 64)


@dataclass(frozen=True)
class TracePass:
    phase: str
    batch_size: int
    query_len: int
    num_blocks: int
    real_tokens: int = 0
    """Prompt: sum of query + context tokens of the sequences (decode: unused)."""

    def __post_init__(self) -> None:
        if self.phase not in ("prompt", "decode"):
            raise ValueError(f"trace pass phase must be 'prompt' or 'decode', got "
                             f"{self.phase!r}.")
        if self.batch_size < 1 or self.query_len < 1 or self.num_blocks < 0:
            raise ValueError(f"invalid trace pass shape {asdict(self)}.")


class TraceRecorder:
    """Appends the runner's passes to a trace file (header first)."""

    def __init__(self, path: str, limits: EngineLimits) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file: IO[str] = open(path, "w", encoding="utf-8")
        self._file.write(json.dumps({"format": TRACE_FORMAT, "version": 1,
                                     **asdict(limits)}) + "\n")
        self._file.flush()
        logger.info("Recording the bucket trace to %s.", path)

    def record(self, p: TracePass) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.write(json.dumps(asdict(p)) + "\n")
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_trace(path: str, limits: Optional[EngineLimits] = None
               ) -> tuple[Optional[EngineLimits], list[TracePass]]:
    """A recorded JSONL trace, or a ShareGPT-like JSON simulated under `limits`."""
    if not os.path.isfile(path):
        raise ValueError(f"--trace {path!r}: file not found.")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    first = text.lstrip()[:1]
    if first == "[":
        if limits is None:
            raise ValueError("a ShareGPT-like trace needs the engine limits (--block-size, "
                             "--max-num-seqs, --max-num-batched-tokens, --max-model-len).")
        return limits, simulate(sharegpt_lengths(json.loads(text)), limits)
    header: Optional[EngineLimits] = None
    passes = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"--trace {path!r} line {n}: not JSON ({e}).") from None
        if obj.get("format") == TRACE_FORMAT:
            header = EngineLimits(**{k: obj[k] for k in EngineLimits.__dataclass_fields__
                                     if k in obj})
        else:
            passes.append(TracePass(**obj))
    if not passes:
        raise ValueError(f"--trace {path!r} holds no passes.")
    return limits or header, passes


def sharegpt_lengths(entries: list[Any]) -> list[tuple[int, int]]:
    """(prompt, reply) token lengths of each entry's first human/gpt exchange."""
    pairs = []
    for entry in entries:
        turns = entry.get("conversations", []) if isinstance(entry, dict) else []
        if len(turns) >= 2:
            prompt, reply = turns[0].get("value", ""), turns[1].get("value", "")
            pairs.append((max(1, math.ceil(len(prompt) / CHARS_PER_TOKEN)),
                          max(1, math.ceil(len(reply) / CHARS_PER_TOKEN))))
    if not pairs:
        raise ValueError("the ShareGPT-like trace has no conversation with two turns.")
    return pairs


def simulate(requests: list[tuple[int, int]], limits: EngineLimits) -> list[TracePass]:
    """The passes a FCFS continuous-batching scheduler runs for these requests."""
    bs = limits.block_size
    waiting = [(min(p, limits.max_model_len - 1, limits.max_num_batched_tokens),
                max(1, o)) for p, o in requests]
    waiting = [(p, min(o, limits.max_model_len - p)) for p, o in waiting]
    waiting.reverse()  # pop() from the end takes the first request
    running: list[list[int]] = []  # [tokens so far, outputs left]
    passes: list[TracePass] = []
    while waiting or running:
        if running:
            passes.append(TracePass("decode", len(running), 1,
                                    sum(t // bs + 1 for t, _ in running)))
            for r in running:
                r[0] += 1
                r[1] -= 1
            running = [r for r in running if r[1] > 0]
        budget = limits.max_num_batched_tokens - len(running)
        admitted: list[int] = []
        while (waiting and len(running) + len(admitted) < limits.max_num_seqs
               and len(admitted) < limits.prefill_seqs and waiting[-1][0] <= budget):
            p, o = waiting.pop()
            budget -= p
            admitted.append(p)
            running.append([p, o - 1]) if o > 1 else None
        if admitted:
            passes.append(TracePass("prompt", len(admitted), max(admitted), 0, sum(admitted)))
    return passes
