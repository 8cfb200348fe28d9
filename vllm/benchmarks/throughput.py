"""Offline throughput: how many requests and tokens per second a batch of requests runs at.

Same flags and output lines as vLLM's script. With ``--backend vllm`` every request goes
to one `LLM.generate` call; ``--backend hf`` runs transformers' `generate` on the same
weights and dtype, batched with left padding, for comparison. Requests always produce
exactly their output length (``ignore_eos``), sampled at temperature 1.0, top_p 1.0
(``--temperature`` changes the temperature of both backends; 0 is greedy).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Optional

from vllm.benchmarks.datasets import (SampleRequest, add_dataset_args, get_requests, get_tokenizer,
                                 resolve_dataset_name)

logger = logging.getLogger("vllm.benchmarks.throughput")

DEFAULT_HF_MAX_BATCH_SIZE = 16


@dataclass
class ThroughputResult:
    elapsed_time: float
    num_requests: int
    total_prompt_tokens: int
    total_output_tokens: int

    @property
    def total_num_tokens(self) -> int:
        return self.total_prompt_tokens + self.total_output_tokens

    def report(self) -> str:
        t = self.elapsed_time
        return (f"Throughput: {self.num_requests / t:.2f} requests/s, "
                f"{self.total_num_tokens / t:.2f} total tokens/s, "
                f"{self.total_output_tokens / t:.2f} output tokens/s\n"
                f"Total num prompt tokens:  {self.total_prompt_tokens}\n"
                f"Total num output tokens:  {self.total_output_tokens}")

    def to_json(self, **extra: Any) -> dict[str, Any]:
        t = self.elapsed_time
        return {"elapsed_time": t, "num_requests": self.num_requests,
                "total_num_tokens": self.total_num_tokens,
                "total_prompt_tokens": self.total_prompt_tokens,
                "total_output_tokens": self.total_output_tokens,
                "requests_per_second": self.num_requests / t,
                "tokens_per_second": self.total_num_tokens / t,
                "output_tokens_per_second": self.total_output_tokens / t, **extra}


# --------------------------------------------------------------------------- vllm
def run_vllm(requests: list[SampleRequest], args: argparse.Namespace) -> ThroughputResult:
    """All requests in one `LLM.generate` call; timing excludes engine start-up."""
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs

    llm = LLM(**dataclasses.asdict(EngineArgs.from_cli_args(args)))
    return time_vllm(llm, requests, args)


def time_vllm(llm: Any, requests: list[SampleRequest],
              args: argparse.Namespace) -> ThroughputResult:
    """One timed `llm.generate` over all requests (uses args.n, args.temperature,
    args.disable_detokenize, args.disable_tqdm)."""
    from vllm import SamplingParams

    extra = {"detokenize": False} if args.disable_detokenize else {}
    params = [SamplingParams(n=args.n, temperature=args.temperature, top_p=1.0,
                             ignore_eos=True, max_tokens=r.expected_output_len, **extra)
              for r in requests]
    prompts = [r.engine_prompt() for r in requests]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=not args.disable_tqdm)
    elapsed = time.perf_counter() - start
    prompt_tokens = sum(len(o.prompt_token_ids or []) for o in outputs)
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    expected = sum(r.expected_output_len for r in requests) * args.n
    if output_tokens != expected:
        logger.warning("The engine generated %d output tokens; the requests asked for %d.",
                       output_tokens, expected)
    return ThroughputResult(elapsed, len(requests), prompt_tokens, output_tokens)


# --------------------------------------------------------------------------- hf
def hf_batches(requests: list[SampleRequest], max_batch_size: int,
               max_model_len: int) -> list[list[SampleRequest]]:
    """Group requests in order, as vLLM's HF runner does.

    A batch grows while it has fewer than `max_batch_size` requests and the padded shape
    (longest prompt + longest output) still fits in the context length.
    """
    batches: list[list[SampleRequest]] = []
    batch: list[SampleRequest] = []
    for req in requests:
        if batch:
            longest_prompt = max(r.prompt_len for r in batch + [req])
            longest_output = max(r.expected_output_len for r in batch + [req])
            if (len(batch) >= max_batch_size
                    or longest_prompt + longest_output > max_model_len):
                batches.append(batch)
                batch = []
        batch.append(req)
    if batch:
        batches.append(batch)
    return batches


def _left_pad(batch: list[SampleRequest], pad_id: int) -> tuple[Any, Any]:
    import torch
    width = max(len(r.prompt_token_ids) for r in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, r in enumerate(batch):
        n = len(r.prompt_token_ids)
        ids[i, width - n:] = torch.tensor(r.prompt_token_ids, dtype=torch.long)
        mask[i, width - n:] = 1
    return ids, mask


def _hf_device(name: str) -> Any:
    import torch
    if name == "hpu":
        import habana_frameworks.torch.core  # noqa: F401  (registers the hpu device)
    return torch.device(name)


def load_hf(model_config: Any, device_name: Optional[str] = None) -> Any:
    """transformers' model on the engine's weights (`model_config.model_path`) and dtype."""
    from transformers import AutoModelForCausalLM

    from vllm.platforms import current_platform

    device = _hf_device(device_name or current_platform.device_type)
    model = AutoModelForCausalLM.from_pretrained(model_config.model_path,
                                                 dtype=model_config.torch_dtype).to(device)
    return model.eval()


def run_hf(requests: list[SampleRequest], args: argparse.Namespace,
           model_config: Any) -> ThroughputResult:
    """transformers `generate` on the engine's weights and dtype (see `time_hf`)."""
    import torch

    model = load_hf(model_config, args.hf_device)
    torch.manual_seed(args.seed)
    return time_hf(model, requests, args, model_config)


def time_hf(model: Any, requests: list[SampleRequest], args: argparse.Namespace,
            model_config: Any) -> ThroughputResult:
    """Timed `generate` calls over `hf_batches` of the requests, left-padded.

    Every row of a batch generates exactly the batch's longest output length
    (min_new_tokens = max_new_tokens, so EOS cannot end it early); like vLLM's script,
    the reported output tokens are the ones the requests asked for. Temperature 0 is
    greedy search; otherwise sampling at that temperature, top_p 1.0, top_k off.
    """
    import torch
    from transformers import GenerationConfig

    device = model.device
    cfg = model_config.hf_config
    pad_id = next((t for t in (getattr(cfg, "pad_token_id", None),
                               getattr(cfg, "eos_token_id", None), 0)
                   if isinstance(t, int)), 0)
    batches = hf_batches(requests, args.hf_max_batch_size, model_config.max_model_len)
    if args.temperature > 0:
        sampling = dict(do_sample=True, temperature=args.temperature, top_p=1.0, top_k=0)
    else:
        sampling = dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    start = time.perf_counter()
    for batch in batches:
        ids, mask = _left_pad(batch, pad_id)
        new_tokens = max(r.expected_output_len for r in batch)
        gen = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                               num_return_sequences=args.n, pad_token_id=pad_id,
                               eos_token_id=getattr(cfg, "eos_token_id", None), **sampling)
        with torch.inference_mode():
            model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                           generation_config=gen)
    elapsed = time.perf_counter() - start
    return ThroughputResult(elapsed, len(requests), sum(r.prompt_len for r in requests),
                            sum(r.expected_output_len for r in requests) * args.n)


# --------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Benchmark offline inference throughput.")
    add_cli_args(parser)
    return parser


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """The flags (also `vllm bench throughput`'s)."""
    from vllm.engine.arg_utils import EngineArgs
    parser.add_argument("--backend", type=str, choices=["vllm", "hf"], default="vllm")
    add_dataset_args(parser)
    parser.add_argument("--n", type=int, default=1,
                        help="Sequences generated per prompt.")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="Sampling temperature of every request, both backends "
                             "(vLLM's script always uses 1.0; 0 = greedy).")
    parser.add_argument("--num-prompts", type=int, default=1000,
                        help="Number of requests to process.")
    parser.add_argument("--hf-max-batch-size", type=int, default=None,
                        help="Most requests per transformers generate call (hf backend; "
                             f"default {DEFAULT_HF_MAX_BATCH_SIZE}).")
    parser.add_argument("--hf-device", type=str, default=None,
                        help="Device for the hf backend (default: the current platform's).")
    parser.add_argument("--output-json", type=str, default=None,
                        help="Path to save the throughput results as JSON.")
    parser.add_argument("--disable-detokenize", action="store_true",
                        help="Do not detokenize outputs (vllm backend).")
    parser.add_argument("--disable-tqdm", action="store_true",
                        help="Hide the progress bar.")
    EngineArgs.add_cli_args(parser)


def validate_args(args: argparse.Namespace) -> None:
    if args.n < 1:
        raise ValueError(f"n must be >= 1, got {args.n}.")
    if args.num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {args.num_prompts}.")
    if args.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {args.temperature}.")
    if args.backend == "hf":
        if args.hf_max_batch_size is None:
            args.hf_max_batch_size = DEFAULT_HF_MAX_BATCH_SIZE
        if args.hf_max_batch_size < 1:
            raise ValueError(f"hf_max_batch_size must be >= 1, got {args.hf_max_batch_size}.")
    elif args.hf_max_batch_size is not None:
        raise ValueError("hf_max_batch_size applies only to --backend hf.")


def main(args: argparse.Namespace) -> ThroughputResult:
    from vllm.transformers_utils.config import create_model_config

    validate_args(args)
    model_config = create_model_config(model=args.model, tokenizer=args.tokenizer,
                                       dtype=args.dtype, max_model_len=args.max_model_len)
    tokenizer = get_tokenizer(model_config.tokenizer_path)
    requests = get_requests(args, tokenizer, model_config.max_model_len)
    if args.backend == "vllm":
        result = run_vllm(requests, args)
    else:
        result = run_hf(requests, args, model_config)
    print(result.report())
    if args.output_json:
        with open(args.output_json, "w") as f:
            dataset = args.dataset or resolve_dataset_name(args)
            json.dump(result.to_json(backend=args.backend, model=args.model, dataset=dataset),
                      f, indent=4)
    return result


if __name__ == "__main__":
    main(build_parser().parse_args())
