"""A Mamba2 model and a Granite 4 hybrid against a dense (Llama-layout) model of about
the same size, on CPU.

Builds two random-weight checkpoints with transformers (same hidden size and
vocabulary; depths chosen so the non-embedding parameters match within a few percent),
runs `--batch-size` prompts of `--input-len` random tokens for `--output-len` greedy
tokens through the engine, and reports per model: parameters, the cache bytes one
request holds (Mamba2: its fixed state, whatever its length; dense: KV bytes per token
times its length) and the median / mean time of pure decode steps (prefill steps left
out). With `--table`, also prints state bytes per request against KV bytes per token
for transformers' default Mamba2 and Granite 4 hybrid configurations (no weights).
Times are wall clock of this process: run it on an otherwise idle machine.
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
import contextlib
import statistics
import tempfile

from benchmarks.benchmark_moe import time_decode_steps  # noqa: E402


def build_checkpoints(args: argparse.Namespace, out_dir: str) -> dict[str, str]:
    import torch
    import transformers
    h = args.hidden_size
    configs = {
        "mamba2": transformers.Mamba2Config(
            vocab_size=args.vocab_size, hidden_size=h, num_hidden_layers=args.mamba_layers,
            num_heads=2 * h // 64, head_dim=64, state_size=args.state_size, n_groups=1,
            expand=2, conv_kernel=4, chunk_size=64, tie_word_embeddings=False,
            bos_token_id=1, eos_token_id=2, pad_token_id=0),
        # Granite 4 hybrid: 3 Mamba2 layers + 1 attention layer, dense shared MLPs
        "hybrid": transformers.GraniteMoeHybridConfig(
            vocab_size=args.vocab_size, hidden_size=h, num_hidden_layers=4,
            layer_types=["mamba", "mamba", "attention", "mamba"], num_attention_heads=h // 64,
            num_key_value_heads=h // 128, mamba_n_heads=2 * h // 64, mamba_d_head=64,
            mamba_d_state=args.state_size, mamba_n_groups=1, mamba_chunk_size=64,
            num_local_experts=0, shared_intermediate_size=args.hybrid_mlp_size,
            intermediate_size=args.hybrid_mlp_size, position_embedding_type="rope",
            max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=1,
            eos_token_id=2, pad_token_id=0),
        "dense": transformers.LlamaConfig(
            vocab_size=args.vocab_size, hidden_size=h, num_hidden_layers=args.dense_layers,
            num_attention_heads=h // 64, num_key_value_heads=h // 128,
            intermediate_size=args.intermediate_size, max_position_embeddings=4096,
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    }
    paths = {}
    for name, config in configs.items():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        path = os.path.join(out_dir, name)
        model.save_pretrained(path, safe_serialization=True)
        paths[name] = path
    return paths


def count_params(path: str) -> tuple[float, float]:
    """(total, without embedding and LM head) parameters in millions."""
    from safetensors import safe_open
    total = body = 0
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        for key in f.keys():
            size = 1
            for d in f.get_slice(key).get_shape():
                size *= d
            total += size
            if "embed" not in key and "lm_head" not in key:
                body += size
    return total / 1e6, body / 1e6


def mamba2_state_bytes(num_layers: int, num_heads: int, head_dim: int, state: int,
                       n_groups: int, intermediate: int, conv_kernel: int,
                       elem: int = 2) -> int:
    """One request's state: per Mamba2 layer the conv state [conv_dim, K - 1] and the
    SSM state [heads, head_dim, state] (vllm/model_executor/layers/mamba)."""
    conv_dim = intermediate + 2 * n_groups * state
    return num_layers * (conv_dim * (conv_kernel - 1) + num_heads * head_dim * state) * elem


def default_config_table() -> None:
    """State bytes per request against KV bytes per token, bf16, for transformers'
    default Mamba2 configuration and its default Granite 4 hybrid one with every tenth
    layer made attention (an illustrative mix; the default has no attention layer)."""
    import transformers
    m = transformers.Mamba2Config()
    layers = 40
    types = ["attention" if i % 10 == 9 else "mamba" for i in range(layers)]
    g = transformers.GraniteMoeHybridConfig(num_hidden_layers=layers, layer_types=types,
                                            num_key_value_heads=8)
    mamba = types.count("mamba")
    attn = layers - mamba
    head_dim = g.hidden_size // g.num_attention_heads
    rows = [
        (f"Mamba2Config() defaults: {m.num_hidden_layers} Mamba2 layers, hidden "
         f"{m.hidden_size}, {m.num_heads} heads x {m.head_dim}, state {m.state_size}",
         mamba2_state_bytes(m.num_hidden_layers, m.num_heads, m.head_dim, m.state_size,
                            m.n_groups, int(m.expand * m.hidden_size), m.conv_kernel), 0),
        (f"GraniteMoeHybridConfig() defaults, {mamba} Mamba2 + {attn} attention layers "
         f"(8 KV heads x {head_dim})",
         mamba2_state_bytes(mamba, g.mamba_n_heads, g.mamba_d_head, g.mamba_d_state,
                            g.mamba_n_groups, int(g.mamba_expand * g.hidden_size),
                            g.mamba_d_conv),
         attn * 2 * g.num_key_value_heads * head_dim * 2)]
    print("| configuration (bf16) | state bytes / request | KV bytes / token |")
    print("| --- | --- | --- |")
    for name, state, kv in rows:
        print(f"| {name} | {state / 2**20:.1f} MiB | {kv / 2**10:.0f} KiB |")


@contextlib.contextmanager
def state_ops_kind(kind: str):
    """`torch`: the CPU state-space steps fall back to the torch ops (the native
    library reported unavailable), for a side-by-side run in this process."""
    from vllm.cpu import state_ops
    original = state_ops.get_state_lib
    if kind == "torch":
        state_ops.get_state_lib = lambda: None
    try:
        yield
    finally:
        state_ops.get_state_lib = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--num-iters", type=int, default=1)
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--mamba-layers", type=int, default=7)
    parser.add_argument("--state-size", type=int, default=64)
    parser.add_argument("--dense-layers", type=int, default=4)
    parser.add_argument("--intermediate-size", type=int, default=1408)
    parser.add_argument("--hybrid-mlp-size", type=int, default=1024)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--state-ops", default="both", choices=["native", "torch", "both"],
                        help="the state-space decode steps on CPU: the native in-place "
                             "kernels (vllm/cpu/state_ops.cpp), the torch ops, or both "
                             "side by side")
    args = parser.parse_args()
    if args.table:
        default_config_table()
    elem = 2 if args.dtype == "bfloat16" else 4
    h = args.hidden_size
    with tempfile.TemporaryDirectory() as tmp:
        paths = build_checkpoints(args, tmp)
        print(f"batch {args.batch_size}, {args.input_len} prompt + {args.output_len} output "
              f"tokens, {args.dtype}")
        length = args.input_len + args.output_len
        for name, path in paths.items():
            total, body = count_params(path)
            if name == "mamba2":
                cache = mamba2_state_bytes(args.mamba_layers, 2 * h // 64, 64,
                                           args.state_size, 1, 2 * h, 4, elem)
                what = f"state {cache / 2**10:.0f} KiB / request"
            elif name == "hybrid":
                state = mamba2_state_bytes(3, 2 * h // 64, 64, args.state_size, 1, 2 * h, 4,
                                           elem)
                per_token = 2 * (h // 128) * 64 * elem
                what = (f"state {state / 2**10:.0f} KiB / request + KV "
                        f"{per_token / 2**10:.1f} KiB / token")
            else:
                per_token = args.dense_layers * 2 * (h // 128) * 64 * elem
                cache = per_token * length
                what = (f"KV {per_token / 2**10:.1f} KiB / token = {cache / 2**10:.0f} KiB "
                        f"at {length} tokens")
            kinds = ["native", "torch"] if args.state_ops == "both" else [args.state_ops]
            for kind in kinds if name != "dense" else ["-"]:
                with state_ops_kind(kind):
                    steps = time_decode_steps(path, argparse.Namespace(**{**vars(args),
                                                                          "top_k": 1}))
                label = name if kind == "-" else f"{name} ({kind} state ops)"
                print(f"{label:26s} params {total:5.1f} M ({body:5.1f} M without "
                      f"embeddings)  {what}  decode step: median "
                      f"{1e3 * statistics.median(steps):6.2f} ms, mean "
                      f"{1e3 * statistics.mean(steps):6.2f} ms over {len(steps)} steps")


if __name__ == "__main__":
    main()
