"""Offline batched generation with the embedded default model (SmolLM2-135M-Instruct).

    python examples/offline_inference.py [--model PATH] [--dtype auto|float32|bfloat16]
"""
import argparse

from vllm import LLM, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None, help="HF directory or .gguf (default: "
                        "the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()

    prompts = [
        "The capital of France is",
        "Once upon a time",
        "The three primary colors are",
        "Python is a programming language that",
    ]
    llm = LLM(**({"model": args.model} if args.model else {}), dtype=args.dtype)
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=64, seed=0)
    for out in llm.generate(prompts, params):
        print(f"Prompt: {out.prompt!r}\nGenerated: {out.outputs[0].text!r}\n")

    chat = llm.chat([{"role": "user", "content": "What is 2+2?"}],
                    SamplingParams(temperature=0, max_tokens=32))
    print(f"Chat: {chat[0].outputs[0].text!r}")


if __name__ == "__main__":
    main()
