"""Benchmarks of the async runtime, side by side with onnxruntime in the same run.

    python -m benchmarks.async_runtime [--seconds 3] [--backend asyncio|trio] [--sections abcd]

(a) per-request overhead of ``await request.infer()`` over running the plan directly
    (tiny model, microseconds); (b) event-loop lag percentiles while requests compute,
    next to the control the test suite compares with (the same inferences run on the
    loop itself, blocking it);
(c) AsyncInferQueue throughput with the LATENCY and THROUGHPUT hints on an MLP and a CNN,
    next to onnxruntime (2 intra-op threads) driven by ``anyio.to_thread.run_sync``;
(d) the awaited path on a large model: ``await request.infer()`` against ``infer_sync``
    on the same request of the MLP of ``benchmarks.compare`` (batch 64, LATENCY), in
    alternating rounds of 20 (medians, milliseconds).
Absolute times on shared machines are noise: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable

import anyio
import anyio.to_thread
import numpy as np
import onnx

import aioinfer as ai
from benchmarks import models

try:
    import onnxruntime as ort
except ImportError:  # the comparison is skipped, not faked
    ort = None


def ort_session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    # Spinning workers would tax whatever runs next in this process (see docs/benchmarks.md).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def median_us(fn: Callable[[], object], repeat: int = 2000) -> float:
    for _ in range(50):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


async def amedian_us(fn: Callable[[], Awaitable[object]], repeat: int = 2000) -> float:
    for _ in range(50):
        await fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


async def overhead() -> None:
    model = models.tiny()
    compiled = ai.Core().compile_model(model, "CPU")
    x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
    request = compiled.create_infer_request()
    plan, token = compiled.plan, request._request.cancel_token  # type: ignore[attr-defined]
    direct = median_us(lambda: plan.run([x], token))
    sync = median_us(lambda: request.infer_sync({"x": x}))
    awaited = await amedian_us(lambda: request.infer({"x": x}))
    print("(a) per-request overhead, tiny model (median, microseconds)")
    print(f"    plan.run directly            {direct:8.1f}")
    print(f"    request.infer_sync           {sync:8.1f}  (+{sync - direct:.1f})")
    print(f"    await request.infer          {awaited:8.1f}  (+{awaited - direct:.1f})")
    if ort is not None:
        session = ort_session(model)
        ort_direct = median_us(lambda: session.run(None, {"x": x}))
        ort_thread = await amedian_us(
            lambda: anyio.to_thread.run_sync(lambda: session.run(None, {"x": x}))
        )
        print(f"    onnxruntime session.run      {ort_direct:8.1f}")
        print(
            f"    onnxruntime via to_thread    {ort_thread:8.1f}  (+{ort_thread - ort_direct:.1f})"
        )


async def loop_lag(seconds: float) -> None:
    print(f"(b) event-loop lag (1 ms sleeps) while 4 requests compute the CNN for {seconds:.0f} s")
    model = models.cnn()
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    runners: dict[str, Callable[[], Awaitable[object]]] = {}
    for hint in ("LATENCY", "THROUGHPUT"):
        compiled = ai.Core().compile_model(model, "CPU", {"PERFORMANCE_HINT": hint})
        queue = ai.AsyncInferQueue(compiled, jobs=4)
        runners[f"aioinfer {hint}"] = _queue_runner(queue, x)
    if ort is not None:
        session = ort_session(model)
        runners["onnxruntime to_thread"] = lambda: anyio.to_thread.run_sync(
            lambda: session.run(None, {"x": x})
        )
    blocking = ai.Core().compile_model(model, "CPU").create_infer_request()

    async def on_the_loop() -> None:
        blocking.infer_sync({"x": x})  # blocks the loop for the whole inference
        await anyio.sleep(0)  # then lets the ticker see it

    runners["control: on the loop"] = on_the_loop
    for name, run in runners.items():
        delays = await _lag_while(run, seconds, concurrency=4)
        p50, p99 = np.percentile(delays, [50, 99]) * 1e3
        worst = max(delays) * 1e3
        print(f"    {name:24s} p50 {p50:6.2f} ms   p99 {p99:6.2f} ms   max {worst:6.1f} ms")


def _queue_runner(queue: ai.AsyncInferQueue, x: np.ndarray) -> Callable[[], Awaitable[object]]:
    async def run() -> None:
        await queue.start_async({"x": x})

    return run


async def _lag_while(
    run: Callable[[], Awaitable[object]], seconds: float, concurrency: int
) -> list[float]:
    delays: list[float] = []
    deadline = time.perf_counter() + seconds

    async def ticker() -> None:
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            await anyio.sleep(0.001)
            delays.append(time.perf_counter() - start - 0.001)

    async def worker() -> None:
        while time.perf_counter() < deadline:
            await run()

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        for _ in range(concurrency):
            tg.start_soon(worker)
    return delays


async def throughput(seconds: float) -> None:
    print(f"(c) throughput, batch-1 requests for {seconds:.0f} s each (inferences/s)")
    cases = {
        "MLP 4x1024": (models.mlp(), np.ones((1, 1024), np.float32)),
        "CNN 64x64": (models.cnn(), np.ones((1, 3, 64, 64), np.float32)),
    }
    for label, (model, x) in cases.items():
        rates = {}
        for hint in ("LATENCY", "THROUGHPUT"):
            compiled = ai.Core().compile_model(model, "CPU", {"PERFORMANCE_HINT": hint})
            rates[hint] = await _queue_rate(compiled, x, seconds)
        line = f"    {label:12s} LATENCY {rates['LATENCY']:8.0f}   "
        line += f"THROUGHPUT {rates['THROUGHPUT']:8.0f}"
        if ort is not None:
            rates["ort"] = await _ort_rate(ort_session(model), x, seconds, concurrency=8)
            best = max(rates["LATENCY"], rates["THROUGHPUT"])
            line += f"   onnxruntime {rates['ort']:8.0f}   best/ort {best / rates['ort']:.2f}x"
        print(line)


async def _queue_rate(compiled: ai.CompiledModel, x: np.ndarray, seconds: float) -> float:
    count = 0

    def done(request: ai.AsyncInferRequest, userdata: object) -> None:
        nonlocal count
        count += 1

    async with ai.AsyncInferQueue(compiled) as queue:
        for _ in range(2 * len(queue)):  # warm-up
            await queue.start_async({"x": x})
        await queue.wait_all()
        queue.set_callback(done)
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            await queue.start_async({"x": x})
        await queue.wait_all()
        return count / (time.perf_counter() - start)


async def _ort_rate(
    session: ort.InferenceSession, x: np.ndarray, seconds: float, concurrency: int
) -> float:
    count = 0
    for _ in range(10):
        session.run(None, {"x": x})
    start = time.perf_counter()

    async def worker() -> None:
        nonlocal count
        while time.perf_counter() - start < seconds:
            await anyio.to_thread.run_sync(lambda: session.run(None, {"x": x}))
            count += 1

    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    return count / (time.perf_counter() - start)


async def awaited_large(rounds: int = 3, runs: int = 20) -> None:
    from benchmarks.compare import MODELS, feeds_for

    model = MODELS["mlp"][0]()
    feeds = feeds_for("mlp", model)
    config = {"PERFORMANCE_HINT": "LATENCY"}
    request = ai.Core().compile_model(model, "CPU", config).create_infer_request()
    for _ in range(3):
        request.infer_sync(dict(feeds))
        await request.infer(dict(feeds))
    print("(d) the awaited path on a large model: MLP 4x1024 batch 64 (median, ms)")
    for round_ in range(1, rounds + 1):
        sync, awaited = [], []
        for _ in range(runs):
            start = time.perf_counter()
            request.infer_sync(dict(feeds))
            sync.append(time.perf_counter() - start)
        for _ in range(runs):
            start = time.perf_counter()
            await request.infer(dict(feeds))
            awaited.append(time.perf_counter() - start)
        median_sync, median_awaited = (statistics.median(t) * 1e3 for t in (sync, awaited))
        print(
            f"    round {round_}: infer_sync {median_sync:7.2f}   await infer() "
            f"{median_awaited:7.2f}   ({median_awaited / median_sync:.2f}x)"
        )


async def main(seconds: float, sections: str = "abcd") -> None:
    if "a" in sections:
        await overhead()
    if "b" in sections:
        await loop_lag(seconds)
    if "c" in sections:
        await throughput(seconds)
    if "d" in sections:
        await awaited_large()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--sections", default="abcd", help="which of (a)-(d) to run")
    args = parser.parse_args()
    anyio.run(main, args.seconds, args.sections, backend=args.backend)
