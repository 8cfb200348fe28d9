"""CUDA graph sizes, padding and static buffers, checked on CPU (no GPU needed).

`CudaGraphRunner` with `EagerGraph` re-runs the recorded function on replay, so what
is tested here is exactly what a real graph relies on: every replay reads only the
static buffers, padding rows write nothing, padding sequences read nothing.
"""
from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from vllm.attention.backends.triton_attn import build_triton_inputs
from vllm.config import CompilationConfig, default_capture_sizes
from vllm.engine.arg_utils import EngineArgs
from vllm.worker.cuda_graphs import PADDING_SLOT, CudaGraphRunner, EagerGraph, padded_host_inputs


def test_default_capture_sizes_follow_vllm():
    assert default_capture_sizes(4) == [1, 2, 4]
    assert default_capture_sizes(10) == [1, 2, 4, 8, 10]
    sizes = default_capture_sizes(512)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-3:] == [480, 496, 512]
    assert all(b - a == 8 for a, b in zip(sizes[3:34], sizes[4:35]))  # 8..256 by 8


@pytest.mark.parametrize("kwargs, max_num_seqs, budget, sizes", [
    ({}, 256, 8192, default_capture_sizes(512)),           # min(2 * 256, 512)
    ({}, 8, 8192, [1, 2, 4, 8, 16]),                        # 2 * max_num_seqs
    ({}, 256, 100, default_capture_sizes(100)),             # the token budget caps it
    ({"max_cudagraph_capture_size": 24}, 256, 8192, [1, 2, 4, 8, 16, 24]),
    ({"cudagraph_capture_sizes": [8, 1, 3, 3]}, 256, 8192, [1, 3, 8]),
    ({"cudagraph_mode": "none"}, 256, 8192, []),
])
def test_compilation_config_sizes(kwargs, max_num_seqs, budget, sizes):
    config = CompilationConfig(**kwargs)
    config.finalize(max_num_seqs, budget, enforce_eager=False)
    assert config.cudagraph_capture_sizes == sizes


def test_enforce_eager_and_bad_values():
    config = CompilationConfig()
    config.finalize(8, 8192, enforce_eager=True)
    assert config.cudagraph_mode == "NONE" and config.cudagraph_capture_sizes == []
    config.finalize(8, 8192, enforce_eager=True)  # again (a config rebuilt by replace)
    assert config.cudagraph_capture_sizes == []
    with pytest.raises(ValueError, match="cudagraph_mode"):
        CompilationConfig(cudagraph_mode="PIECEWISE")
    with pytest.raises(ValueError, match="cudagraph_capture_sizes"):
        CompilationConfig(cudagraph_capture_sizes=[0, 4])
    with pytest.raises(ValueError, match="must equal the largest"):
        CompilationConfig(cudagraph_capture_sizes=[1, 4],
                          max_cudagraph_capture_size=8).finalize(8, 8192, False)
    with pytest.raises(ValueError, match="unknown key"):
        CompilationConfig.from_cli('{"cudagraph_sizes": [1]}')


def test_cli_flags_reach_the_config():
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args(["--cudagraph-capture-sizes", "4", "1", "2", "--max-num-seqs", "8",
                              "-O", '{"cudagraph_mode": "FULL_DECODE_ONLY"}',
                              "--attention-backend", "torch_sdpa"])
    from vllm.cpu.platform import CpuPlatform
    with pytest.MonkeyPatch.context() as mp:  # as on CUDA, where graphs are captured
        mp.setattr(CpuPlatform, "captures_cuda_graphs", True)
        cfg = EngineArgs.from_cli_args(args).create_engine_config()
    assert cfg.compilation_config.cudagraph_capture_sizes == [1, 2, 4]
    assert cfg.compilation_config.cudagraph_mode == "FULL_DECODE_ONLY"
    assert cfg.attention_config.backend_cls.endswith("CpuAttentionImpl")  # the CPU platform's torch_sdpa
    with pytest.raises(ValueError, match="set it once"):
        EngineArgs(compilation_config={"cudagraph_capture_sizes": [1, 2]},
                   cudagraph_capture_sizes=[4]).create_engine_config()
    # The CPU platform serves no Triton backend: a clear error, not a silent fallback.
    with pytest.raises(ValueError, match="TRITON_ATTN.*not available on cpu"):
        EngineArgs(attention_backend="TRITON_ATTN").create_engine_config()


def test_graph_flags_off_cuda_warn_and_capture_nothing(caplog):
    with caplog.at_level("WARNING", logger="vllm"):
        cfg = EngineArgs(cudagraph_capture_sizes=[1, 2]).create_engine_config()
    assert cfg.compilation_config.cudagraph_capture_sizes == []
    assert "captured on CUDA only" in caplog.text


def test_attention_backend_env_var(monkeypatch):
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "CPU_ATTN")
    cfg = EngineArgs().create_engine_config()
    assert cfg.attention_config.backend == "CPU_ATTN"
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "FLASHINFER")
    with pytest.raises(ValueError, match="attention_backend='FLASHINFER'"):
        EngineArgs().create_engine_config()


def _inputs():
    """A decode (context 5), a chunk (3 new after 4 cached) and a prompt of 2, bs 4."""
    return build_triton_inputs(slots=[21, 8, 9, 10, 40, 41], query_lens=[1, 3, 2],
                               seq_lens=[6, 7, 2], block_ids=[[3, 5], [1, 2], [10]],
                               block_size=4)


def test_triton_inputs_and_their_padding():
    inputs = _inputs()
    assert inputs.query_start_loc.tolist() == [0, 1, 4, 6]
    assert inputs.block_table.tolist() == [[3, 5], [1, 2], [10, 0]]
    assert inputs.seqs == [(0, 1), (1, 3), (4, 2)]
    host = padded_host_inputs(inputs, np.arange(6) + 100, np.arange(6), size=8, max_blocks=4)
    assert host["slot_mapping"].tolist() == [21, 8, 9, 10, 40, 41, PADDING_SLOT, PADDING_SLOT]
    # Sequences 3..7 own no rows (start = end = 6) and have no tokens.
    assert host["query_start_loc"].tolist() == [0, 1, 4, 6, 6, 6, 6, 6, 6]
    assert host["seq_lens"].tolist() == [6, 7, 2, 0, 0, 0, 0, 0]
    assert host["input_ids"].tolist() == [100, 101, 102, 103, 104, 105, 0, 0]
    with pytest.raises(ValueError, match="does not fit"):
        padded_host_inputs(inputs, np.arange(6), np.arange(6), size=4, max_blocks=4)


class _RecordingForward:
    """A forward that copies what it reads, so replays can be compared with inputs."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def __call__(self, ids, pos, md):
        self.seen.append({"ids": ids.clone(), "slots": md.slot_mapping.clone(),
                          "qsl": md.query_start_loc.clone(), "lens": md.seq_lens.clone(),
                          "table": md.block_table.clone()})
        return (ids * 10 + pos).unsqueeze(1).float()


def test_graph_runner_replays_the_smallest_fitting_size():
    fwd = _RecordingForward()
    runner = CudaGraphRunner([1, 2, 4, 8], decode_only=False, max_blocks=4, block_size=4,
                             device=torch.device("cpu"), graph_factory=EagerGraph)
    runner.capture_all(fwd, progress=False)
    assert sorted(runner.graphs) == [1, 2, 4, 8]
    # Capture saw only padding: nothing to write (-1), no sequence owns a row.
    assert all((s["slots"] == PADDING_SLOT).all() and (s["qsl"] == 0).all() for s in fwd.seen)
    inputs = _inputs()
    size = runner.size_for(inputs)
    assert size == 8
    out = runner.replay(size, inputs, np.arange(6) + 100, np.arange(6))
    assert out.shape == (6, 1)
    assert out[:, 0].tolist() == [(100 + i) * 10 + i for i in range(6)]
    last = fwd.seen[-1]
    assert last["slots"].tolist() == [21, 8, 9, 10, 40, 41, -1, -1]
    assert last["lens"].tolist()[:3] == [6, 7, 2] and last["lens"][3:].eq(0).all()
    assert last["table"][:3, :2].tolist() == [[3, 5], [1, 2], [10, 0]]
    assert runner.replays == 1
    # A later, smaller step leaves no trace of the earlier one in its padding.
    small = build_triton_inputs([7], [1], [3], [[1]], 4)
    assert runner.size_for(small) == 1
    runner.replay(1, small, np.array([5]), np.array([2]))
    assert fwd.seen[-1]["slots"].tolist() == [7] and fwd.seen[-1]["qsl"].tolist() == [0, 1]


def test_graph_runner_declines_what_it_cannot_serve():
    runner = CudaGraphRunner([1, 2, 4], decode_only=True, max_blocks=2, block_size=4,
                             device=torch.device("cpu"), graph_factory=EagerGraph)
    assert runner.size_for(_inputs()) is None  # nothing captured yet
    runner.capture_all(_RecordingForward(), progress=False)
    decodes = build_triton_inputs([1, 9, 17], [1, 1, 1], [2, 2, 2], [[0], [2], [4]], 4)
    assert runner.size_for(decodes) == 4
    assert runner.size_for(_inputs()) is None  # decode-only mode, a prefill in the step
    long_ctx = build_triton_inputs([40], [1], [12], [[1, 2, 3]], 4)  # 3 blocks > 2
    assert runner.size_for(long_ctx) is None
    too_many = build_triton_inputs(list(range(5)), [1] * 5, [1] * 5, [[i] for i in range(5)], 4)
    assert runner.size_for(too_many) is None
    runner.drop()
    assert runner.size_for(decodes) is None
