"""Benchmark request sources, all usable without downloads.

Three sources produce the same `SampleRequest` list:

- ``sharegpt``: a ShareGPT-format JSON file (a list of ``{"conversations": [{"from":
  "human"|"gpt", "value": ...}, ...]}``). As in vLLM, the first human turn is the prompt
  and the token length of the reply that follows it is the output length; pairs that are
  too short or too long are skipped.
- ``synthetic``: a seeded ShareGPT look-alike. Prompt and output lengths follow clipped
  log-normal distributions (see `SyntheticConfig`); prompt text is built from the
  project's own corpus (``vllm/benchmarks/data/corpus.txt``) and cut to the sampled length
  with the tokenizer.
- ``random``: fixed (or ranged) lengths with token ids drawn uniformly from the
  tokenizer's vocabulary, special tokens excluded, as vLLM's "random" dataset.

`python -m benchmarks.datasets --dataset-name synthetic --num-prompts N --output F.json`
writes the synthetic set as a ShareGPT JSON, so the very same requests can be fed to
other engines' benchmark scripts for comparison.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import re
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np

logger = logging.getLogger("vllm.benchmarks.datasets")

DATASET_NAMES = ("random", "sharegpt", "synthetic")
CORPUS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "corpus.txt")

# vLLM's ShareGPT filter: drop pairs with fewer than 4 tokens on either side, prompts
# above 1024 tokens and pairs above 2048 tokens in total.
MIN_SEQ_LEN = 4
MAX_PROMPT_LEN = 1024
MAX_TOTAL_LEN = 2048


@dataclass
class SampleRequest:
    """One benchmark request.

    `prompt` is always set (the serving benchmark sends text). `prompt_token_ids` is the
    prompt as the engine tokenizes it; offline benchmarks pass the ids directly when
    `use_token_ids` is set (random mode), so the input length is exact.
    """
    prompt: str
    prompt_len: int
    expected_output_len: int
    prompt_token_ids: list[int]
    use_token_ids: bool = False

    def engine_prompt(self) -> Union[str, dict[str, list[int]]]:
        """The prompt in the form `LLM.generate` takes."""
        if self.use_token_ids:
            return {"prompt_token_ids": list(self.prompt_token_ids)}
        return self.prompt


# --------------------------------------------------------------------------- tokenizer
def get_tokenizer(name_or_path: str) -> Any:
    """Load a tokenizer from a model name, HF directory or .gguf file.

    Goes through `vllm.transformers_utils.config.resolve_model_path`, so the default
    model name and GGUF files map to the same converted directory, and the engine's
    loader, as the engine.
    """
    from vllm.transformers_utils.config import resolve_model_path
    from vllm.transformers_utils.tokenizer import get_tokenizer as load_tokenizer
    return load_tokenizer(resolve_model_path(name_or_path))


def _encode(tokenizer: Any, text: str, add_special_tokens: bool = True) -> list[int]:
    return list(tokenizer(text, add_special_tokens=add_special_tokens).input_ids)


# --------------------------------------------------------------------------- filters
def is_valid_sequence(prompt_len: int, output_len: int, min_len: int = MIN_SEQ_LEN,
                      max_prompt_len: int = MAX_PROMPT_LEN,
                      max_total_len: int = MAX_TOTAL_LEN,
                      skip_min_output_len_check: bool = False) -> bool:
    """vLLM's ShareGPT length filter (the output check is skipped for fixed lengths)."""
    if prompt_len < min_len:
        return False
    if not skip_min_output_len_check and output_len < min_len:
        return False
    return prompt_len <= max_prompt_len and prompt_len + output_len <= max_total_len


def _check_positive(name: str, value: Optional[int]) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}.")


def _total_len_limit(max_model_len: Optional[int]) -> int:
    return MAX_TOTAL_LEN if max_model_len is None else min(MAX_TOTAL_LEN, max_model_len)


# --------------------------------------------------------------------------- ShareGPT
def _first_exchange(entry: Any) -> Optional[tuple[str, str]]:
    """(first human turn, the reply right after it), or None if the entry has none."""
    if not isinstance(entry, dict):
        return None
    turns = entry.get("conversations") or entry.get("conversation")
    if not isinstance(turns, list):
        return None
    for i, turn in enumerate(turns[:-1]):
        if not isinstance(turn, dict) or turn.get("from") not in ("human", "user"):
            continue
        reply = turns[i + 1]
        if isinstance(reply, dict) and isinstance(turn.get("value"), str) and \
                isinstance(reply.get("value"), str):
            return turn["value"], reply["value"]
        return None
    return None


def load_sharegpt_conversations(path: str) -> list[tuple[str, str]]:
    """Read a ShareGPT JSON file into (prompt, reply) pairs, in file order."""
    if not os.path.isfile(path):
        raise ValueError(f"dataset={path!r}: file not found (expected a ShareGPT JSON).")
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"dataset={path!r} is not valid JSON: {e}") from e
    if not isinstance(data, list):
        raise ValueError(f"dataset={path!r}: expected a JSON list of conversations.")
    pairs = [p for p in map(_first_exchange, data) if p is not None]
    if not pairs:
        raise ValueError(f"dataset={path!r} holds no conversation with a human turn followed "
                         "by a reply.")
    return pairs


def sample_sharegpt_requests(path: str, num_requests: int, tokenizer: Any,
                             fixed_output_len: Optional[int] = None, seed: int = 0,
                             max_model_len: Optional[int] = None) -> list[SampleRequest]:
    """Shuffle the file's conversations (seeded) and keep the first `num_requests` valid.

    When fewer are valid, requests are repeated (seeded) to reach `num_requests`, as
    vLLM does, so every run sends the number of requests asked for.
    """
    _check_positive("num_prompts", num_requests)
    _check_positive("output_len", fixed_output_len)
    pairs = load_sharegpt_conversations(path)
    random.Random(seed).shuffle(pairs)
    max_total = _total_len_limit(max_model_len)
    requests: list[SampleRequest] = []
    for prompt, reply in pairs:
        if len(requests) == num_requests:
            break
        ids = _encode(tokenizer, prompt)
        output_len = (len(_encode(tokenizer, reply, add_special_tokens=False))
                      if fixed_output_len is None else fixed_output_len)
        if not is_valid_sequence(len(ids), output_len, max_prompt_len=min(MAX_PROMPT_LEN,
                                 max_total), max_total_len=max_total,
                                 skip_min_output_len_check=fixed_output_len is not None):
            continue
        requests.append(SampleRequest(prompt, len(ids), output_len, ids))
    if not requests:
        raise ValueError(f"dataset={path!r}: no conversation passes the length filter "
                         f"(prompt {MIN_SEQ_LEN}..{MAX_PROMPT_LEN} tokens, total <= "
                         f"{max_total}).")
    return _oversample(requests, num_requests, seed)


def _oversample(requests: list[SampleRequest], num_requests: int,
                seed: int) -> list[SampleRequest]:
    if len(requests) >= num_requests:
        return requests
    extra = random.Random(seed + 1).choices(requests, k=num_requests - len(requests))
    logger.warning("Only %d valid requests in the dataset; repeated some to reach %d.",
                   len(requests), num_requests)
    return requests + extra


# --------------------------------------------------------------------------- synthetic
@dataclass(frozen=True)
class SyntheticConfig:
    """Length distributions of the synthetic ShareGPT look-alike.

    Lengths are ``round(median * exp(sigma * N(0, 1)))``, then clipped to
    ``[min_len, max_prompt_len]`` for prompts and ``[min_len, max_total_len -
    prompt_len]`` for outputs. The defaults put the unclipped means near 215 prompt and
    200 output tokens (log-normal mean = median * exp(sigma^2 / 2)), with the long right
    tail of real chat traffic: the averages commonly reported for filtered ShareGPT
    samples are of that size. ``max_total_len`` is further capped by the model's
    context length.
    """
    prompt_len_median: int = 130
    prompt_len_sigma: float = 1.0
    output_len_median: int = 135
    output_len_sigma: float = 0.9
    min_len: int = MIN_SEQ_LEN
    max_prompt_len: int = MAX_PROMPT_LEN
    max_total_len: int = MAX_TOTAL_LEN

    def __post_init__(self) -> None:
        for name in ("prompt_len_median", "output_len_median", "min_len", "max_prompt_len",
                     "max_total_len"):
            _check_positive(name, getattr(self, name))
        for name in ("prompt_len_sigma", "output_len_sigma"):
            if not 0 <= getattr(self, name) <= 3:
                raise ValueError(f"{name} must be in [0, 3], got {getattr(self, name)}.")
        if self.max_total_len < 2 * self.min_len:
            raise ValueError(f"max_total_len must be >= {2 * self.min_len} (twice min_len), "
                             f"got {self.max_total_len}.")


@dataclass
class Corpus:
    """The shipped text: instruction lines and passage sentences."""
    instructions: list[str]
    sentences: list[str]

    @classmethod
    def load(cls, path: str = CORPUS_PATH) -> "Corpus":
        sections: dict[str, list[str]] = {"instructions": [], "passages": []}
        current = None
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line.startswith("#"):
                    continue
                if line.startswith("[") and line.endswith("]"):
                    current = line[1:-1]
                    continue
                if line and current in sections:
                    sections[current].append(line)
        sentences = [s for para in sections["passages"]
                     for s in re.split(r"(?<=[.!?])\s+", para) if s]
        if not sections["instructions"] or not sentences:
            raise ValueError(f"corpus {path!r} needs [instructions] and [passages] sections.")
        return cls(sections["instructions"], sentences)


def _lognormal_lengths(rng: np.random.Generator, n: int, median: int,
                       sigma: float) -> np.ndarray:
    return np.rint(median * np.exp(sigma * rng.standard_normal(n))).astype(np.int64)


def sample_synthetic_lengths(num_requests: int, seed: int = 0,
                             config: SyntheticConfig = SyntheticConfig(),
                             max_model_len: Optional[int] = None
                             ) -> list[tuple[int, int]]:
    """Seeded (prompt_len, output_len) pairs drawn from `config`'s clipped log-normals."""
    _check_positive("num_prompts", num_requests)
    rng = np.random.default_rng(seed)
    max_total = config.max_total_len if max_model_len is None else min(
        config.max_total_len, max_model_len)
    if max_total < 2 * config.min_len:
        raise ValueError(f"max_model_len={max_model_len} is too small for synthetic requests "
                         f"(needs >= {2 * config.min_len}).")
    max_prompt = min(config.max_prompt_len, max_total - config.min_len)
    prompt = np.clip(_lognormal_lengths(rng, num_requests, config.prompt_len_median,
                                        config.prompt_len_sigma), config.min_len, max_prompt)
    output = _lognormal_lengths(rng, num_requests, config.output_len_median,
                                config.output_len_sigma)
    output = np.clip(output, config.min_len, max_total - prompt)
    return [(int(p), int(o)) for p, o in zip(prompt, output)]


class _TextBuilder:
    """Assembles corpus text of a given token length: instruction, then random sentences.

    Starting with one of many instructions followed by randomly ordered sentences keeps
    different prompts from sharing whole KV blocks, so prefix caching does not flatter
    the numbers.
    """

    def __init__(self, tokenizer: Any, corpus: Corpus, rng: np.random.Generator):
        self.tokenizer = tokenizer
        self.corpus = corpus
        self.rng = rng
        self.sentence_lens = [len(_encode(tokenizer, " " + s, False))
                              for s in corpus.sentences]

    def text(self, num_tokens: int, with_instruction: bool) -> str:
        """Text of at most `num_tokens` tokens (counted as the engine counts a prompt)."""
        parts: list[str] = []
        approx = 0
        if with_instruction:
            parts.append(self.corpus.instructions[
                int(self.rng.integers(len(self.corpus.instructions)))] + "\n\n")
            approx = len(_encode(self.tokenizer, parts[0], False))
        # Overshoot a little: joining pieces changes tokenization at the seams.
        while approx < num_tokens + 8:
            i = int(self.rng.integers(len(self.corpus.sentences)))
            parts.append(self.corpus.sentences[i] + " ")
            approx += self.sentence_lens[i]
        ids = _encode(self.tokenizer, "".join(parts).strip(), False)
        budget = num_tokens - len(_encode(self.tokenizer, ""))  # special tokens, e.g. BOS
        for _ in range(4):
            text = self.tokenizer.decode(ids[:max(budget, 1)])
            excess = len(_encode(self.tokenizer, text)) - num_tokens
            if excess <= 0:
                break
            budget -= excess  # the cut re-tokenized longer; cut a little more
        return text


def sample_synthetic_requests(num_requests: int, tokenizer: Any, seed: int = 0,
                              config: SyntheticConfig = SyntheticConfig(),
                              fixed_output_len: Optional[int] = None,
                              max_model_len: Optional[int] = None) -> list[SampleRequest]:
    """A deterministic (for `seed`) ShareGPT-like request set built without downloads.

    `prompt_len` is the engine's token count of the final text, which may differ from
    the sampled target by a token or two where the cut text re-tokenizes differently.
    """
    _check_positive("output_len", fixed_output_len)
    lengths = sample_synthetic_lengths(num_requests, seed, config, max_model_len)
    builder = _TextBuilder(tokenizer, Corpus.load(), np.random.default_rng(seed + 7919))
    max_total = config.max_total_len if max_model_len is None else min(
        config.max_total_len, max_model_len)
    requests = []
    for prompt_len, output_len in lengths:
        prompt = builder.text(prompt_len, with_instruction=True)
        ids = _encode(tokenizer, prompt)
        if fixed_output_len is not None:
            output_len = fixed_output_len
            if len(ids) + output_len > max_total:
                raise ValueError(f"output_len={fixed_output_len} leaves no room for prompts "
                                 f"within the {max_total}-token limit.")
        requests.append(SampleRequest(prompt, len(ids), output_len, ids))
    return requests


def synthetic_sharegpt_conversations(num_requests: int, tokenizer: Any, seed: int = 0,
                                     config: SyntheticConfig = SyntheticConfig(),
                                     max_model_len: Optional[int] = None
                                     ) -> list[dict[str, Any]]:
    """The synthetic set as ShareGPT entries; each reply has the sampled output length."""
    requests = sample_synthetic_requests(num_requests, tokenizer, seed, config,
                                         max_model_len=max_model_len)
    builder = _TextBuilder(tokenizer, Corpus.load(), np.random.default_rng(seed + 104729))
    return [{"id": f"synthetic-{seed}-{i}",
             "conversations": [{"from": "human", "value": r.prompt},
                               {"from": "gpt",
                                "value": builder.text(r.expected_output_len, False)}]}
            for i, r in enumerate(requests)]


# --------------------------------------------------------------------------- random
def sample_random_requests(num_requests: int, tokenizer: Any, input_len: int,
                           output_len: int, seed: int = 0,
                           range_ratio: float = 0.0) -> list[SampleRequest]:
    """Token ids drawn uniformly from the vocabulary (special tokens excluded).

    With ``range_ratio`` r, lengths are uniform in ``[floor(L * (1 - r)), ceil(L * (1 +
    r))]``; with 0 every request has exactly `input_len` prompt tokens and asks for exactly
    `output_len`. The ids are sent as ids offline; `prompt` (their decoding) is what the
    serving benchmark sends, and may re-tokenize to a slightly different length.
    """
    _check_positive("num_prompts", num_requests)
    _check_positive("input_len", input_len)
    _check_positive("output_len", output_len)
    if not 0 <= range_ratio < 1:
        raise ValueError(f"random_range_ratio must be in [0, 1), got {range_ratio}.")
    rng = np.random.default_rng(seed)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    vocab = np.array([t for t in range(tokenizer.vocab_size) if t not in special])
    in_lens = _ranged_lengths(rng, num_requests, input_len, range_ratio)
    out_lens = _ranged_lengths(rng, num_requests, output_len, range_ratio)
    requests = []
    for n_in, n_out in zip(in_lens, out_lens):
        ids = _round_trip_ids(tokenizer, rng, vocab, int(n_in))
        requests.append(SampleRequest(tokenizer.decode(ids), int(n_in), int(n_out), ids,
                                      use_token_ids=True))
    return requests


def _round_trip_ids(tokenizer: Any, rng: np.random.Generator, vocab: np.ndarray,
                    length: int, attempts: int = 8) -> list[int]:
    """Random ids whose decoded text re-tokenizes to `length` tokens where possible.

    Decoding random ids and encoding the text again merges or splits some tokens; a few
    rounds of re-encode, truncate and top up with fresh ids usually reach a fixed point,
    so the text the serving benchmark sends has the intended length too.
    """
    ids = rng.choice(vocab, size=length).tolist()
    for _ in range(attempts):
        again = _encode(tokenizer, tokenizer.decode(ids), add_special_tokens=False)
        if len(again) == length:
            return ids
        again = again[:length]
        ids = again + rng.choice(vocab, size=length - len(again)).tolist()
    return ids


def _ranged_lengths(rng: np.random.Generator, n: int, length: int,
                    ratio: float) -> np.ndarray:
    low = max(1, math.floor(length * (1 - ratio)))
    high = max(low, math.ceil(length * (1 + ratio)))
    return rng.integers(low, high + 1, size=n)


# --------------------------------------------------------------------------- CLI glue
def add_dataset_args(parser: argparse.ArgumentParser, default_input_len: Optional[int] = None,
                     default_output_len: Optional[int] = None) -> None:
    """The dataset flags shared by the throughput and serving benchmarks."""
    group = parser.add_argument_group("Dataset")
    group.add_argument("--dataset", "--dataset-path", dest="dataset", type=str, default=None,
                       help="Path to a ShareGPT-format JSON file (implies "
                            "--dataset-name sharegpt).")
    group.add_argument("--dataset-name", type=str, default=None, choices=DATASET_NAMES,
                       help="Request source: random (token ids, --input-len/--output-len), "
                            "sharegpt (needs --dataset) or synthetic (built-in ShareGPT "
                            "look-alike). Default: sharegpt with --dataset, else random.")
    group.add_argument("--input-len", "--random-input-len", dest="input_len", type=int,
                       default=default_input_len,
                       help="Prompt tokens per request (random dataset).")
    group.add_argument("--output-len", "--random-output-len", "--sharegpt-output-len",
                       dest="output_len", type=int, default=default_output_len,
                       help="Output tokens per request; overrides the dataset's lengths "
                            "for sharegpt and synthetic.")
    group.add_argument("--random-range-ratio", type=float, default=0.0,
                       help="Random dataset: lengths vary uniformly by this fraction.")
    group.add_argument("--synthetic-prompt-len-median", type=int,
                       default=SyntheticConfig.prompt_len_median,
                       help="Synthetic dataset: median prompt length in tokens.")
    group.add_argument("--synthetic-output-len-median", type=int,
                       default=SyntheticConfig.output_len_median,
                       help="Synthetic dataset: median output length in tokens.")


def resolve_dataset_name(args: argparse.Namespace) -> str:
    if args.dataset_name is None:
        return "sharegpt" if args.dataset else "random"
    if args.dataset_name == "sharegpt" and not args.dataset:
        raise ValueError("dataset_name=sharegpt needs --dataset PATH to a ShareGPT JSON file.")
    if args.dataset and args.dataset_name != "sharegpt":
        raise ValueError(f"--dataset is a ShareGPT file but --dataset-name is "
                         f"{args.dataset_name!r}; drop one of them.")
    return args.dataset_name


def get_requests(args: argparse.Namespace, tokenizer: Any,
                 max_model_len: Optional[int] = None) -> list[SampleRequest]:
    """Build the request list the parsed `add_dataset_args` flags describe."""
    name = resolve_dataset_name(args)
    if name == "sharegpt":
        return sample_sharegpt_requests(args.dataset, args.num_prompts, tokenizer,
                                        args.output_len, args.seed, max_model_len)
    if name == "synthetic":
        config = SyntheticConfig(prompt_len_median=args.synthetic_prompt_len_median,
                                 output_len_median=args.synthetic_output_len_median)
        return sample_synthetic_requests(args.num_prompts, tokenizer, args.seed, config,
                                         args.output_len, max_model_len)
    if args.input_len is None or args.output_len is None:
        raise ValueError("The random dataset needs --input-len and --output-len (>= 1).")
    if max_model_len is not None and args.input_len + args.output_len > max_model_len:
        raise ValueError(f"input_len + output_len = {args.input_len + args.output_len} "
                         f"exceeds max_model_len={max_model_len}.")
    return sample_random_requests(args.num_prompts, tokenizer, args.input_len,
                                  args.output_len, args.seed, args.random_range_ratio)


def main() -> None:
    parser = argparse.ArgumentParser(description="Write a benchmark dataset as ShareGPT JSON.")
    parser.add_argument("--model", type=str, default=None,
                        help="Model whose tokenizer measures lengths (default: the default "
                             "model).")
    parser.add_argument("--tokenizer", type=str, default=None)
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=str, required=True, help="Where to write the JSON.")
    parser.add_argument("--dataset-name", type=str, default="synthetic",
                        choices=["synthetic"])
    args = parser.parse_args()
    from vllm.config import DEFAULT_MODEL
    tokenizer = get_tokenizer(args.tokenizer or args.model or DEFAULT_MODEL)
    data = synthetic_sharegpt_conversations(args.num_prompts, tokenizer, args.seed)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
    print(f"Wrote {len(data)} conversations to {args.output}")


if __name__ == "__main__":
    main()
