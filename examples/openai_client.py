"""OpenAI's own client against ``aioinfer serve``: a streamed chat, then a completion.

    aioinfer serve tests/data/decoders/llama_gqa --model-name tiny-llama
    python examples/openai_client.py --model tiny-llama [--base-url URL] [--api-key KEY]

Any folder that ``optimum-cli export onnx --task text-generation-with-past`` wrote is
served as it is (its tokenizer, chat template and generation_config.json are read from
the folder). The model in ``tests/data/decoders`` has random weights: its text is
noise, which makes it a fine test of text streamed without splitting a UTF-8 character.
"""

from __future__ import annotations

import argparse
import asyncio

from openai import AsyncOpenAI


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="none", help="the server's --api-key, if any")
    parser.add_argument("--model", default="tiny-llama")
    args = parser.parse_args()
    client = AsyncOpenAI(base_url=args.base_url, api_key=args.api_key)

    models = await client.models.list()
    print("models:", ", ".join(model.id for model in models.data))

    stream = await client.chat.completions.create(
        model=args.model,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    print("chat: ", end="")
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(repr(chunk.choices[0].delta.content), end=" ", flush=True)
        if chunk.usage is not None:
            print(f"\nusage: {chunk.usage.prompt_tokens} + {chunk.usage.completion_tokens} tokens")

    completion = await client.completions.create(
        model=args.model, prompt="Hello", max_tokens=8, temperature=0.8, seed=1, n=2
    )
    for choice in completion.choices:
        print(f"completion {choice.index}: {choice.text!r} ({choice.finish_reason})")
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
