"""Query a running vLLM server with the official `openai` client (completions API).

Start the server first:

    vllm serve HuggingFaceTB/SmolLM2-135M-Instruct --port 8000
    python examples/openai_client.py [--base-url http://localhost:8000/v1] [--api-key KEY]
"""
import argparse

from openai import OpenAI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://localhost:8000/v1")
    parser.add_argument("--api-key", default="EMPTY", help="the server's --api-key, if any")
    args = parser.parse_args()

    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = client.models.list().data[0].id
    print(f"Model: {model}")

    completion = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=16, temperature=0,
        logprobs=2)
    choice = completion.choices[0]
    print(f"Completion: {choice.text!r} (finish_reason={choice.finish_reason})")
    print(f"Top logprobs of the first token: {choice.logprobs.top_logprobs[0]}")
    print(f"Usage: {completion.usage}")

    print("Streaming: ", end="", flush=True)
    stream = client.completions.create(model=model, prompt="Once upon a time", max_tokens=32,
                                       temperature=0.8, seed=0, stream=True,
                                       stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices:
            print(chunk.choices[0].text, end="", flush=True)
        elif chunk.usage:
            print(f"\n[{chunk.usage.completion_tokens} tokens]")

    # vLLM's sampling extras go through extra_body.
    extra = client.completions.create(model=model, prompt="1, 2, 3,", max_tokens=8, n=2,
                                      temperature=0.7, seed=1,
                                      extra_body={"top_k": 20, "repetition_penalty": 1.1})
    for c in extra.choices:
        print(f"Choice {c.index}: {c.text!r}")


if __name__ == "__main__":
    main()
