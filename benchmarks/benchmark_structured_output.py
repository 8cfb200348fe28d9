"""Structured outputs cost: output throughput with a share of JSON-constrained requests.

Runs the same batch twice in one engine (after a warmup batch): every request free,
then `--constrained-fraction` of them constrained by a JSON schema. Every request
produces exactly `--output-len` tokens (free ones with ignore_eos, constrained ones are
held inside a long JSON string), so the two runs do the same model work and the
ratio of their output token rates is the cost of compiling grammars, filling
bitmasks and masking logits.

    python benchmarks/benchmark_structured_output.py --num-prompts 32 --output-len 128
"""
from __future__ import annotations

import argparse
import json
import time

SCHEMA = {"type": "object", "properties": {"text": {"type": "string", "minLength": 4000}},
          "required": ["text"]}
"""Never complete within the output length: constrained requests run to the cap too."""


def run(llm, prompts, params) -> tuple[float, int]:
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outs)


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--constrained-fraction", type=float, default=0.5)
    parser.add_argument("--backend", default="auto", help="structured outputs backend")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=512 << 20)
    args = parser.parse_args()

    kwargs = {"model": args.model} if args.model else {}
    llm = LLM(max_num_seqs=args.num_prompts, kv_cache_memory_bytes=args.kv_cache_memory_bytes,
              structured_outputs_config={"backend": args.backend}, **kwargs)
    prompts = [f"Request {i}: write a JSON object with a long text field." for i in
               range(args.num_prompts)]
    num_constrained = round(args.num_prompts * args.constrained_fraction)

    def params(constrained: bool, seed: int) -> SamplingParams:
        so = StructuredOutputsParams(json=SCHEMA) if constrained else None
        return SamplingParams(temperature=1.0, seed=seed, max_tokens=args.output_len,
                              ignore_eos=True, structured_outputs=so)

    free = [params(False, i) for i in range(args.num_prompts)]
    mixed = [params(i < num_constrained, i) for i in range(args.num_prompts)]
    run(llm, prompts, mixed)  # warmup: model, grammar backend, compiled-grammar cache
    results = {"free": [], "mixed": []}
    for _ in range(args.repeat):
        for name, batch in (("free", free), ("mixed", mixed)):
            elapsed, tokens = run(llm, prompts, batch)
            results[name].append(tokens / elapsed)
    best = {k: max(v) for k, v in results.items()}
    print(f"Unconstrained: {best['free']:.1f} output tokens/s")
    print(f"{num_constrained}/{args.num_prompts} constrained: {best['mixed']:.1f} output "
          f"tokens/s")
    print(f"Ratio: {best['mixed'] / best['free']:.3f}")
    print(json.dumps({"runs": results, "num_prompts": args.num_prompts,
                      "output_len": args.output_len, "constrained": num_constrained}))


if __name__ == "__main__":
    main()
