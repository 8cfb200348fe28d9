"""benchmark_roofline.py: the probes run on tiny sizes and the byte/FLOP accounting
matches hand counts (no timing assertions: these are measurements)."""
from __future__ import annotations

import os
import sys
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks.benchmark_roofline import ModelBytes, add_shares, run_probes  # noqa: E402

CONFIG = SimpleNamespace(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, vocab_size=100)


def test_probes_on_tiny_sizes():
    p = run_probes(triad_elements=1 << 16, gemm_size=64, gemm_rows=8)
    assert p["triad_bytes_per_s"] > 0 and p["gemm_flops_per_s"] > 0
    assert p["gemm_kernel"].startswith(("vllm.cpu.gemm.linear", "torch.matmul"))
    assert p["threads"] >= 1 and p["gemm_rows"] == 8


def test_decode_bytes_are_weights_plus_kv():
    m = ModelBytes.from_hf_config(CONFIG)
    head_dim = 16
    per_layer = 64 * head_dim * (2 * 4 + 2 * 2) + 3 * 64 * 128
    assert m.layer_params == 2 * per_layer
    assert m.weight_bytes == 2 * (2 * per_layer + 64 * 100 + 5 * 64)
    assert m.kv_bytes_per_token == 2 * 2 * 2 * head_dim * 2  # K+V, layers, kv heads, bf16
    assert m.decode_bytes([10, 20]) == m.weight_bytes + 30 * m.kv_bytes_per_token


def test_prefill_flops_whole_prompts_and_a_chunk():
    m = ModelBytes.from_hf_config(CONFIG)
    # Two whole 4-token prompts and a 2-token chunk of a third: logits for two.
    flops = m.prefill_flops(num_tokens=10, prompt_len=4)
    pairs = 2 * (4 * 5 / 2) + 2 * 3 / 2
    assert flops == (2 * m.layer_params * 10 + 2 * 64 * 100 * 2
                     + 4 * 2 * 4 * 16 * pairs)


def test_shares_against_the_probes():
    r = add_shares({"probes": {"triad_bytes_per_s": 100e9, "gemm_flops_per_s": 2e12},
                    "batches": [{"decode_gb_per_s": 60.0, "decode_tflop_per_s": 1.0,
                                 "prefill_tflop_per_s": 0.5}]})
    assert abs(r["batches"][0]["bw_roofline_share"] - 0.6) < 1e-9
    assert abs(r["batches"][0]["gemm_peak_share"] - 0.25) < 1e-9


def test_decode_flops_count_logits_and_attention():
    m = ModelBytes.from_hf_config(CONFIG)
    assert m.decode_flops([3, 5]) == (2 * (m.layer_params + 64 * 100) * 2
                                      + 4 * 2 * 4 * 16 * 8)


def test_a_rows_own_triad_and_the_roofline_share():
    """A row measured next to its own triad is held against it; the roofline share is
    the larger of the bandwidth and the compute share (the binding roof)."""
    r = add_shares({"probes": {"triad_bytes_per_s": 100e9, "gemm_flops_per_s": 2e12},
                    "batches": [{"decode_gb_per_s": 30.0, "decode_tflop_per_s": 1.6,
                                 "prefill_tflop_per_s": 0.5, "triad_bytes_per_s": 50e9},
                                {"decode_gb_per_s": 30.0, "decode_tflop_per_s": 0.2,
                                 "prefill_tflop_per_s": 0.5}]})
    compute_bound, memory_bound = r["batches"]
    assert abs(compute_bound["bw_roofline_share"] - 0.6) < 1e-9
    assert abs(compute_bound["roofline_share"] - 0.8) < 1e-9
    assert abs(memory_bound["bw_roofline_share"] - 0.3) < 1e-9
    assert abs(memory_bound["decode_gemm_peak_share"] - 0.1) < 1e-9
    assert abs(memory_bound["roofline_share"] - 0.3) < 1e-9
