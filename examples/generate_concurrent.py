"""Sixteen generations at once on one decoder: one batched step for all of them.

    python examples/generate_concurrent.py [MODEL_DIR] [--streams N] [--max-new-tokens N]

``MODEL_DIR`` is a decoder as ``optimum-cli export onnx --task text-generation-with-past``
writes it (``model.onnx``, ``tokenizer.json``); the default is the small random-weight
Llama of the test suite (its text would be noise, so the token ids are printed). Each
stream is a task that iterates ``aioinfer.generate``, handling each token as it comes;
the compiled model's generation scheduler runs every running stream in one inference per
step, so the streams finish together in about the time of one, and the scheduler's
counts show how many steps that took.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
from tokenizers import Tokenizer

import aioinfer as ai
from aioinfer.generation import GenerationConfig, scheduler_of

DEFAULT = Path(__file__).resolve().parent.parent / "tests" / "data" / "decoders" / "llama_gqa"
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "sleeps"]


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args(argv)

    tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    compiled = await ai.Core().compile_model_async(
        args.model_dir / "model.onnx", config={"STATEFUL": "auto"}
    )
    config = {"eos_token_id": [2]}
    generated: dict[int, list[int]] = {}

    async def stream(index: int) -> None:
        prompt = " ".join(WORDS[index % len(WORDS) :] + WORDS[: index % len(WORDS)])
        ids = tokenizer.encode(prompt).ids
        tokens = generated[index] = []
        async for token in ai.generate(
            compiled, ids, max_new_tokens=args.max_new_tokens, config=config
        ):
            tokens.append(token)  # a server would send tokenizer.decode([token]) now

    start = time.perf_counter()
    async with anyio.create_task_group() as group:
        for index in range(args.streams):
            group.start_soon(stream, index)
    elapsed = time.perf_counter() - start
    for index in range(args.streams):
        print(f"{index:2d}: {len(generated[index])} tokens {generated[index][:8]}...")
    scheduler = scheduler_of(compiled, GenerationConfig.for_model(compiled, config))
    assert scheduler is not None  # the decoder has an attention_mask and a KV cache
    counts = scheduler.counts()
    print(
        f"{args.streams} streams, {counts.generated_tokens} tokens in {elapsed:.2f} s: "
        f"{counts.steps} batched decode steps"
    )
    await compiled.close()


if __name__ == "__main__":
    anyio.run(main)
