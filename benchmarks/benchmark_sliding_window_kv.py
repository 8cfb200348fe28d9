"""KV tokens per GiB and the longest context that fits, with sliding-window layers keeping
a full-length cache (--disable-hybrid-kv-cache-manager) and keeping only their window.

Builds random-weight checkpoints shaped like Gemma 2 2B (26 layers, sliding / full
alternating, window 4096), Gemma 3 4B (34 layers, five sliding per full, window 1024) and
Mistral 7B v0.1 (32 layers, all sliding, window 4096): their real layer counts, KV heads,
head sizes and windows (what the KV cache's size depends on), with a tiny hidden size.
Each is started with the same KV cache memory both ways; the block count comes from the
engine, the longest context from the engine's own start-up check (the blocks one request
of that length holds: every block in full-attention groups, its window plus a step's
tokens in sliding ones; plus the null block). Nothing is generated: a 100k-token prompt
on CPU would take hours, and tests/models/test_sliding_window_kv.py serves one that did
not fit before.

    python benchmarks/benchmark_sliding_window_kv.py [--kv-gib 1]
"""
from __future__ import annotations

import argparse
import gc
import logging
import os
import platform
import subprocess
import tempfile

import torch

SHAPES = {
    "Gemma 2 2B": ("gemma2", dict(num_hidden_layers=26, num_attention_heads=8,
                                  num_key_value_heads=4, head_dim=256,
                                  query_pre_attn_scalar=256, sliding_window=4096)),
    "Gemma 3 4B": ("gemma3", dict(num_hidden_layers=34, num_attention_heads=8,
                                  num_key_value_heads=4, head_dim=256,
                                  query_pre_attn_scalar=256, sliding_window=1024)),
    "Mistral 7B v0.1": ("mistral", dict(num_hidden_layers=32, num_attention_heads=32,
                                        num_key_value_heads=8, head_dim=128,
                                        sliding_window=4096)),
}
MAX_POSITIONS = 1 << 20
BLOCK_SIZE = 16
CHUNK = 2048


def build(directory: str, arch: str, shape: dict) -> str:
    import transformers
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    cls = {"gemma2": transformers.Gemma2Config, "gemma3": transformers.Gemma3TextConfig,
           "mistral": transformers.MistralConfig}[arch]
    config = cls(vocab_size=49152, hidden_size=64, intermediate_size=128,
                 max_position_embeddings=MAX_POSITIONS, pad_token_id=0, bos_token_id=1,
                 eos_token_id=2, **shape)
    if arch == "gemma3":
        config.layer_types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                              for i in range(config.num_hidden_layers)]
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory, safe_serialization=True)
    transformers.AutoTokenizer.from_pretrained(
        resolve_model_path(DEFAULT_MODEL)).save_pretrained(directory)
    return directory


def measure(path: str, kv_bytes: int, hybrid: bool) -> dict:
    """Blocks, layout and the longest context of one engine start."""
    from vllm import LLM
    llm = LLM(model=path, dtype="bfloat16", max_model_len=1024, block_size=BLOCK_SIZE,
              kv_cache_memory_bytes=kv_bytes, max_num_batched_tokens=CHUNK, max_num_seqs=8,
              disable_hybrid_kv_cache_manager=not hybrid, enforce_eager=True)
    core = llm.llm_engine.engine_core
    config = core.kv_cache_config
    blocks = core.vllm_config.cache_config.num_gpu_blocks
    block_bytes = config.block_bytes()
    longest = longest_context(config, blocks)
    llm.llm_engine.shutdown()
    del llm
    gc.collect()
    return dict(blocks=blocks, block_bytes=block_bytes, longest=longest,
                layout=config.describe())


def longest_context(config, blocks: int) -> int:
    """The largest max_model_len (a multiple of the block size, at most MAX_POSITIONS)
    whose one request fits in `blocks` (the engine's start-up check)."""
    null = 1 if config.is_hybrid else 0
    lo, hi = 0, MAX_POSITIONS // BLOCK_SIZE
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if config.max_blocks_per_request(mid * BLOCK_SIZE, CHUNK) + null <= blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo * BLOCK_SIZE


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines()
                    if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv-gib", type=float, default=1.0,
                        help="KV cache memory of every start, GiB")
    args = parser.parse_args()
    logging.getLogger("vllm").setLevel(logging.WARNING)
    kv_bytes = int(args.kv_gib * (1 << 30))
    print(f"CPU: {cpu_model()}; KV cache {args.kv_gib} GiB, block {BLOCK_SIZE}, "
          f"bf16, {CHUNK}-token steps")
    print("| model shape | KV layout | blocks | bytes / block | longest context | "
          "context tokens / GiB |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (arch, shape) in SHAPES.items():
            path = build(os.path.join(tmp, arch), arch, shape)
            for hybrid in (False, True):
                r = measure(path, kv_bytes, hybrid)
                bounded = r["longest"] >= MAX_POSITIONS  # only the position limit
                longest = f">= {r['longest']:,}" if bounded else f"{r['longest']:,}"
                per_gib = ("unbounded" if bounded
                           else f"{r['longest'] / args.kv_gib:,.0f}")
                mode = "window blocks only" if hybrid else "full-length (before)"
                print(f"| {name}, {mode} | {r['layout']} | {r['blocks']:,} | "
                      f"{r['block_bytes']:,} | {longest} | {per_gib} |", flush=True)


if __name__ == "__main__":
    main()
