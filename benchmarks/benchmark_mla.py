"""MLA's latent KV cache against multi-head attention, and decode with and without
weight absorption, on CPU.

Builds two random-weight checkpoints with transformers, same hidden size, depth, heads
and (dense SwiGLU) MLP:
- MLA (DeepSeek-V2 layout): `--kv-lora-rank` latent + `--rope-dim` rope key cached per
  token and layer;
- MHA (Llama layout): `--num-heads` heads of `--head-dim`, K and V cached.

Reports the KV tokens one GiB holds (from the engine's block size in bytes), then runs
`--batch-size` prompts of `--input-len` random tokens for `--output-len` greedy tokens
and times pure decode steps of the MLA model with weight absorption (decodes read only
the latent) and without (every cached latent expanded through kv_b_proj each step), and
of the MHA model. Wall clock of this process: compare numbers from one run only.
"""
from __future__ import annotations

import os
import sys

if __package__ in (None, ""):
    # Run as a file: see benchmark_throughput.py.
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import statistics
import tempfile
import time


def build_checkpoints(args: argparse.Namespace, out_dir: str) -> dict[str, str]:
    import torch
    import transformers
    common = dict(vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                  intermediate_size=args.intermediate_size, num_hidden_layers=args.num_layers,
                  num_attention_heads=args.num_heads, num_key_value_heads=args.num_heads,
                  max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=1,
                  eos_token_id=2)
    configs = {
        "mla": transformers.DeepseekV2Config(
            kv_lora_rank=args.kv_lora_rank, q_lora_rank=None, qk_rope_head_dim=args.rope_dim,
            qk_nope_head_dim=args.head_dim, v_head_dim=args.head_dim,
            first_k_dense_replace=args.num_layers, **common),  # all layers dense
        "mha": transformers.LlamaConfig(head_dim=args.head_dim, **common),
    }
    paths = {}
    for name, config in configs.items():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        paths[name] = os.path.join(out_dir, name)
        model.save_pretrained(paths[name], safe_serialization=True)
    return paths


def _set_absorb(worker, value: bool) -> int:
    from vllm.attention.mla import MLAAttention
    layers = [m for m in worker.model_runner.model.modules() if isinstance(m, MLAAttention)]
    for m in layers:
        m.absorb = value
    return len(layers)


def run(path: str, args: argparse.Namespace, absorb=None) -> tuple[int, list[float]]:
    """(KV cache bytes per token, decode step times)."""
    import numpy as np

    from vllm import LLM, SamplingParams
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    llm = LLM(model=path, tokenizer=resolve_model_path(DEFAULT_MODEL), dtype=args.dtype,
              max_model_len=args.input_len + args.output_len + 8, max_num_seqs=args.batch_size,
              kv_cache_memory_bytes=512 << 20, enable_prefix_caching=False, block_size=16)
    runner = llm.llm_engine.engine_core.executor.worker.model_runner
    per_token = runner.get_kv_cache_block_bytes() // runner.block_size
    if absorb is not None:
        llm.collective_rpc(_set_absorb, args=(absorb,))
    engine = llm.llm_engine
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    times: list[float] = []
    for rep in range(args.num_iters + 1):
        for i in range(args.batch_size):
            ids = rng.integers(3, args.vocab_size, args.input_len).tolist()
            engine.add_request(f"{rep}-{i}", {"prompt_token_ids": ids}, params)
        produced = 0
        while engine.has_unfinished_requests():
            start = time.perf_counter()
            outputs = engine.step()
            elapsed = time.perf_counter() - start
            decoding = produced >= args.batch_size
            produced = sum(len(o.outputs[0].token_ids) > 0 for o in outputs) or produced
            if decoding and rep > 0 and len(outputs) == args.batch_size:
                times.append(elapsed)
    engine.shutdown()
    return per_token, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--num-iters", type=int, default=1)
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--intermediate-size", type=int, default=2816)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--num-heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--kv-lora-rank", type=int, default=512)
    parser.add_argument("--rope-dim", type=int, default=64)
    parser.add_argument("--vocab-size", type=int, default=8192)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = build_checkpoints(args, tmp)
        print(f"batch {args.batch_size}, {args.input_len} prompt + {args.output_len} output "
              f"tokens, {args.dtype}, {args.num_layers} layers, {args.num_heads} heads")
        for label, path, absorb in (("MLA, absorbed", paths["mla"], True),
                                    ("MLA, expanded", paths["mla"], False),
                                    ("MHA", paths["mha"], None)):
            per_token, steps = run(path, args, absorb)
            step = statistics.median(steps)
            print(f"{label:14s} KV {per_token:6d} B/token = {(1 << 30) // per_token:8d} "
                  f"tokens/GiB  decode step median {1e3 * step:7.2f} ms "
                  f"({args.batch_size / step:6.1f} tok/s, {len(steps)} steps)")


if __name__ == "__main__":
    main()
