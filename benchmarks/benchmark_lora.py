"""LoRA throughput: a batch served by the base model vs. the same batch spread over
several adapters (one per request, round robin), in one engine.

The adapters are random PEFT adapters (made with `peft`, rank --lora-rank, on all seven
projections) of the model, so the numbers measure the cost of applying adapters, not
their content. Prints vLLM-style throughput lines and the ratio adapters/base;
``--no-lora-engine`` adds a run of an engine started without --enable-lora.
"""
from __future__ import annotations

import os
import sys

if __package__ in (None, ""):
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import gc
import random
import statistics
import tempfile
import time
from typing import Optional

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapters(model_path: str, count: int, rank: int, out_dir: str) -> list[str]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    import peft.tuners.lora.inc as inc
    inc.is_inc_available = lambda: False  # plain torch layers, whatever else is installed
    paths = []
    for i in range(count):
        base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        torch.manual_seed(i)
        model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank,
                                                target_modules=TARGETS,
                                                init_lora_weights=False))
        path = os.path.join(out_dir, f"adapter{i}")
        model.save_pretrained(path)
        paths.append(path)
    return paths


def run(llm, prompts, params, loras) -> float:
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
    return time.perf_counter() - start


def report(label: str, elapsed: float, n: int, in_len: int, out_len: int,
           samples: Optional[list] = None) -> None:
    spread = ("" if not samples else " (runs: "
              + ", ".join(f"{n * out_len / t:.1f}" for t in samples) + ")")
    print(f"[{label}] Throughput: {n / elapsed:.2f} requests/s, "
          f"{n * (in_len + out_len) / elapsed:.2f} total tokens/s, "
          f"{n * out_len / elapsed:.2f} output tokens/s{spread}")


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    from vllm.lora.request import LoRARequest
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--num-adapters", type=int, default=4)
    parser.add_argument("--max-loras", type=int, default=4)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--kv-cache-mib", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2,
                        help="Runs of each workload (interleaved); the median is reported.")
    parser.add_argument("--adapter-base", default=None,
                        help="Float model the random adapters are made on (same "
                             "architecture), for a quantized --model; default --model.")
    parser.add_argument("--no-fused-decode", action="store_true",
                        help="Turn the fused native decode layer off (every step through "
                             "the modules), to compare with it on.")
    parser.add_argument("--no-lora-engine", action="store_true",
                        help="Also time an engine started without --enable-lora.")
    args = parser.parse_args()
    if args.no_fused_decode:
        from vllm.cpu import fused_decode as llama_fused
        llama_fused.FusedDecode.build = classmethod(lambda cls, layers: None)
    model_path = resolve_model_path(args.model)
    tmp = tempfile.mkdtemp(prefix="lora-bench-")
    adapter_base = resolve_model_path(args.adapter_base) if args.adapter_base else model_path
    paths = make_adapters(adapter_base, args.num_adapters, args.lora_rank, tmp)
    loras = [LoRARequest(f"adapter{i}", i + 1, p) for i, p in enumerate(paths)]
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(100, 20000) for _ in range(args.input_len)]}
               for _ in range(args.num_prompts)]
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    mix = [loras[i % len(loras)] for i in range(args.num_prompts)]
    n, i_len, o_len = args.num_prompts, args.input_len, args.output_len

    engine_kwargs = dict(dtype=args.dtype, enable_prefix_caching=False,
                         max_model_len=args.input_len + args.output_len + 16,
                         kv_cache_memory_bytes=args.kv_cache_mib << 20)
    llm = LLM(args.model, enable_lora=True, max_loras=args.max_loras,
              max_lora_rank=max(16, args.lora_rank), **engine_kwargs)
    run(llm, prompts[:8], params, mix[:8])  # warm up (and load every adapter once)
    run(llm, prompts[8:16], params, None)
    base_s, mixed_s = [], []
    for _ in range(args.repeats):  # interleaved: a shared machine's load drifts
        base_s.append(run(llm, prompts, params, None))
        mixed_s.append(run(llm, prompts, params, mix))
    base, mixed = statistics.median(base_s), statistics.median(mixed_s)
    report("base model, LoRA engine", base, n, i_len, o_len, base_s)
    report(f"{len(loras)} adapters mixed", mixed, n, i_len, o_len, mixed_s)
    print(f"adapters / base throughput: {base / mixed:.2f}x")
    del llm
    gc.collect()
    if args.no_lora_engine:
        plain = LLM(args.model, **engine_kwargs)
        run(plain, prompts[:8], params, None)
        plain_s = [run(plain, prompts, params, None) for _ in range(args.repeats)]
        t = statistics.median(plain_s)
        report("base model, engine without LoRA", t, n, i_len, o_len, plain_s)
        print(f"adapters / engine without LoRA: {t / mixed:.2f}x")
    print(f"(medians of {args.repeats} runs; load average now {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
