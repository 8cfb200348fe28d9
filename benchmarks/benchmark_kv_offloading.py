"""KV cache offloading (--kv-offloading-size): a multi-turn chat trace on the fake HPU
with a device KV cache too small for its conversations, with and without offloading.

The trace: `--conversations` chats of `--turns` turns each, served one request at a
time, round-robin (turn 1 of every chat, then turn 2 of every chat, ...), as users
taking turns. A chat's first prompt is `--first-len` tokens (its system prompt and first
message); each later prompt is the previous prompt, the reply generated for it
(`--reply-len` tokens, greedy) and `--user-len` new tokens. Token ids are random (no
chat template): what matters is that each turn's prompt extends the last one.

The device cache (`--device-blocks` blocks of `--block-size` tokens) holds a few chats'
contexts, so by the time a chat comes back its blocks were evicted by the others. With
offloading, they come back from host memory (`--offload-gib`). Reported per run: TTFT
(mean, median, p90; of all turns and of the turns after the first), the prefix-hit rate
(prompt tokens not computed / prompt tokens) split by source (device prefix cache vs
host memory), and the blocks stored and loaded; greedy outputs must be equal.

    python benchmarks/benchmark_kv_offloading.py                 # defaults below
    python benchmarks/benchmark_kv_offloading.py --conversations 8 --turns 4 \\
        --device-blocks 24 --offload-gib 1

Runs the embedded default model (SmolLM2-135M-Instruct) unless --model is given, on the
fake HPU (VLLM_USE_FAKE_HPU=1, set here), eager (no warmup: the numbers are prefill and
copy costs, not compile times).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _setup_env() -> None:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "hpu")
    os.environ.setdefault("VLLM_USE_FAKE_HPU", "1")
    os.environ.setdefault("VLLM_SKIP_WARMUP", "1")
    os.environ.setdefault("PT_HPU_LAZY_MODE", "0")
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)


def _trace(args, vocab: int) -> list[list[int]]:
    """Each chat's new tokens per turn: [first prompt, user message 2, ...]."""
    rng = random.Random(args.seed)
    # Ids from the middle of the vocabulary: no special tokens.
    lo, hi = 1000, vocab // 2 - 1
    return [[[rng.randint(lo, hi) for _ in range(args.first_len if t == 0 else args.user_len)]
             for t in range(args.turns)] for _ in range(args.conversations)]


def _warm_up(llm, params, length: int, vocab: int) -> None:
    """First-use costs out of the trace: a prompt, then a longer one on its prefix
    (the prefill-with-context path), with ids the trace never draws."""
    rng = random.Random(-1)
    prompt = [rng.randint(vocab // 2, vocab - 1) for _ in range(length)]
    for p in (prompt, prompt + prompt[:length // 2]):
        llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run(args, offload: bool) -> dict:
    from vllm import LLM, SamplingParams
    kwargs = dict(model=args.model, block_size=args.block_size, dtype=args.dtype,
                  num_gpu_blocks_override=args.device_blocks, max_num_seqs=4,
                  max_model_len=args.max_model_len or args.device_blocks * args.block_size,
                  enforce_eager=True, seed=0)
    if args.model is None:
        kwargs.pop("model")
    if offload:
        kwargs["kv_offloading_size"] = args.offload_gib
    llm = LLM(**kwargs)
    try:
        vocab = llm.get_tokenizer().vocab_size
        chats = _trace(args, vocab)
        contexts = [[] for _ in chats]
        params = SamplingParams(temperature=0.0, max_tokens=args.reply_len, ignore_eos=True)
        _warm_up(llm, params, args.first_len, vocab)
        before = llm.llm_engine.get_stats()
        ttft, ttft_later, replies = [], [], []
        prompt_tokens = cached = 0
        start = time.perf_counter()
        for turn in range(args.turns):
            for c, chat in enumerate(chats):
                prompt = contexts[c] + chat[turn]
                out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
                m = out.metrics
                t = m.first_token_time - m.arrival_time
                ttft.append(t)
                if turn:
                    ttft_later.append(t)
                reply = list(out.outputs[0].token_ids)
                replies.append(reply)
                contexts[c] = prompt + reply
                prompt_tokens += len(prompt)
                cached += out.num_cached_tokens
        wall = time.perf_counter() - start
        stats = llm.llm_engine.get_stats()
    finally:
        llm.llm_engine.shutdown()
        del llm
    kv = stats.kv_offload or {}
    kv0 = before.kv_offload or {}
    return {
        "offload": offload, "requests": len(ttft), "wall_s": wall,
        "prompt_tokens": prompt_tokens,
        "ttft_mean_ms": 1e3 * statistics.mean(ttft),
        "ttft_median_ms": 1e3 * statistics.median(ttft),
        "ttft_p90_ms": 1e3 * _pct(ttft, 0.9),
        "ttft_later_turns_mean_ms": 1e3 * statistics.mean(ttft_later) if ttft_later else 0,
        "hit_rate": cached / prompt_tokens,
        "device_hit_tokens": stats.prefix_cache_hits - before.prefix_cache_hits,
        "host_hit_tokens": (stats.external_prefix_cache_hits
                            - before.external_prefix_cache_hits),
        "stored_blocks": kv.get("stored_blocks", 0) - kv0.get("stored_blocks", 0),
        "loaded_blocks": kv.get("loaded_blocks", 0) - kv0.get("loaded_blocks", 0),
        "replies": replies,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: the embedded default model")
    p.add_argument("--dtype", default="float32",
                   help="float32: the runs' greedy outputs compare exactly (in bfloat16 a "
                        "prefix computed with a context and one computed from scratch may "
                        "round apart, so outputs can differ on near-ties)")
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--first-len", type=int, default=384)
    p.add_argument("--user-len", type=int, default=128)
    p.add_argument("--reply-len", type=int, default=16)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--device-blocks", type=int, default=24,
                   help="device KV blocks (too few for the chats' contexts)")
    p.add_argument("--offload-gib", type=float, default=1.0)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="default: what the device blocks hold")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    _setup_env()
    results = [run(args, offload=False), run(args, offload=True)]
    same = results[0].pop("replies") == results[1].pop("replies")
    keys = [k for k in results[0] if k != "offload"]
    print(f"{'':28}{'no offloading':>16}{'offloading':>16}")
    for k in keys:
        a, b = results[0][k], results[1][k]
        fmt = (lambda v: f"{v:16.3f}") if isinstance(a, float) else (lambda v: f"{v:16d}")
        print(f"{k:28}{fmt(a)}{fmt(b)}")
    print(f"greedy outputs equal: {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results, "outputs_equal": same}, f,
                      indent=1)
    if not same:
        sys.exit("outputs differ between the runs")


if __name__ == "__main__":
    main()
