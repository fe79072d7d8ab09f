"""Batch-1 throughput of the CPU device through an AsyncInferQueue, against onnxruntime
driven by a thread pool of the same size, in alternating rounds.

    python -m benchmarks.cpu_queue [--seconds 2] [--rounds 3] [--models tiny_cnn,mlp,cnn]

aioinfer: ``PERFORMANCE_HINT=THROUGHPUT`` (the Core's auto-batching on, as by default,
and off), ``AsyncInferQueue(compiled)`` with ``OPTIMAL_NUMBER_OF_INFER_REQUESTS``
requests kept busy (more with auto-batching: enough to fill the batches). onnxruntime:
one session (intra-op threads: the cores divided by aioinfer's streams, spinning off)
called through ``anyio.to_thread.run_sync`` by as many concurrent callers as each
aioinfer configuration keeps requests, on a capacity limiter of that size. Each round
runs every runtime once; the table gives medians and the median of the per-round
ratios (each configuration against onnxruntime with the same number of callers), and
the process CPU time per inference (what a shared machine's load does not stretch as it
stretches wall time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import onnx

import aioinfer as ai
from aioinfer.models import default_model_path
from aioinfer.properties import num_cores
from benchmarks import models
from benchmarks.compare import machine

MODELS: dict[str, Callable[[], tuple[onnx.ModelProto, dict[str, np.ndarray]]]] = {
    "tiny_cnn": lambda: (
        onnx.load(str(default_model_path())),
        {"image": np.ones((1, 3, 32, 32), np.float32)},
    ),
    "mlp": lambda: (models.mlp(), {"x": np.ones((1, 1024), np.float32)}),
    "cnn": lambda: (models.cnn(), {"x": np.ones((1, 3, 64, 64), np.float32)}),
}
LABELS = {
    "tiny_cnn": "bundled tiny_cnn, 1x3x32x32",
    "mlp": "MLP 4x1024, batch 1",
    "cnn": "CNN 64x64, batch 1",
}


async def _rate(
    start_one: Callable[[], Awaitable[Any]], drain: Callable[[], Awaitable[Any]], seconds: float
) -> tuple[float, float]:
    """(inferences per second, process CPU microseconds per inference)."""
    count = 0
    cpu, start = time.process_time(), time.perf_counter()
    while time.perf_counter() - start < seconds:
        await start_one()
        count += 1
    await drain()
    elapsed = time.perf_counter() - start
    return count / elapsed, (time.process_time() - cpu) / count * 1e6


async def aioinfer_rate(
    compiled: ai.CompiledModel, feed: dict[str, np.ndarray], seconds: float
) -> tuple[float, float]:
    async with ai.AsyncInferQueue(compiled) as queue:
        for _ in range(4 * len(queue)):  # warm-up: memory plans, run times
            await queue.start_async(feed)
        await queue.wait_all()
        return await _rate(lambda: queue.start_async(feed), queue.wait_all, seconds)


async def onnxruntime_rate(
    session: Any, feed: dict[str, np.ndarray], jobs: int, seconds: float
) -> tuple[float, float]:
    limiter = anyio.CapacityLimiter(jobs)
    for _ in range(10):
        session.run(None, feed)
    send, receive = anyio.create_memory_object_stream[None](jobs)

    async def worker() -> None:
        async for _ in receive:
            await anyio.to_thread.run_sync(session.run, None, feed, limiter=limiter)

    async with anyio.create_task_group() as group:
        for _ in range(jobs):
            group.start_soon(worker)

        async def drain() -> None:
            await send.aclose()

        result = await _rate(lambda: send.send(None), drain, seconds)
    return result


def ort_session(model: onnx.ModelProto, streams: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, num_cores() // streams)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


async def run(names: list[str], seconds: float, rounds: int, extra: dict[str, Any]) -> None:
    print(machine())
    print(f"{seconds:g} s per runtime and round, {rounds} rounds; medians\n")
    print(
        "| model | runtime | requests | inferences/s | CPU us/inference | "
        "/ onnxruntime (per-round ratios) |"
    )
    print("|---|---|---:|---:|---:|---|")
    for name in names:
        model, feed = MODELS[name]()
        core = ai.Core()
        variants = {
            "aioinfer THROUGHPUT": core.compile_model(
                model, "CPU", {"PERFORMANCE_HINT": "THROUGHPUT", **extra}
            ),
            "aioinfer THROUGHPUT, no auto-batching": core.compile_model(
                model,
                "CPU",
                {"PERFORMANCE_HINT": "THROUGHPUT", **extra, "ALLOW_AUTO_BATCHING": "NO"},
            ),
        }
        plain = variants["aioinfer THROUGHPUT, no auto-batching"]
        streams = int(plain.get_property("NUM_STREAMS"))
        jobs = {
            k: int(c.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")) for k, c in variants.items()
        }
        session = ort_session(model, streams)
        ort = {n: f"onnxruntime, {n} to_thread callers" for n in sorted(set(jobs.values()))}
        figures: dict[str, list[tuple[float, float]]] = {k: [] for k in [*variants, *ort.values()]}
        for _ in range(rounds):
            for label, compiled in variants.items():
                figures[label].append(await aioinfer_rate(compiled, feed, seconds))
            for n, label in ort.items():
                figures[label].append(await onnxruntime_rate(session, feed, n, seconds))
        for label, measured in figures.items():
            rates = [rate for rate, _ in measured]
            cpu = statistics.median(c for _, c in measured)
            if label in jobs:
                theirs = [rate for rate, _ in figures[ort[jobs[label]]]]
                ratios = [ours / other for ours, other in zip(rates, theirs, strict=True)]
                ratio = (
                    f"**{statistics.median(ratios):.2f}** ("
                    + ", ".join(f"{r:.2f}" for r in ratios)
                    + ")"
                )
                requests = jobs[label]
            else:
                ratio, requests = "", next(n for n, name in ort.items() if name == label)
            print(
                f"| {LABELS[name]} | {label} | {requests} | {statistics.median(rates):,.0f} | "
                f"{cpu:,.0f} | {ratio} |"
            )
        for compiled in variants.values():
            await compiled.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument(
        "--config", default="{}", help="more config for aioinfer, as JSON: '{\"NUM_STREAMS\": 1}'"
    )
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    args = parser.parse_args(argv)
    names, extra = args.models.split(","), json.loads(args.config)
    anyio.run(run, names, args.seconds, args.rounds, extra, backend=args.backend)


if __name__ == "__main__":
    main()
