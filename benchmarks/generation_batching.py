"""N concurrent generations: the generation scheduler against each generation alone.

    python -m benchmarks.generation_batching MODEL [--streams 1 8 32] [--rounds 3]
        [--prompt-tokens 64] [--new-tokens 64] [--device DEVICE] [--config JSON]

``MODEL`` is a decoder exported by optimum (``scripts/make_decoder.py --bench`` makes the
58M-parameter one of ``benchmarks/generation.py``: ``DIR/onnx/model.onnx``). Compiled
with ``{"STATEFUL": "auto"}`` (no device named unless ``--device``), it runs N concurrent
``aioinfer.generate`` calls, one task each, every stream with its own random prompt,
greedy, end-of-sequence ignored: once through the scheduler (the default) and once with
``"batching": false`` (each generation alone on a request, as before the scheduler),
taking turns within each round. Per mode and N: generated tokens/s (all tokens over the
time to the last one), time to first token and inter-token latency (as each consumer
sees its tokens; p50 and p99), medians over rounds. ``--config`` adds generate keys (the
scheduler's limits, e.g. ``'{"max_step_tokens": 512}'``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from typing import Any

import anyio
import numpy as np

import aioinfer as ai
from benchmarks.compare import machine

MODES = ("batched", "alone")


async def run(
    compiled: ai.CompiledModel,
    streams: int,
    config: dict[str, Any],
    prompt_tokens: int,
    new_tokens: int,
    seed: int,
) -> dict[str, float]:
    """One timed run of ``streams`` concurrent generations: tokens/s, TTFT and ITL."""
    vocab = compiled.output("logits").shape[-1]
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, vocab, prompt_tokens).tolist() for _ in range(streams)]
    times: list[list[float]] = [[] for _ in range(streams)]
    start = time.perf_counter()

    async def one(index: int) -> None:
        tokens = ai.generate(compiled, prompts[index], max_new_tokens=new_tokens, config=config)
        async for _ in tokens:
            times[index].append(time.perf_counter() - start)

    async with anyio.create_task_group() as group:
        for index in range(streams):
            group.start_soon(one, index)
    first = sorted(t[0] for t in times)
    gaps = sorted(b - a for t in times for a, b in itertools.pairwise(t))
    return {
        "tokens/s": sum(map(len, times)) / max(t[-1] for t in times),
        "ttft p50": _quantile(first, 0.5),
        "ttft p99": _quantile(first, 0.99),
        "itl p50": _quantile(gaps, 0.5),
        "itl p99": _quantile(gaps, 0.99),
    }


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--device", default=None)
    parser.add_argument("--config", type=json.loads, default={})
    args = parser.parse_args()
    core = ai.Core()
    settings = {"STATEFUL": "auto"}
    if args.device:
        compiled = core.compile_model(args.model, args.device, settings)
    else:
        compiled = core.compile_model(args.model, config=settings)
    print(machine())
    print("device:", compiled.get_property("EXECUTION_DEVICES"))
    await run(compiled, 2, {"max_new_tokens": 4}, args.prompt_tokens, 4, seed=0)  # warm-up
    print("| N | mode | tokens/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for streams in args.streams:
        runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        for round_ in range(args.rounds):
            for mode in MODES if round_ % 2 == 0 else reversed(MODES):
                config = {**args.config, "batching": mode == "batched"}
                seed = 1000 * round_ + streams
                runs[mode].append(
                    await run(compiled, streams, config, args.prompt_tokens, args.new_tokens, seed)
                )
        for mode, figures in runs.items():
            median = {k: statistics.median(f[k] for f in figures) for k in figures[0]}
            print(
                f"| {streams} | {mode} | {median['tokens/s']:.1f} | "
                f"{median['ttft p50'] * 1000:.0f} ms | {median['ttft p99'] * 1000:.0f} ms | "
                f"{median['itl p50'] * 1000:.1f} ms | {median['itl p99'] * 1000:.1f} ms |",
                flush=True,
            )
    await compiled.close()


if __name__ == "__main__":
    anyio.run(main)
