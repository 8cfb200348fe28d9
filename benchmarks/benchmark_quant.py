"""Quantized formats side by side: weight memory, perplexity, batch-1 decode speed.

For each format the same model is loaded in bf16 (the CPU default), then:
- weight memory: bytes of the model's parameters and buffers after loading;
- perplexity of a fixed held-out text (benchmarks/data/heldout.txt), from the
  engine's own prompt_logprobs: exp(-mean log p(token | prefix));
- batch-1 decode tokens/s: one request, greedy, DECODE_TOKENS new tokens (the median
  of `--repeats` runs after one warm-up run, over `--rounds` interleaved rounds; every
  sample and the load average are printed, the machine may be shared).

A `modules:` prefix on a format (e.g. `modules:int4=DIR`) turns the fused native decode
layer (vllm/cpu/fused_decode.py) off for it: the same weights through the module path. A `+kv8`
suffix (e.g. `bf16+kv8`, `fp8+kv8`) runs that format with `--kv-cache-dtype fp8`
(the checkpoint's KV scales if it has any, else 1.0); a `+kvcalc` suffix runs it with
`--kv-cache-dtype fp8 --calculate-kv-scales`, the scales set by a first pass over the
start of vllm/benchmarks/data/corpus.txt (not by the scored text). Perplexity is also given
for the held-out text's `--parts` consecutive pieces, each scored on its own.

    python benchmarks/quantize_checkpoint.py HuggingFaceTB/SmolLM2-135M-Instruct \\
        /tmp/smollm2-gptq --method gptq --group-size 128 --act-order --mse-clip
    python benchmarks/benchmark_quant.py --format bf16 --format fp8 \\
        --format int4=/tmp/smollm2-gptq --format bf16+kv8 --format fp8+kv8

`--no-decode` measures only memory and perplexity (fp8 decode is very slow on CPUs
without the AVX-512 kernels).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import time

from vllm.benchmarks.datasets import CORPUS_PATH

HELDOUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "heldout.txt")
CORPUS = CORPUS_PATH
CALIBRATION_CHARS = 1500
"""The first pass of a `+kvcalc` format: this much of corpus.txt sets the KV scales."""
DECODE_TOKENS = 64


def _model_of(llm):
    worker = getattr(llm.llm_engine.engine_core.executor, "worker", None)
    if worker is None:
        raise SystemExit("benchmark_quant.py needs the single-process executor.")
    return worker.model_runner.model


def _perplexity(llm, text: str) -> tuple[float, int]:
    from vllm import SamplingParams
    out = llm.generate([text], SamplingParams(max_tokens=1, prompt_logprobs=0),
                       use_tqdm=False)[0]
    ids = out.prompt_token_ids
    lps = [d[t].logprob for d, t in zip(out.prompt_logprobs[1:], ids[1:])]
    return math.exp(-sum(lps) / len(lps)), len(lps)


def _parts(text: str, n: int) -> list[str]:
    """`n` consecutive pieces of `text`, cut at word boundaries."""
    words = text.split()
    size = -(-len(words) // n)
    return [" ".join(words[i:i + size]) for i in range(0, len(words), size)]


def run_format(name: str, model: str, quantization, kv_cache_dtype: str, repeats: int,
               perplexity: bool = True, fused: bool = True, decode: bool = True,
               calculate_kv_scales: bool = False, parts: int = 3):
    from vllm import LLM, SamplingParams
    from vllm.model_executor.model_loader import weight_bytes
    from vllm.cpu import fused_decode as llama_fused
    real_build = llama_fused.FusedDecode.build
    if not fused:  # every decode step through the modules (the "before" of the fused layer)
        llama_fused.FusedDecode.build = classmethod(lambda cls, layers: None)
    try:
        llm = LLM(model=model, quantization=quantization, dtype="bfloat16", max_model_len=2048,
                  kv_cache_dtype=kv_cache_dtype, kv_cache_memory_bytes=256 << 20,
                  calculate_kv_scales=calculate_kv_scales, enable_prefix_caching=False)
        if calculate_kv_scales:
            calibration = open(CORPUS).read()[:CALIBRATION_CHARS]
            llm.generate([calibration], SamplingParams(max_tokens=1), use_tqdm=False)
        ppl, scored, part_ppls = math.nan, 0, []
        if perplexity:
            text = open(HELDOUT).read()
            ppl, scored = _perplexity(llm, text)
            part_ppls = [round(_perplexity(llm, t)[0], 3) for t in _parts(text, parts)]
        params = SamplingParams(temperature=0, max_tokens=DECODE_TOKENS, ignore_eos=True)
        prompt = "The history of the printing press begins"
        if decode:
            llm.generate([prompt], params, use_tqdm=False)
        samples = []
        for _ in range(repeats if decode else 0):
            start = time.perf_counter()
            llm.generate([prompt], params, use_tqdm=False)
            samples.append(DECODE_TOKENS / (time.perf_counter() - start))
        mib = weight_bytes(_model_of(llm)) / 2**20
        del llm
    finally:
        llama_fused.FusedDecode.build = real_build
    row = {"format": name, "weights_mib": mib, "ppl": ppl, "tokens": scored,
           "ppl_parts": part_ppls,
           "decode_tok_s": statistics.median(samples) if samples else math.nan,
           "best": max(samples, default=math.nan),
           "samples": [round(x, 1) for x in samples], "load": os.getloadavg()[0]}
    print(f"[row] {row}", flush=True)  # each row as soon as it is measured (slow machines)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--format", action="append", default=[],
                        help="bf16 | fp8 | fp8-channel | NAME=CHECKPOINT_DIR (repeatable); "
                             "a 'modules:' prefix turns the fused decode layer off")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--parts", type=int, default=3,
                        help="Also score the held-out text's N pieces one by one.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1,
                        help="Run the whole list of formats this many times, interleaved "
                             "(a shared machine's load drifts); the table takes medians.")
    parser.add_argument("--no-perplexity", action="store_true",
                        help="Only weight memory and decode speed (perplexity is slow on "
                             "CPUs without a fast bf16 GEMM).")
    parser.add_argument("--no-decode", action="store_true",
                        help="Only weight memory and perplexity (fp8 decode is very slow on "
                             "CPUs without the AVX-512 kernels).")
    args = parser.parse_args()
    rows: dict[str, list] = {}
    for _ in range(args.rounds):
        for fmt in args.format or ["bf16", "fp8"]:
            rows.setdefault(fmt, []).append(_run_one(fmt, args))
    _table([_merge(fmt, r) for fmt, r in rows.items()])


def _run_one(fmt: str, args) -> dict:
    fused = not fmt.startswith("modules:")
    spec = fmt.split(":", 1)[1] if not fused else fmt
    if args.no_perplexity and args.no_decode:
        raise SystemExit("--no-perplexity and --no-decode leave nothing to measure.")
    kw = dict(perplexity=not args.no_perplexity, fused=fused, decode=not args.no_decode,
              parts=args.parts)
    kv_cache_dtype = args.kv_cache_dtype
    if spec.endswith("+kv8"):
        spec, kv_cache_dtype = spec[:-len("+kv8")], "fp8"
    elif spec.endswith("+kvcalc"):
        spec, kv_cache_dtype = spec[:-len("+kvcalc")], "fp8"
        kw["calculate_kv_scales"] = True
    if "=" in spec:
        name, path = spec.split("=", 1)
        row = run_format(name, path, None, kv_cache_dtype, args.repeats, **kw)
    else:
        if spec == "fp8-channel":
            os.environ["VLLM_FP8_WEIGHT_SCALE"] = "channel"
        quant = None if spec == "bf16" else "fp8"
        row = run_format(spec, args.model, quant, kv_cache_dtype, args.repeats, **kw)
        os.environ.pop("VLLM_FP8_WEIGHT_SCALE", None)
    suffix = next((x for x in ("+kv8", "+kvcalc") if fmt.endswith(x)), "")
    row["format"] = fmt.split("=", 1)[0] + (suffix if "=" in fmt else "")
    return row


def _merge(fmt: str, runs: list[dict]) -> dict:
    """One row per format: medians over rounds and repeats, every sample kept."""
    samples = [x for r in runs for x in r["samples"]]
    return dict(runs[0], decode_tok_s=statistics.median(samples) if samples else math.nan,
                samples=samples,
                load=[round(r["load"], 1) for r in runs])


def _table(rows: list[dict]) -> None:
    import platform
    base = rows[0]
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), platform.processor())
    print(f"CPU: {cpu}; load average (1 min) at the end of each run shown per row")
    print("| format | weights MiB | perplexity | vs first | pieces (vs first) "
          "| batch-1 decode tok/s (median) | vs first | samples | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        pieces = ", ".join(f"{p:.2f} ({100 * (p / b - 1):+.1f}%)"
                           for p, b in zip(r["ppl_parts"], base["ppl_parts"]))
        print(f"| {r['format']} | {r['weights_mib']:.1f} | {r['ppl']:.3f} | "
              f"{100 * (r['ppl'] / base['ppl'] - 1):+.1f}% | {pieces} | "
              f"{r['decode_tok_s']:.1f} | "
              f"{r['decode_tok_s'] / base['decode_tok_s']:.2f}x | {r['samples']} | "
              f"{r['load']} |")
    print(f"({base['tokens']} scored tokens of {os.path.basename(HELDOUT)})")


if __name__ == "__main__":
    main()
