"""The seed's HPU log lines, word for word (users' log tooling parses them).

The engine-level lines are checked on a real warmup in test_hpu_engine.py
(WARMUP_LINES); here each format is pinned exactly, and the capture numbering of
the second prompt pass (prompt graphs that only fit in the memory decode left over)
continues the first pass's.
"""
from __future__ import annotations

import logging
import re

import pytest

from vllm.hpu import habana
from vllm.hpu import log as hpu_log
from vllm.hpu.bucketing import Bucket
from vllm.hpu.execution import ExecutionMode
from vllm.hpu.warmup import HPUWarmup, WarmupOps

SIZE = r"-?[\d.]+ (?:B|KiB|MiB|GiB|TiB)"
SEED_LINES = {
    "bucket_config": r"^Prompt bucket config \(min, step, max_warmup\) bs:\[1, 2, 4\], "
                     r"seq:\[128, 128, 512\]",
    "generated": r"^Generated 2 prompt buckets: \[\(1, 128, 0\), \(2, 256, 1\)\]",
    "warmup": rf"^\[Warmup\]\[Prompt\]\[3/7\] batch_size:2 seq_len:256 free_mem:{SIZE}",
    "weights": rf"^Pre-loading model weights on hpu:0 took {SIZE} of device memory "
               rf"\({SIZE}/{SIZE} used\) and {SIZE} of host memory \({SIZE}/{SIZE} used\)",
    "profile": rf"^Model profiling run took {SIZE} of device memory \({SIZE}/{SIZE} used\) "
               rf"and {SIZE} of host memory \({SIZE}/{SIZE} used\)",
    "graphs": rf"^Using {SIZE}/{SIZE} of free device memory for HPUGraphs, {SIZE} for prompt "
              rf"and {SIZE} for decode \(VLLM_GRAPH_PROMPT_RATIO=0\.3\)$",
    "wrap": rf"^Wrapping in HPU Graph took {SIZE} of device memory \({SIZE}/{SIZE} used\) "
            rf"and {SIZE} of host memory \({SIZE}/{SIZE} used\)$",
    "total": rf"^Loading model weights took in total {SIZE} of device memory "
             rf"\({SIZE}/{SIZE} used\) and {SIZE} of host memory \({SIZE}/{SIZE} used\) "
             rf"in 2\.50 s$",
    "cache": rf"^Initializing cache engine took {SIZE} of device memory \({SIZE}/{SIZE} used\) "
             rf"and {SIZE} of host memory \({SIZE}/{SIZE} used\)$",
}


def test_each_line_in_the_seed_wording(caplog):
    with caplog.at_level(logging.INFO, logger="vllm.hpu.log"):
        hpu_log.log_bucket_config("Prompt", [1, 2, 4], "seq", [128, 128, 512],
                                  ", blocks:[0, 1, 4]")
        hpu_log.log_generated_buckets("Prompt", [Bucket(1, 128, 0), Bucket(2, 256, 1)])
        hpu_log.log_warmup_step("Prompt", 3, 7, Bucket(2, 256, 1), 128)
        before = hpu_log.MemorySnapshot.take()
        hpu_log.log_weights_loaded("hpu:0", before, 1.5)
        hpu_log.log_profile_run(before, Bucket(2, 256, 0))
        hpu_log.log_graph_memory(3 << 30, 10 << 30, 1 << 30, 2 << 30, 0.3)
        hpu_log.log_took("Wrapping in HPU Graph", before)
        hpu_log.log_took("Loading model weights", before, 2.5)
        hpu_log.log_took("Initializing cache engine", before)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == len(SEED_LINES)
    for (name, pattern), line in zip(SEED_LINES.items(), lines):
        assert re.search(pattern, line), (name, line)
    # Extra fields only at the end of a line.
    assert lines[0].endswith(", blocks:[0, 1, 4]")
    assert lines[2].endswith(" num_blocks:1")
    assert lines[3].endswith(" in 1.50 s")
    assert lines[4].endswith(" at prompt bucket (2, 256, 0)")
    assert lines[5] == ("Using 3 GiB/10 GiB of free device memory for HPUGraphs, 1 GiB for "
                        "prompt and 2 GiB for decode (VLLM_GRAPH_PROMPT_RATIO=0.3)")


class _Runner:
    """Captures cost 100 bytes per token of the fake device's memory."""

    def __init__(self, graph_budget: int) -> None:
        self.mem_margin = habana.mem_get_info()[0] - graph_budget
        self.held: list[int] = []

    def capture_graph(self, is_prompt: bool, bucket: Bucket) -> None:
        tokens = bucket.batch_size * (bucket.query_len if is_prompt else 1)
        self.held.append(habana.track_alloc(100 * tokens))


def test_second_prompt_capture_pass_continues_the_numbering(caplog, monkeypatch):
    monkeypatch.setenv("VLLM_GRAPH_PROMPT_RATIO", "0.3")
    prompt = [Bucket(1, 128, 0), Bucket(2, 128, 0)]  # 12800 and 25600 bytes
    decode = [Bucket(1, 1, 4)]                       # 100 bytes
    runner = _Runner(graph_budget=80000)            # prompt gets 24000: (2, 128) waits
    try:
        with caplog.at_level(logging.INFO, logger="vllm"):
            ops = WarmupOps(prompt, decode, block_size=128, mode=ExecutionMode.HPU_GRAPHS,
                            uses_hpu_graphs=True, mem_margin=runner.mem_margin,
                            run_dummy_batch=lambda is_prompt, bucket: None,
                            capture_graph=runner.capture_graph,
                            forget_graph=lambda is_prompt, bucket: None,
                            warmup_defragmenter=lambda: None)
            HPUWarmup(ops)._capture_graphs(prompt, decode)
    finally:
        for nbytes in runner.held:
            habana.track_free(nbytes)
    steps = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[Warmup]")]
    assert [s.split(" free_mem")[0] for s in steps] == [
        "[Warmup][Graph/Prompt][1/2] batch_size:1 seq_len:128",
        "[Warmup][Graph/Decode][1/1] batch_size:1 seq_len:512",
        "[Warmup][Graph/Prompt][2/2] batch_size:2 seq_len:128",
    ]
    assert "Graph/Prompt captured:2 (100.0%)" in caplog.text
