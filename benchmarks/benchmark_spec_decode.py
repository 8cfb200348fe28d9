"""Batch-1 inter-token latency with and without speculative decoding.

A repetitive workload (the model is asked to repeat text or code it was just
shown, the case prompt lookup is made for) is generated one request at a time,
greedily, for each configuration: no speculation, n-gram proposals, and a draft
model (by default the target itself: every draft is accepted, which shows the
verification mechanics but no gain, the draft costing as much as the target).
Reported per configuration: mean inter-token latency (decode time / (tokens - 1)),
output tokens per second, the draft acceptance rate and mean accepted length, and
whether the tokens equal the no-speculation run's (greedy: they must).

    python benchmarks/benchmark_spec_decode.py --output-len 128 --num-prompts 4
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
import json
import time
from typing import Any, Optional

PARAGRAPH = (
    "The committee met on Tuesday to review the budget for the coming year. After a long "
    "discussion, the members agreed to increase funding for the public library, to repair "
    "the roads near the school, and to plant two hundred trees along the river. The next "
    "meeting will take place in the town hall on the first Monday of the month.")
CODE = (
    "def merge_sorted(a, b):\n    result = []\n    i = j = 0\n    while i < len(a) and j < "
    "len(b):\n        if a[i] <= b[j]:\n            result.append(a[i])\n            i += 1\n"
    "        else:\n            result.append(b[j])\n            j += 1\n    result.extend(a[i:])"
    "\n    result.extend(b[j:])\n    return result\n")
TASKS = [
    f"Repeat the following paragraph word for word.\n\n{PARAGRAPH}",
    f"Copy this Python function exactly, without changes.\n\n{CODE}",
    f"Rewrite this function with the name merge_lists instead.\n\n{CODE}",
    f"Quote the paragraph below, then stop.\n\n{PARAGRAPH}",
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="Target model (default: the embedded one).")
    p.add_argument("--draft-model", default=None,
                   help="Draft model for the draft_model run (default: the target).")
    p.add_argument("--methods", default="none,ngram,draft_model",
                   help="Comma-separated subset of none, ngram, draft_model.")
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--prompt-lookup-min", type=int, default=2)
    p.add_argument("--prompt-lookup-max", type=int, default=4)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-prompts", type=int, default=4)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--output-json", default=None)
    return p


def spec_config(method: str, args: argparse.Namespace, model: str) -> Optional[dict]:
    k = args.num_speculative_tokens
    if method == "none":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k,
                "prompt_lookup_min": args.prompt_lookup_min,
                "prompt_lookup_max": args.prompt_lookup_max}
    if method == "draft_model":
        return {"model": args.draft_model or model, "num_speculative_tokens": k}
    raise ValueError(f"--methods: unknown method {method!r}")


def run_config(method: str, args: argparse.Namespace) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    model = args.model or resolve_model_path(DEFAULT_MODEL)
    llm = LLM(model=model, dtype=args.dtype, max_model_len=2048, max_num_seqs=1,
              speculative_config=spec_config(method, args, model))
    tok = llm.get_tokenizer()
    prompts = [tok.apply_chat_template([{"role": "user", "content": TASKS[i % len(TASKS)]}],
                                       tokenize=False, add_generation_prompt=True)
               for i in range(args.num_prompts)]
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    before = _spec_stats(llm)
    itls, tokens, decode_s, outputs = [], 0, 0.0, []
    for prompt in prompts:  # batch 1: one request at a time
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        m, n = out.metrics, len(out.outputs[0].token_ids)
        itls.append((m.last_token_time - m.first_token_time) / (n - 1))
        tokens += n - 1
        decode_s += m.last_token_time - m.first_token_time
        outputs.append(list(out.outputs[0].token_ids))
    result = {"method": method, "mean_itl_ms": 1000 * sum(itls) / len(itls),
              "decode_tokens_per_s": tokens / decode_s, "token_ids": outputs}
    stats = _spec_stats(llm)
    if stats is not None:
        delta = stats.minus(before)
        result["acceptance_rate"] = delta.acceptance_rate
        result["mean_acceptance_length"] = (1 + delta.num_accepted_tokens / delta.num_drafts
                                            if delta.num_drafts else 1.0)
    del llm
    gc.collect()
    return result


def _spec_stats(llm: Any) -> Any:
    return llm.llm_engine.get_stats().spec_decoding_stats


def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = [run_config(m.strip(), args) for m in args.methods.split(",")]
    reference = results[0]["token_ids"]
    print(f"{'method':<12} {'mean ITL (ms)':>14} {'tokens/s':>9} {'speedup':>8} "
          f"{'acceptance':>11} {'mean len':>9} {'same tokens':>12}")
    for r in results:
        r["speedup"] = results[0]["mean_itl_ms"] / r["mean_itl_ms"]
        r["same_tokens_as_first"] = r["token_ids"] == reference
        acc = f"{100 * r['acceptance_rate']:.1f}%" if "acceptance_rate" in r else "-"
        length = f"{r['mean_acceptance_length']:.2f}" if "acceptance_rate" in r else "-"
        print(f"{r['method']:<12} {r['mean_itl_ms']:>14.2f} {r['decode_tokens_per_s']:>9.1f} "
              f"{r['speedup']:>7.2f}x {acc:>11} {length:>9} {str(r['same_tokens_as_first']):>12}")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump([{k: v for k, v in r.items() if k != "token_ids"} for r in results], f,
                      indent=2)
    return results


if __name__ == "__main__":
    main(build_parser().parse_args())
