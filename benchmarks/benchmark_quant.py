"""Quantized formats side by side: weight memory, perplexity, batch-1 decode speed.

For each format the same model is loaded in bf16 (the CPU default), then:
- weight memory: bytes of the model's parameters and buffers after loading;
- perplexity of a fixed held-out text (benchmarks/data/heldout.txt), from the
  engine's own prompt_logprobs: exp(-mean log p(token | prefix));
- batch-1 decode tokens/s: one request, greedy, DECODE_TOKENS new tokens (the best
  of `--repeats` runs, after one warm-up run).

    python benchmarks/quantize_checkpoint.py HuggingFaceTB/SmolLM2-135M-Instruct \\
        /tmp/smollm2-w4a16 --scheme W4A16 --group-size 128
    python benchmarks/benchmark_quant.py --format bf16 --format fp8 \\
        --format int4=/tmp/smollm2-w4a16
"""
from __future__ import annotations

import argparse
import math
import os
import time

HELDOUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "heldout.txt")
DECODE_TOKENS = 64


def _model_of(llm):
    worker = getattr(llm.llm_engine.engine_core.executor, "worker", None)
    if worker is None:
        raise SystemExit("benchmark_quant.py needs the single-process executor.")
    return worker.model_runner.model


def run_format(name: str, model: str, quantization, kv_cache_dtype: str, repeats: int):
    from vllm import LLM, SamplingParams
    from vllm.model_executor.model_loader import weight_bytes
    llm = LLM(model=model, quantization=quantization, dtype="bfloat16", max_model_len=2048,
              kv_cache_dtype=kv_cache_dtype, kv_cache_memory_bytes=256 << 20)
    text = open(HELDOUT).read()
    out = llm.generate([text], SamplingParams(max_tokens=1, prompt_logprobs=0),
                       use_tqdm=False)[0]
    ids = out.prompt_token_ids
    lps = [d[t].logprob for d, t in zip(out.prompt_logprobs[1:], ids[1:])]
    ppl = math.exp(-sum(lps) / len(lps))
    params = SamplingParams(temperature=0, max_tokens=DECODE_TOKENS, ignore_eos=True)
    prompt = "The history of the printing press begins"
    llm.generate([prompt], params, use_tqdm=False)
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        best = max(best, DECODE_TOKENS / (time.perf_counter() - start))
    mib = weight_bytes(_model_of(llm)) / 2**20
    del llm
    row = {"format": name, "weights_mib": mib, "ppl": ppl, "tokens": len(lps),
           "decode_tok_s": best}
    print(f"[row] {row}", flush=True)  # each row as soon as it is measured (slow machines)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--format", action="append", default=[],
                        help="bf16 | fp8 | fp8-channel | NAME=CHECKPOINT_DIR (repeatable)")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for fmt in args.format or ["bf16", "fp8"]:
        if "=" in fmt:
            name, path = fmt.split("=", 1)
            rows.append(run_format(name, path, None, args.kv_cache_dtype, args.repeats))
            continue
        if fmt == "fp8-channel":
            os.environ["VLLM_FP8_WEIGHT_SCALE"] = "channel"
        quant = None if fmt == "bf16" else "fp8"
        rows.append(run_format(fmt, args.model, quant, args.kv_cache_dtype, args.repeats))
        os.environ.pop("VLLM_FP8_WEIGHT_SCALE", None)
    base = rows[0]
    print("| format | weights MiB | perplexity | vs first | batch-1 decode tok/s | vs first |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['format']} | {r['weights_mib']:.1f} | {r['ppl']:.3f} | "
              f"{100 * (r['ppl'] / base['ppl'] - 1):+.1f}% | {r['decode_tok_s']:.1f} | "
              f"{r['decode_tok_s'] / base['decode_tok_s']:.2f}x |")
    print(f"({base['tokens']} scored tokens of {os.path.basename(HELDOUT)})")


if __name__ == "__main__":
    main()
