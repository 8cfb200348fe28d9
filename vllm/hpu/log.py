"""The HPU log lines Gaudi users' tooling parses, worded as the original HPU backend
words them (one place for every format, tested in tests/hpu/test_log_format.py).

Where this engine knows more than the original lines carry (three-dimensional
buckets, timings), the extra fields go at the END of a line; the documented part is
never renamed or reordered:

In start-up order (the seed's moments: both bucket configs before the memory
profile; the block counts, then the cache engine, after KV sizing and before the
warmup; `init_cache_engine took` after it):

    Prompt bucket config (min, step, max_warmup) bs:[1, 2, 4], seq:[128, 128, 512], blocks:[.]
    Generated 12 prompt buckets: [(1, 128, 0), ...]
    Decode bucket config (min, step, max_warmup) bs:[1, 2, 8], seq:[128, 16384, 16384],
        block:[1, 128, 128]     (one line; the block max before the KV cache is sized)
    Pre-loading model weights on hpu:0 took 515 MiB of device memory (515 MiB/16 GiB used)
        and 1.2 GiB of host memory (9.1 GiB/24 GiB used) in 8.48 s     (one line)
    Wrapping in HPU Graph took 0 B of device memory (515 MiB/16 GiB used) and 2 MiB of
        host memory (9.1 GiB/24 GiB used)     (one line; HPU graph mode)
    Loading model weights took in total 515 MiB of device memory (515 MiB/16 GiB used)
        and 1.2 GiB of host memory (9.1 GiB/24 GiB used) in 8.52 s     (one line)
    Model profiling run took 355 MiB of device memory (870 MiB/16 GiB used) and 34 MiB
        of host memory (9.2 GiB/24 GiB used) at prompt bucket (4, 512, 0)     (one line)
    Free device memory: ... reserved for KV cache     (worker.py)
    # HPU blocks: 63, # CPU blocks: 0 (block size 128, 8064 tokens)   (engine/core.py)
    Initializing cache engine took 7.9 GiB of device memory (8.4 GiB/16 GiB used) and
        1 MiB of host memory (9.1 GiB/24 GiB used)     (one line)
    Generated 21 decode buckets: [(1, 1, 1), ...] (block max 32: the KV cache's blocks)
    [Warmup][Prompt][1/12] batch_size:4 seq_len:512 free_mem:15.3 GiB num_blocks:0
    [Warmup][Decode][1/21] batch_size:8 seq_len:4096 free_mem:15.3 GiB num_blocks:32
    Using 1.4 GiB/14.4 GiB of free device memory for HPUGraphs, 430 MiB for prompt and
        1 GiB for decode (VLLM_GRAPH_PROMPT_RATIO=0.3)     (one line)
    Warmup finished in 49 secs, allocated 1.2 GiB of device memory     (model_runner.py)
    init_cache_engine took 7.9 GiB of device memory (8.4 GiB/16 GiB used) and 2 MiB of
        host memory (9.1 GiB/24 GiB used)     (one line; KV cache and warmup together)

Bucket tuples are (batch_size, seq_len, num_blocks): seq_len is the padded query
length (1 for decode), num_blocks the context blocks per prompt sequence or the KV
blocks of a whole decode batch. Where the seed's lines say `seq` for a decode bucket
(the config's range and the warmup lines' seq_len) they mean the KV tokens it reads,
so here that is num_blocks x block_size (the whole batch's), with the blocks after it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import psutil

logger = logging.getLogger(__name__)


def format_bytes(num: float) -> str:
    """1536 -> '1.5 KiB'; 3 * 2**30 -> '3 GiB'."""
    value = float(num)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.4g} {unit}"
        value /= 1024
    return f"{value:.4g} TiB"


@dataclass(frozen=True)
class MemorySnapshot:
    """Used and total bytes of the device and of the host, at one moment."""
    device_used: int
    device_total: int
    host_used: int
    host_total: int

    @classmethod
    def take(cls) -> "MemorySnapshot":
        from vllm.hpu import habana
        free, total = habana.mem_get_info()
        vm = psutil.virtual_memory()
        return cls(total - free, total, vm.total - vm.available, vm.total)

    def took_since(self, before: "MemorySnapshot") -> str:
        """'X of device memory (used/total used) and Y of host memory (used/total used)'."""
        return (f"{format_bytes(self.device_used - before.device_used)} of device memory "
                f"({format_bytes(self.device_used)}/{format_bytes(self.device_total)} used) "
                f"and {format_bytes(self.host_used - before.host_used)} of host memory "
                f"({format_bytes(self.host_used)}/{format_bytes(self.host_total)} used)")


def _buckets(buckets: Sequence[tuple]) -> str:
    return str([tuple(b) for b in buckets])


def log_bucket_config(phase: str, bs: list[int], second_name: str, second: list[int],
                      extra: str = "") -> None:
    """'Prompt bucket config (min, step, max_warmup) bs:[..], seq:[..]' (+ extra)."""
    logger.info("%s bucket config (min, step, max_warmup) bs:%s, %s:%s%s", phase, bs,
                second_name, second, extra)


def log_generated_buckets(phase: str, buckets: Sequence[tuple], extra: str = "") -> None:
    """'Generated N prompt buckets: [...]' (+ extra)."""
    logger.info("Generated %d %s buckets: %s%s", len(buckets), phase.lower(),
                _buckets(buckets), extra)


def log_warmup_step(phase: str, index: int, total: int, bucket: tuple,
                    block_size: int) -> None:
    """'[Warmup][Prompt][i/N] batch_size:B seq_len:S free_mem:X num_blocks:C' (phase
    'Graph/Prompt' etc. for captures). seq_len: the query length of a prompt bucket,
    the KV tokens (blocks x block_size) of a decode bucket, as the seed's decode
    lines count a bucket's sequence length in tokens."""
    from vllm.hpu import habana
    batch_size, query_len, num_blocks = bucket
    seq_len = num_blocks * block_size if phase.endswith("Decode") else query_len
    logger.info("[Warmup][%s][%d/%d] batch_size:%d seq_len:%d free_mem:%s num_blocks:%d",
                phase, index, total, batch_size, seq_len,
                format_bytes(habana.mem_get_info()[0]), num_blocks)


def log_weights_loaded(device: str, before: MemorySnapshot, seconds: float) -> None:
    logger.info("Pre-loading model weights on %s took %s in %.2f s", device,
                MemorySnapshot.take().took_since(before), seconds)


def log_took(what: str, before: MemorySnapshot, seconds: Optional[float] = None) -> None:
    """'<what> took X of device memory (..) and Y of host memory (..)' [' in S s'], as
    the original backend words "Wrapping in HPU Graph took", "Initializing cache engine
    took" and "Loading model weights took in total"."""
    took = "took in total" if what == "Loading model weights" else "took"
    logger.info("%s %s %s%s", what, took, MemorySnapshot.take().took_since(before),
                "" if seconds is None else f" in {seconds:.2f} s")


def log_profile_run(before: MemorySnapshot, bucket: tuple) -> None:
    logger.info("Model profiling run took %s at prompt bucket %s",
                MemorySnapshot.take().took_since(before), tuple(bucket))


def log_graph_memory(graph_mem: int, free: int, prompt: int, decode: int,
                     ratio: float) -> None:
    logger.info("Using %s/%s of free device memory for HPUGraphs, %s for prompt and %s for "
                "decode (VLLM_GRAPH_PROMPT_RATIO=%.3g)", format_bytes(graph_mem),
                format_bytes(free), format_bytes(prompt), format_bytes(decode), ratio)


def log_graph_models(models: tuple, plan: Any, num_prompt: int, num_decode: int) -> None:
    """The measured graph memory models and the reserve they give (graph_memory.py)."""
    prompt, decode = models
    logger.info("HPU graph memory measured on %d probe graphs: prompt %s; decode %s",
                len(prompt.samples) + len(decode.samples), prompt.describe(), decode.describe())
    logger.info("HPU graph memory needed for %d prompt + %d decode buckets: %s + %s, "
                "reserving %s%s", num_prompt, num_decode, format_bytes(int(plan.prompt_bytes)),
                format_bytes(int(plan.decode_bytes)), format_bytes(plan.reserve),
                " (capped at half the usable memory: the rest run without graphs)"
                if plan.capped else "")
