"""Traffic traces for the bucket planner: the shapes of the passes a server ran.

A trace is JSON lines: a header with the engine limits (and, from a server, what
decides its buckets: whether prompts have context, its KV blocks, and the buckets it
warmed), then one line per decode
pass and per set of prompts, `{"phase": "prompt"|"decode", "batch_size", "query_len",
"num_blocks", "real_tokens"}` with the shape the runner asked a bucket for (before
padding) and, for prompts, the real token slots (query plus context of every
sequence). The HPU runner writes one when `VLLM_BUCKET_TRACE=path` is set.

Since version 2 a prompt line is the prompts of one step's dependency level before
the runner splits them into passes (`prompt_grouping.py`), with every prompt's
`query_lens` and `ctx_blocks`; the planner replays the split against the buckets it
evaluates. A prompt line without them (version 1) is one pass as it ran and is
replayed as it is.

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
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Callable, Optional, Union

from vllm.hpu.bucketing import Bucket

logger = logging.getLogger(__name__)

TRACE_FORMAT = "vllm-hpu-bucket-trace"
TRACE_VERSION = 2
CHARS_PER_TOKEN = 4
"""ShareGPT text without a tokenizer: the usual ~4 characters per token of English."""


@dataclass(frozen=True)
class EngineLimits:
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    max_num_prefill_seqs: Optional[int] = None
    use_prompt_context: bool = False
    """Prompts can have context blocks (prefix-cache hits, later chunks): the server's
    prompt buckets then have a context dimension, and so must a plan's."""
    num_kv_blocks: Optional[int] = None
    """The traced server's KV blocks (its decode buckets stop there); None: unknown."""
    strategy: str = ""
    prompt_pass_overhead: Optional[int] = None
    """The per-pass cost the traced server split prompts with (None: the default)."""
    prompt_buckets: tuple[Bucket, ...] = field(default=(), repr=False)
    decode_buckets: tuple[Bucket, ...] = field(default=(), repr=False)
    """The buckets the traced server ran with (`strategy`'s, after its warmup): the
    planner replays the trace against exactly these. Empty: not recorded (a
    simulated trace, or an older one)."""

    def __post_init__(self) -> None:
        for name in ("prompt_buckets", "decode_buckets"):
            object.__setattr__(self, name, tuple(Bucket(*map(int, b))
                                                 for b in getattr(self, name)))

    @property
    def prefill_seqs(self) -> int:
        return self.max_num_prefill_seqs or min(self.max_num_seqs, 64)

    @property
    def max_ctx_blocks(self) -> int:
        """Most context blocks a prompt can have (one new token follows them)."""
        return -(-(self.max_model_len - 1) // self.block_size) if self.use_prompt_context \
            else 0


@dataclass(frozen=True)
class TracePass:
    phase: str
    batch_size: int
    query_len: int
    num_blocks: int
    real_tokens: int = 0
    """Prompt: sum of query + context tokens of the sequences (decode: unused)."""
    query_lens: tuple[int, ...] = ()
    ctx_blocks: tuple[int, ...] = ()
    """Prompt sets (version 2): each prompt's query length and context blocks; empty
    for a pass recorded as it ran (version 1) and for decodes."""

    def __post_init__(self) -> None:
        if self.phase not in ("prompt", "decode"):
            raise ValueError(f"trace pass phase must be 'prompt' or 'decode', got "
                             f"{self.phase!r}.")
        if self.batch_size < 1 or self.query_len < 1 or self.num_blocks < 0:
            raise ValueError(f"invalid trace pass shape {asdict(self)}.")
        object.__setattr__(self, "query_lens", tuple(int(q) for q in self.query_lens))
        object.__setattr__(self, "ctx_blocks", tuple(int(c) for c in self.ctx_blocks))
        if self.query_lens and (
                self.phase != "prompt" or len(self.ctx_blocks) != len(self.query_lens)
                or len(self.query_lens) != self.batch_size
                or max(self.query_lens) != self.query_len or min(self.query_lens) < 1
                or max(self.ctx_blocks) != self.num_blocks or min(self.ctx_blocks) < 0):
            raise ValueError(f"trace prompt set {asdict(self)}: query_lens and ctx_blocks "
                             "must be one per prompt, agreeing with batch_size, query_len "
                             "and num_blocks.")

    @classmethod
    def prompt_set(cls, query_lens: list[int], ctx_blocks: list[int],
                   block_size: int) -> "TracePass":
        """The prompts of one step's dependency level, before they are split."""
        return cls("prompt", len(query_lens), max(query_lens), max(ctx_blocks),
                   sum(q + c * block_size for q, c in zip(query_lens, ctx_blocks)),
                   tuple(query_lens), tuple(ctx_blocks))

    @property
    def is_prompt_set(self) -> bool:
        return bool(self.query_lens)


class TraceRecorder:
    """Appends the runner's passes to a trace file (header first).

    `limits` may be a function: the header is then written at the first pass, when
    the server's buckets are all known (the decode buckets wait for the KV cache's
    size, the warmup may drop cold ones)."""

    def __init__(self, path: str,
                 limits: Union[EngineLimits, Callable[[], EngineLimits]]) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._limits = limits
        self._file: IO[str] = open(path, "w", encoding="utf-8")
        self._header_written = False
        logger.info("Recording the bucket trace to %s.", path)

    def _write_header(self) -> None:
        if self._header_written:
            return
        self._header_written = True
        limits = self._limits() if callable(self._limits) else self._limits
        header = {k: v for k, v in asdict(limits).items() if v not in ((), None, "")}
        self._file.write(json.dumps({"format": TRACE_FORMAT, "version": TRACE_VERSION,
                                     **header}) + "\n")

    def record(self, p: TracePass) -> None:
        with self._lock:
            if not self._file.closed:
                self._write_header()
                line = {k: v for k, v in asdict(p).items() if v != ()}
                self._file.write(json.dumps(line) + "\n")
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._write_header()
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
            passes.append(TracePass.prompt_set(admitted, [0] * len(admitted), bs))
    return passes
