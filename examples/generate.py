"""Greedy generation with a KV cache kept inside the infer request.

    python examples/generate.py [prompt words] [--max-new-tokens N]

The model is the tiny decoder of ``examples/models/decoder.py`` (built on the fly, in
milliseconds). It has ``past_key_values.*`` inputs and ``present.*`` outputs; compiled
with ``{"STATEFUL": "auto"}`` they become variables of the request, so each step feeds
only the new token: the request keeps the cache between steps.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import AsyncIterator, Sequence

import anyio
import numpy as np
from models.decoder import build_decoder, decode, encode

import aioinfer as ai


async def generate(
    request: ai.InferRequest, prompt: Sequence[int], max_new_tokens: int, stop: int | None = None
) -> AsyncIterator[int]:
    """Yield up to ``max_new_tokens`` greedy tokens after ``prompt`` (ending at ``stop``).

    The first step feeds the whole prompt, every later step one token; the KV cache
    stays in ``request`` (compiled with ``STATEFUL``), which starts from an empty cache.
    """
    request.reset_state()
    ids = np.array([prompt], np.int64)
    for _ in range(max_new_tokens):
        logits = (await request.infer({"input_ids": ids}))["logits"]
        token = int(logits[0, -1].argmax())
        yield token
        if token == stop:
            return
        ids = np.array([[token]], np.int64)


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="*", default=["aioinfer", "keeps"])
    parser.add_argument("--max-new-tokens", type=int, default=30)
    args = parser.parse_args(argv)

    compiled = await ai.Core().compile_model_async(
        build_decoder(recite=True), "CPU", {"STATEFUL": "auto"}
    )
    print(
        "variables:", ", ".join(f"{i} <- {o}" for i, o in compiled.get_property("STATEFUL").items())
    )
    print("inputs:", ", ".join(str(p) for p in compiled.inputs))
    async with compiled.create_infer_request() as request:
        print(" ".join(args.prompt), end="", flush=True)
        start, count = time.perf_counter(), 0
        async for token in generate(
            request, encode(" ".join(args.prompt)), args.max_new_tokens, stop=encode(".")[0]
        ):
            print(" " + decode([token]), end="", flush=True)
            count += 1
        elapsed = time.perf_counter() - start
        cache = request.query_state()[0]
        print(f"\n{count} tokens in {elapsed * 1000:.0f} ms; {cache.name}: {cache.state.shape}")
    await compiled.close()


if __name__ == "__main__":
    anyio.run(main)
