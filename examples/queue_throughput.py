"""Throughput with an AsyncInferQueue: the LATENCY and THROUGHPUT hints side by side.

    python examples/queue_throughput.py [MODEL.onnx] [--seconds 3] [--batch 1]
                                        [--backend asyncio|trio]

A queue holds ``OPTIMAL_NUMBER_OF_INFER_REQUESTS`` requests; ``await queue.start_async``
waits (without blocking the loop) for an idle one, so a plain ``for`` loop keeps the
device busy. The callback runs as each job completes and sees its userdata.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import anyio
import numpy as np

import aioinfer as ai
from aioinfer.models import default_model_path


async def run(compiled: ai.CompiledModel, x: np.ndarray, seconds: float) -> tuple[int, float]:
    """Feed ``x`` through a queue for ``seconds``; return (inferences, inferences/s)."""
    done = 0
    classes: set[int] = set()

    def on_done(request: ai.InferRequest, userdata: int) -> None:
        nonlocal done
        done += 1
        classes.add(int(request.results[0][0].argmax()))  # the first output, first row

    async with ai.AsyncInferQueue(compiled) as queue:  # jobs=0: the optimal number
        queue.set_callback(on_done)
        start = time.perf_counter()
        job = 0
        while time.perf_counter() - start < seconds:
            await queue.start_async({compiled.input(0): x}, userdata=job)
            job += 1
        await queue.wait_all()  # drain before the queue closes
        elapsed = time.perf_counter() - start
    assert done == job and classes  # every job's callback ran once
    return done, done / elapsed


async def main(model: Path, seconds: float, batch: int) -> None:
    core = ai.Core()
    port = core.read_model(model).input(0)
    shape = [batch, *(d if isinstance(d, int) else 1 for d in (port.shape or ())[1:])]
    x = np.random.default_rng(0).standard_normal(shape).astype(port.dtype)
    print(f"{model.name}: input {port.name} {shape}, {seconds:g} s per hint")
    for hint in ("LATENCY", "THROUGHPUT"):
        compiled = await core.compile_model_async(model, "CPU", {"PERFORMANCE_HINT": hint})
        streams = compiled.get_property("NUM_STREAMS")
        jobs = compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")
        count, rate = await run(compiled, x, seconds)
        print(
            f"  {hint:10s} {streams} stream(s), {jobs} requests: "
            f"{count:6d} inferences, {rate * batch:9.1f} samples/s"
        )
        await compiled.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", type=Path, default=default_model_path())
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--backend", default="asyncio", choices=("asyncio", "trio"))
    args = parser.parse_args()
    anyio.run(main, args.model, args.seconds, args.batch, backend=args.backend)
