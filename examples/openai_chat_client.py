"""Chat with a running vLLM server through the official `openai` client.

    vllm serve HuggingFaceTB/SmolLM2-135M-Instruct --port 8000
    python examples/openai_chat_client.py [--base-url http://localhost:8000/v1]
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
    messages = [{"role": "system", "content": "You are a concise assistant."},
                {"role": "user", "content": "What is the capital of France?"}]

    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=64,
                                           temperature=0)
    print(f"Assistant: {reply.choices[0].message.content}")
    print(f"Usage: {reply.usage}")

    messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                 {"role": "user", "content": "And of Italy?"}]
    print("Assistant (streamed): ", end="", flush=True)
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=64,
                                                temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
    print()


if __name__ == "__main__":
    main()
