"""Greedy generation with a KV cache kept inside the infer request.

    python examples/generate.py [prompt words] [--max-new-tokens N]

The model is the tiny decoder of ``examples/models/decoder.py`` (built on the fly, in
milliseconds). It has ``past_key_values.*`` inputs and ``present.*`` outputs; compiled
with ``{"STATEFUL": "auto"}`` they become variables of the request, so each step feeds
only the new token: the request keeps the cache between steps. ``aioinfer.generate``
runs the loop (here on a request of our own, to show its cache afterwards) and yields
each token as it comes.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import anyio
from models.decoder import build_decoder, decode, encode

import aioinfer as ai


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
        async for token in ai.generate(
            compiled,
            encode(" ".join(args.prompt)),
            max_new_tokens=args.max_new_tokens,
            stop=encode("."),
            request=request,
        ):
            print(" " + decode([token]), end="", flush=True)
            count += 1
        elapsed = time.perf_counter() - start
        cache = request.query_state()[0]
        print(f"\n{count} tokens in {elapsed * 1000:.0f} ms; {cache.name}: {cache.state.shape}")
    await compiled.close()


if __name__ == "__main__":
    anyio.run(main)
