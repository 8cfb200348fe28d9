"""A small MoE model against the dense model of the same active parameter count, on CPU.

Builds two random-weight checkpoints with transformers (same attention, vocabulary
and depth):

- MoE (Mixtral layout): `--num-experts` SwiGLU experts of width `--expert-size`, top
  `--top-k` per token;
- dense (Mistral layout): one SwiGLU MLP of width `top_k * expert_size`, so each token
  runs exactly as many MLP weights as in the MoE model.

Then runs `--batch-size` prompts of `--input-len` random tokens for `--output-len`
greedy tokens through the engine and reports the time of pure decode steps (median and
mean; the prefill steps are left out). Times are wall clock of this process: run it on
an otherwise idle machine, and compare numbers from one run only.
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
                  num_hidden_layers=args.num_layers, num_attention_heads=args.num_heads,
                  num_key_value_heads=args.num_kv_heads, max_position_embeddings=4096,
                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                  sliding_window=None)
    configs = {
        "moe": transformers.MixtralConfig(intermediate_size=args.expert_size,
                                          num_local_experts=args.num_experts,
                                          num_experts_per_tok=args.top_k, **common),
        "dense": transformers.MistralConfig(intermediate_size=args.top_k * args.expert_size,
                                            **common),
    }
    paths = {}
    for name, config in configs.items():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        path = os.path.join(out_dir, name)
        model.save_pretrained(path, safe_serialization=True)
        paths[name] = path
    return paths


def count_params(path: str, args: argparse.Namespace) -> tuple[float, float]:
    """(total, active per token) parameters in millions, from the checkpoint."""
    from safetensors import safe_open
    total = active = 0
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        for key in f.keys():
            n = f.get_slice(key).get_shape()
            size = 1
            for d in n:
                size *= d
            total += size
            active += size * args.top_k // args.num_experts if ".experts." in key else size
    return total / 1e6, active / 1e6


def time_decode_steps(path: str, args: argparse.Namespace) -> list[float]:
    import numpy as np

    from vllm import LLM, SamplingParams
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    llm = LLM(model=path, tokenizer=resolve_model_path(DEFAULT_MODEL), dtype=args.dtype,
              max_model_len=args.input_len + args.output_len + 8, max_num_seqs=args.batch_size,
              kv_cache_memory_bytes=256 << 20, enable_prefix_caching=False)
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
            decoding = produced >= args.batch_size  # every request has its first token
            produced = sum(len(o.outputs[0].token_ids) > 0 for o in outputs) or produced
            if decoding and rep > 0 and len(outputs) == args.batch_size:
                times.append(elapsed)
    engine.shutdown()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--num-iters", type=int, default=2, help="timed batches (after one "
                        "warm-up batch)")
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--num-heads", type=int, default=8)
    parser.add_argument("--num-kv-heads", type=int, default=4)
    parser.add_argument("--num-experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--expert-size", type=int, default=1024)
    parser.add_argument("--vocab-size", type=int, default=8192)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = build_checkpoints(args, tmp)
        print(f"batch {args.batch_size}, {args.input_len} prompt + {args.output_len} output "
              f"tokens, {args.dtype}, {args.num_experts} experts top-{args.top_k}")
        for name, path in paths.items():
            total, active = count_params(path, args)
            steps = time_decode_steps(path, args)
            print(f"{name:6s} params {total:6.1f} M (active {active:5.1f} M)  decode step: "
                  f"median {1e3 * statistics.median(steps):6.2f} ms, mean "
                  f"{1e3 * statistics.mean(steps):6.2f} ms over {len(steps)} steps")


if __name__ == "__main__":
    main()
