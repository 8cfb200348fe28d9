"""Embedding throughput (sentences/s): the engine's `LLM.embed` against transformers
running sentence-transformers' recipe, on the same random-weight BERT, same dtype.

The model has all-MiniLM-L6-v2's shape by default (6 layers, hidden 384, 12 heads,
intermediate 1536, vocabulary 30522, mean pooling, normalized) with random weights and a
WordPiece vocabulary built from `data/corpus.txt`, so nothing is downloaded.
sentence-transformers is not installed here; its `encode` is reproduced in plain
transformers: sentences sorted by length (longest first), batches of `--batch-size`
padded to their longest, mean over the attention mask, L2 normalization. Sentences are
corpus sentences of `--min-words` .. `--max-words` words. Repetitions alternate which
backend goes first; each checks the other's vectors (cosine > 0.9999).

    python benchmarks/benchmark_embedding.py --num-sentences 1000
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
import random
import re
import string
import tempfile
import time

import torch

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "corpus.txt")


def corpus_words() -> list[str]:
    with open(CORPUS) as f:
        text = " ".join(line for line in f if not line.startswith("#"))
    return re.findall(r"[a-z]+|[0-9]|[^\sa-z0-9]", text.lower())


def make_model(directory: str, args: argparse.Namespace) -> str:
    """A random BertModel of the given shape + a WordPiece tokenizer + ST pooling files."""
    import json

    import transformers
    words = sorted(set(corpus_words()))
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    pieces = ["##" + c for c in string.ascii_lowercase]
    vocab = specials + [w for w in words if w not in specials] + pieces
    vocab += [f"[unused{i}]" for i in range(max(0, args.vocab_size - len(vocab)))]
    with open(os.path.join(directory, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    transformers.BertTokenizerFast(vocab_file=os.path.join(directory, "vocab.txt"),
                                   do_lower_case=True).save_pretrained(directory)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=args.hidden_size,
                                     num_hidden_layers=args.num_layers,
                                     num_attention_heads=args.num_heads,
                                     intermediate_size=args.intermediate_size,
                                     max_position_embeddings=512)
    torch.manual_seed(args.seed)
    transformers.BertModel(config).save_pretrained(directory)
    os.makedirs(os.path.join(directory, "1_Pooling"), exist_ok=True)
    with open(os.path.join(directory, "modules.json"), "w") as f:
        json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling"}], f)
    with open(os.path.join(directory, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": args.hidden_size,
                   "pooling_mode_mean_tokens": True}, f)
    return directory


def make_sentences(args: argparse.Namespace) -> list[str]:
    words = [w for w in corpus_words() if w.isalpha()]
    rng = random.Random(args.seed)
    out = []
    for _ in range(args.num_sentences):
        n = rng.randint(args.min_words, args.max_words)
        start = rng.randrange(0, len(words) - n)
        out.append(" ".join(words[start:start + n]))
    return out


@torch.inference_mode()
def hf_embed(model, tokenizer, sentences: list[str], batch_size: int) -> list[torch.Tensor]:
    """sentence-transformers' encode: longest first, padded batches, masked mean, L2."""
    order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
    result: list = [None] * len(sentences)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        enc = tokenizer([sentences[i] for i in idx], padding=True, truncation=True,
                        return_tensors="pt")
        hidden = model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        vecs = torch.nn.functional.normalize(mean.float(), dim=-1)
        for j, i in enumerate(idx):
            result[i] = vecs[j]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-sentences", type=int, default=1000)
    parser.add_argument("--min-words", type=int, default=8)
    parser.add_argument("--max-words", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32,
                        help="transformers batch size (sentence-transformers' default)")
    parser.add_argument("--num-layers", type=int, default=6)
    parser.add_argument("--hidden-size", type=int, default=384)
    parser.add_argument("--num-heads", type=int, default=12)
    parser.add_argument("--intermediate-size", type=int, default=1536)
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import transformers

    from vllm import LLM
    directory = make_model(tempfile.mkdtemp(prefix="embed-bench-"), args)
    sentences = make_sentences(args)
    dtype = getattr(torch, args.dtype)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    hf = transformers.BertModel.from_pretrained(directory, dtype=dtype).eval()
    llm = LLM(model=directory, dtype=args.dtype, max_num_seqs=args.max_num_seqs)
    num_tokens = sum(len(t) for t in tokenizer(sentences)["input_ids"])
    print(f"{len(sentences)} sentences, {num_tokens} tokens (mean "
          f"{num_tokens / len(sentences):.1f}); model {args.num_layers} layers x "
          f"{args.hidden_size}, {args.dtype}, {torch.get_num_threads()} threads")
    llm.embed(sentences[:32], use_tqdm=False)  # warm both
    hf_embed(hf, tokenizer, sentences[:32], args.batch_size)

    def run_engine():
        return [torch.tensor(o.outputs.embedding) for o in llm.embed(sentences, use_tqdm=False)]

    def run_hf():
        return hf_embed(hf, tokenizer, sentences, args.batch_size)

    rates: dict[str, list[float]] = {"engine": [], "transformers": []}
    for rep in range(args.repetitions):
        vectors = {}
        runs = [("engine", run_engine), ("transformers", run_hf)]
        for name, fn in (runs if rep % 2 == 0 else runs[::-1]):
            start = time.perf_counter()
            vectors[name] = fn()
            rates[name].append(len(sentences) / (time.perf_counter() - start))
        worst = min(float(torch.nn.functional.cosine_similarity(a, b, dim=0))
                    for a, b in zip(vectors["engine"], vectors["transformers"]))
        assert worst > 0.9999, f"vectors differ: worst cosine {worst}"
        print(f"rep {rep}: engine {rates['engine'][-1]:.1f} sentences/s, transformers "
              f"{rates['transformers'][-1]:.1f} sentences/s (worst cosine {worst:.6f})")
    best = {k: max(v) for k, v in rates.items()}
    print(f"Throughput: engine {best['engine']:.1f} sentences/s, transformers "
          f"{best['transformers']:.1f} sentences/s, ratio "
          f"{best['engine'] / best['transformers']:.2f}x")


if __name__ == "__main__":
    main()
