"""The ORT device against onnxruntime used directly, in one process.

    python -m benchmarks.ort_device [--rounds 4] [--seconds 1.0] [--trials 30]
                                    [--backend asyncio|trio] [--sections 1,2,3,4,5,6]
                                    [--device ORT|AUTO]

(1) Latency: ``await request.infer()`` on ORT (``--device``; AUTO: ``compile_model(model)``,
    LATENCY hint: one stream, intra-op threads = cores) against ``session.run`` of a
    session with onnxruntime's default options (what a user of onnxruntime has: the
    headline ratio, with its geometric mean and worst), and against ``session.run`` on
    the compiled model's own session, over models of benchmarks/models.py and the
    bundled tiny CNN; median of each side, their ratio and the geometric mean of the
    ratios. The compiled model's ``session.run`` is called back to
    back, and, in a second column, 10 us apart (only the run timed); a third column
    runs a session with one intra-op thread (what ORT uses for short runs, see
    ``ORT_SINGLE_THREAD_RUN_US``), and the last ratio is to the faster of the two
    sessions in each round.
(2) Throughput, batch 1: an AsyncInferQueue on ORT (THROUGHPUT hint, and the other
    stream/thread splits for comparison) against the same kind of session driven by
    ``anyio.to_thread.run_sync`` with as many concurrent callers and a limit of as many
    threads as the device has streams; with the CPU time per inference of the event
    loop's thread and of the process on each side.
(3) Event-loop lag (1 ms sleeps, p50/p99) while 4 requests compute, on ORT (spinning
    200 us, the default, and off, one intra-op thread, compute threads at a lower
    priority) and on the CPU device.
(4) Cancellation: from the cancel to the return of the awaiting task, at a random point
    of a run, against the full run, one kernel's time (PERF_COUNT) and the thread hop.
(5) onnxruntime's intra-op spinning off and on (the default): latency, and the CPU time
    each inference costs the process when inferences arrive 1 ms apart.
(6) aioinfer's own time per call: ``await request.infer()``, ``infer_sync`` and
    ``session.run`` on a one-Relu model, fastest of 30 interleaved blocks (robust to
    load: a block that other processes disturbed is never the fastest).

Every comparison alternates its sides in blocks (ABBA within each round), each block
starting with untimed warm-up runs, so that onnxruntime's spinning threads or a burst of
load from other processes tax both sides alike. Times are the medians of all timed runs
of a side; a ratio is the median over rounds of the ratio of one round's blocks.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import anyio
import anyio.to_thread
import numpy as np
import onnx
import onnxruntime as ort

import aioinfer as ai
from aioinfer.models import default_model_path
from benchmarks import models
from benchmarks.compare import geomean, machine

Feed = dict[str, np.ndarray]

PAUSE = 10e-6
"""Seconds between the direct runs of the "apart" column: any caller does some work
between runs, and onnxruntime's intra-op threads (spinning off) fall asleep within a few
microseconds; the next run then pays to wake them."""


def _rand(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def chain(steps: int = 400, width: int = 384) -> onnx.ModelProto:
    """(MatMul, Tanh) x ``steps``: a run of many small kernels, for cancellation."""
    import onnx.helper as oh

    weight = (_rand(width, width) / np.sqrt(width)).astype(np.float32)
    nodes, last = [], "x"
    for i in range(steps):
        nodes.append(oh.make_node("MatMul", [last, "w"], [f"m{i}"], name=f"matmul{i}"))
        last = "y" if i == steps - 1 else f"t{i}"
        nodes.append(oh.make_node("Tanh", [f"m{i}"], [last], name=f"tanh{i}"))
    graph = oh.make_graph(
        nodes,
        "chain",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", width])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", width])],
        [onnx.numpy_helper.from_array(weight, "w")],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", models.OPSET)])


def latency_set() -> list[tuple[str, onnx.ModelProto, Feed]]:
    """(name, model, inputs): from well under a millisecond to tens of milliseconds."""
    squeezenet = models.light_model("squeezenet")
    image = _rand(1, 3, 224, 224)
    return [
        (
            "tiny CNN (bundled), batch 1",
            onnx.load(default_model_path()),
            {"image": _rand(1, 3, 32, 32)},
        ),
        ("LSTM 2x50, 50 steps x 4", models.lstm(), {"x": _rand(50, 4, 50)}),
        ("MLP 4x1024, batch 1", models.mlp(), {"x": _rand(1, 1024)}),
        ("CNN 64x64, batch 1", models.cnn(), {"x": _rand(1, 3, 64, 64)}),
        ("MLP 4x1024, batch 64", models.mlp(), {"x": _rand(64, 1024)}),
        ("SqueezeNet, 1x3x224x224", squeezenet, {squeezenet.graph.input[0].name: image}),
        ("ResNet-18-like, 1x3x224x224", models.resnet18(), {"x": _rand(1, 3, 224, 224)}),
    ]


def session_like(
    compiled: ai.CompiledModel, model: onnx.ModelProto, threads: int = 0
) -> ort.InferenceSession:
    """A plain session with the options of the compiled model's session (``threads``:
    that many intra-op threads instead)."""
    used = compiled.session.get_session_options()  # type: ignore[attr-defined]
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or used.intra_op_num_threads
    for key in ("session.intra_op.allow_spinning", "session.intra_op.spin_duration_us"):
        with contextlib.suppress(RuntimeError):  # not set on the compiled model's session
            options.add_session_config_entry(key, used.get_session_config_entry(key))
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


async def timed_runs(run: Callable[[], Awaitable[object]], seconds: float) -> list[float]:
    """Warm-up for a tenth of ``seconds`` (at least 5 runs), then runs for ``seconds``; a
    run that returns a number returns its own duration (it times only a part)."""
    end = time.perf_counter() + seconds / 10
    for _ in range(5):
        await run()
    while time.perf_counter() < end:
        await run()
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 5:
        start = time.perf_counter()
        own = await run()
        times.append(own if isinstance(own, float) else time.perf_counter() - start)
    return times


async def alternate(sides: dict[str, Any], rounds: int, measure: Callable) -> dict[str, list]:
    """``measure(side)`` for each side, ``rounds`` times, in ABBA order."""
    names = list(sides)
    results: dict[str, list] = {name: [] for name in names}
    for index in range(rounds):
        order = names if index % 2 == 0 else names[::-1]
        for name in order:
            results[name].append(await measure(sides[name]))
    return results


def pooled_ms(blocks: list[list[float]]) -> float:
    """The median of every timed run of one side, in milliseconds."""
    return statistics.median(t for block in blocks for t in block) * 1e3


def round_ratio(ours: list[list[float]], theirs: list[list[float]]) -> float:
    """The median over rounds of the ratio of the two sides' block medians: each ratio
    compares blocks run next to each other, so load that comes and goes cancels out."""
    return statistics.median(
        statistics.median(a) / statistics.median(b) for a, b in zip(ours, theirs)
    )


# -- (1) latency -------------------------------------------------------------------------


def default_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """A session with onnxruntime's default options (CPU provider)."""
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


async def latency(core: ai.Core, rounds: int, seconds: float, device_name: str = "ORT") -> None:
    print(
        f"(1) latency, LATENCY hint: await request.infer() on {device_name} vs session.run directly"
    )
    print(
        "| model | ORT ms | onnxruntime defaults ms | ratio | session.run ms | ratio "
        "| session.run 10 us apart ms | ratio "
        "| session.run, 1 thread ms | ratio to the faster session |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ratios, ratios_apart, ratios_best, ratios_default = [], [], [], []
    for name, model, feed in latency_set():
        compiled = core.compile_model(model, device_name, {"PERFORMANCE_HINT": "LATENCY"})
        # AUTO: the compiled model it chose, whose session the direct columns copy.
        engine = getattr(compiled, "target", compiled)
        if not hasattr(engine, "session"):
            print(f"| {name} | {device_name} chose {engine.get_property('DEVICE_NAME')} |")
            await compiled.close()
            continue
        request = compiled.create_infer_request()
        session = engine.session
        one_thread = session_like(engine, model, threads=1)
        defaults = default_session(model)

        async def default(session: ort.InferenceSession = defaults, feed: Feed = feed) -> None:
            session.run(None, feed)

        async def single(session: ort.InferenceSession = one_thread, feed: Feed = feed) -> None:
            session.run(None, feed)

        async def device(request: ai.AsyncInferRequest = request, feed: Feed = feed) -> None:
            await request.infer(feed)

        async def direct(session: ort.InferenceSession = session, feed: Feed = feed) -> None:
            session.run(None, feed)

        async def paused(session: ort.InferenceSession = session, feed: Feed = feed) -> float:
            pause = time.perf_counter() + PAUSE
            while time.perf_counter() < pause:  # the caller's own work between runs
                pass
            start = time.perf_counter()
            session.run(None, feed)
            return time.perf_counter() - start

        measure = functools.partial(timed_runs, seconds=seconds / 3)
        sides = {
            "ORT": device,
            "default": default,
            "direct": direct,
            "paused": paused,
            "single": single,
        }
        got = await alternate(sides, rounds, measure)
        ours, usual, theirs, apart, alone = (pooled_ms(got[side]) for side in sides)
        ratio, ratio_apart, ratio_default = (
            round_ratio(got["ORT"], got[side]) for side in ("direct", "paused", "default")
        )
        ratios_default.append(ratio_default)
        faster = [min(a, b, key=statistics.median) for a, b in zip(got["direct"], got["single"])]
        ratio_best = round_ratio(got["ORT"], faster)
        ratios.append(ratio)
        ratios_apart.append(ratio_apart)
        ratios_best.append(ratio_best)
        print(
            f"| {name} | {ours:.3f} | {usual:.3f} | {ratio_default:.2f} | {theirs:.3f} "
            f"| {ratio:.2f} | {apart:.3f} | {ratio_apart:.2f} | {alone:.3f} | {ratio_best:.2f} |",
            flush=True,
        )
        await compiled.close()
    print(
        f"| geometric mean of the ratios (worst) | | | {geomean(ratios_default):.2f} "
        f"({max(ratios_default):.2f}) | | {geomean(ratios):.2f} "
        f"| | {geomean(ratios_apart):.2f} | | {geomean(ratios_best):.2f} |"
    )


# -- (2) throughput ----------------------------------------------------------------------


class Rate(NamedTuple):
    """One block of a throughput side."""

    per_second: float
    """Inferences per second."""
    loop_us: float
    """CPU time of the event loop's thread per inference, in microseconds: aioinfer's own
    work (or the glue's), which load from other processes hardly changes."""
    process_us: float
    """CPU time of the whole process per inference (compute included)."""


async def _counted(run: Callable[[], Awaitable[int]], seconds: float) -> Rate:
    """Time ``run()`` (which returns how many inferences it completed)."""
    wall, loop, process = time.perf_counter(), time.thread_time(), time.process_time()
    done = await run()
    wall = time.perf_counter() - wall
    loop, process = time.thread_time() - loop, time.process_time() - process
    return Rate(done / wall, loop / done * 1e6, process / done * 1e6)


async def queue_rate(compiled: ai.CompiledModel, feed: Feed, seconds: float) -> Rate:
    queue = ai.AsyncInferQueue(compiled)
    done = 0

    async def count(request: ai.AsyncInferRequest, userdata: object) -> None:
        nonlocal done
        done += 1

    async def run() -> int:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            await queue.start_async(feed)
        await queue.wait_all()
        return done

    queue.set_callback(count)
    end = time.perf_counter() + seconds / 5
    while time.perf_counter() < end:  # warm-up
        await queue.start_async(feed)
    await queue.wait_all()
    done = 0
    rate = await _counted(run, seconds)
    await queue.close()
    return rate


async def threads_rate(
    session: ort.InferenceSession, feed: Feed, callers: int, threads: int, seconds: float
) -> Rate:
    limiter = anyio.CapacityLimiter(threads)
    done = 0

    async def caller(until: float, counting: bool) -> None:
        nonlocal done
        while time.perf_counter() < until:
            await anyio.to_thread.run_sync(session.run, None, feed, limiter=limiter)
            done += counting

    async def run() -> int:
        async with anyio.create_task_group() as group:
            for _ in range(callers):
                group.start_soon(caller, time.perf_counter() + seconds, True)
        return done

    async with anyio.create_task_group() as group:
        for _ in range(callers):
            group.start_soon(caller, time.perf_counter() + seconds / 5, False)
    return await _counted(run, seconds)


async def throughput(core: ai.Core, rounds: int, seconds: float) -> None:
    print()
    print("(2) throughput, batch 1 (inferences/s): AsyncInferQueue on ORT vs to_thread glue;")
    print("    ratio: median over rounds of the two sides' rates in the round (ABBA blocks);")
    print("    loop us and CPU us: the loop thread's and the process's CPU time per inference")
    cases = [
        ("MLP 4x1024", models.mlp(), {"x": _rand(1, 1024)}),
        ("tiny CNN", onnx.load(default_model_path()), {"image": _rand(1, 3, 32, 32)}),
    ]
    configs = {
        "THROUGHPUT (2 streams x 1 thread)": {"PERFORMANCE_HINT": "THROUGHPUT"},
        "1 stream x 2 threads": {"NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": 2},
        "2 streams x 2 threads": {"NUM_STREAMS": 2, "INFERENCE_NUM_THREADS": 4},
    }
    print(
        "| model | ORT config | ORT inf/s | glue inf/s (same threads) | ratio "
        "| loop us ORT | glue | CPU us ORT | glue |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, model, feed in cases:
        for label, config in configs.items():
            compiled = core.compile_model(model, "ORT", config)
            streams = compiled.get_property("NUM_STREAMS")
            callers = compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")
            callers = max(callers, 2 * streams)
            session = session_like(compiled, model)
            sides = {
                "ORT": functools.partial(queue_rate, compiled, feed, seconds),
                "glue": functools.partial(threads_rate, session, feed, callers, streams, seconds),
            }
            got = await alternate(sides, rounds, lambda measure: measure())
            ours, theirs = got["ORT"], got["glue"]
            ratio = statistics.median(a.per_second / b.per_second for a, b in zip(ours, theirs))
            cells = [
                statistics.median(getattr(rate, field) for rate in side)
                for field in ("per_second", "loop_us", "process_us")
                for side in (ours, theirs)
            ]
            print(
                f"| {name} | {label} | {cells[0]:.0f} | {cells[1]:.0f} | {ratio:.2f} "
                f"| {cells[2]:.0f} | {cells[3]:.0f} | {cells[4]:.0f} | {cells[5]:.0f} |"
            )
            await compiled.close()


# -- (3) event-loop lag ------------------------------------------------------------------


async def lag_while_computing(
    compiled: ai.CompiledModel, feed: Feed, seconds: float
) -> list[float]:
    """Delays of a 1 ms ticker while 4 requests compute back to back."""
    delays: list[float] = []
    requests = [compiled.create_infer_request() for _ in range(4)]
    end = time.perf_counter() + seconds

    async def worker(request: ai.AsyncInferRequest) -> None:
        while time.perf_counter() < end:
            await request.infer(feed)

    async def ticker() -> None:
        while time.perf_counter() < end:
            start = time.perf_counter()
            await anyio.sleep(0.001)
            delays.append(time.perf_counter() - start - 0.001)

    async with anyio.create_task_group() as group:
        group.start_soon(ticker)
        for request in requests:
            group.start_soon(worker, request)
    return delays


async def loop_lag(core: ai.Core, rounds: int, seconds: float) -> None:
    print()
    print("(3) event-loop lag (1 ms sleeps) while 4 requests compute, CNN 64x64 batch 8")
    model, feed = models.cnn(), {"x": _rand(8, 3, 64, 64)}
    sides = {
        "ORT": core.compile_model(model, "ORT"),
        "ORT, spinning off": core.compile_model(model, "ORT", {"ORT_ALLOW_SPINNING": False}),
        "ORT, 1 thread": core.compile_model(model, "ORT", {"INFERENCE_NUM_THREADS": 1}),
        "ORT, ORT_THREAD_NICE=10": core.compile_model(model, "ORT", {"ORT_THREAD_NICE": 10}),
        "CPU": core.compile_model(model, "CPU"),
    }

    async def measure(compiled: ai.CompiledModel) -> list[float]:
        await compiled.create_infer_request().infer(feed)  # warm-up
        return await lag_while_computing(compiled, feed, seconds)

    got = await alternate(sides, rounds, measure)
    print("| device | p50 ms | p99 ms (median of rounds) | p99 / CPU's p99 (median of rounds) |")
    print("|---|---:|---:|---:|")
    cpu_p99 = [np.percentile(b, 99) for b in got["CPU"]]
    for name, blocks in got.items():
        p50 = statistics.median(np.percentile(b, 50) for b in blocks) * 1e3
        p99s = [np.percentile(b, 99) for b in blocks]
        ratio = statistics.median(a / b for a, b in zip(p99s, cpu_p99))
        print(f"| {name} | {p50:.2f} | {statistics.median(p99s) * 1e3:.2f} | {ratio:.2f} |")
    for compiled in sides.values():
        await compiled.close()


# -- (4) cancellation --------------------------------------------------------------------


async def cancelled_return(request: ai.AsyncInferRequest, feed: Feed, after: float) -> float | None:
    """Seconds from cancelling an inference ``after`` seconds into it until its awaiting
    task returned (None when it completed first)."""
    cancelled_at = 0.0
    with anyio.CancelScope() as scope:

        async def cancel_later() -> None:
            nonlocal cancelled_at
            await anyio.sleep(after)
            cancelled_at = time.perf_counter()
            scope.cancel()

        async with anyio.create_task_group() as group:
            group.start_soon(cancel_later)
            await request.infer(feed)
    if cancelled_at and isinstance(request.error, ai.InferCancelledError):
        return time.perf_counter() - cancelled_at
    return None


async def kernel_times(core: ai.Core, model: onnx.ModelProto, feed: Feed) -> tuple[float, float]:
    """The median and the longest node time (seconds) of one run, from PERF_COUNT."""
    compiled = core.compile_model(model, "ORT", {"PERF_COUNT": True})
    request = compiled.create_infer_request()
    for _ in range(3):
        await request.infer(feed)
    times = [e["seconds"] for e in request.get_profiling_info() if e["type"] == "node"]
    await compiled.close()
    return statistics.median(times), max(times)


async def thread_hop(count: int = 200) -> float:
    """The median round trip of an empty stage through a compute thread (seconds)."""
    from aioinfer.plugin.executors import ThreadExecutor

    executor = ThreadExecutor("hop", 1)
    times = []
    for _ in range(count):
        start = time.perf_counter()
        await executor.run(lambda: None)
        times.append(time.perf_counter() - start)
    executor.close()
    return statistics.median(times)


async def cancellation(core: ai.Core, trials: int) -> None:
    print()
    print("(4) cancellation: from the cancel to the return of the awaiting task, against one")
    print("    kernel's time (PERF_COUNT) plus the hop to a compute thread and back")
    hop = await thread_hop()
    print(f"    thread hop (empty stage, median): {hop * 1e3:.3f} ms")
    print(
        "| model | full run ms | kernel ms, median | longest | cancel -> return ms, median "
        "| p90 | max | median <= longest kernel + hop |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    cases = [
        ("chain of 800 small kernels, 256x384", chain(), {"x": _rand(256, 384)}),
        ("ResNet-18-like, 1x3x224x224", models.resnet18(), {"x": _rand(1, 3, 224, 224)}),
    ]
    rng = random.Random(0)
    for name, model, feed in cases:
        kernel, longest = await kernel_times(core, model, feed)
        compiled = core.compile_model(model, "ORT")
        request = compiled.create_infer_request()
        await request.infer(feed)
        fulls = []
        for _ in range(3):
            start = time.perf_counter()
            await request.infer(feed)
            fulls.append(time.perf_counter() - start)
        full = statistics.median(fulls)
        latencies = []
        for _ in range(trials):
            seconds = await cancelled_return(request, feed, full * rng.uniform(0.1, 0.8))
            if seconds is not None:
                latencies.append(seconds)
        ms = sorted(t * 1e3 for t in latencies)
        p90 = ms[int(0.9 * (len(ms) - 1))]
        within = "yes" if statistics.median(ms) <= (longest + hop) * 1e3 else "no"
        print(
            f"| {name} | {full * 1e3:.1f} | {kernel * 1e3:.3f} | {longest * 1e3:.2f} "
            f"| {statistics.median(ms):.2f} | {p90:.2f} | {ms[-1]:.2f} | {within} |"
        )
        await compiled.close()


# -- (5) spinning -----------------------------------------------------------------------


async def spinning(core: ai.Core, rounds: int, seconds: float) -> None:
    print()
    print("(5) ORT with intra-op spinning off and on (LATENCY): latency back to back, and")
    print("    the process's CPU time per inference when one arrives every millisecond")
    print("| model | latency off ms | on ms | on/off | CPU per inference off ms | on ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, model, feed in latency_set()[:4]:
        sides, requests = {}, {}
        for label, spin in (("off", False), ("on", True)):
            compiled = core.compile_model(model, "ORT", {"ORT_ALLOW_SPINNING": spin})
            requests[label] = compiled.create_infer_request()
            sides[label] = functools.partial(requests[label].infer, feed)
        measure = functools.partial(timed_runs, seconds=seconds / 2)
        got = await alternate(sides, rounds, measure)
        off, on = pooled_ms(got["off"]), pooled_ms(got["on"])
        cpu = await alternate(requests, rounds, functools.partial(cpu_per_inference, feed=feed))
        cpu_off, cpu_on = (statistics.median(cpu[k]) * 1e3 for k in ("off", "on"))
        print(
            f"| {name} | {off:.3f} | {on:.3f} | {round_ratio(got['on'], got['off']):.2f} "
            f"| {cpu_off:.3f} | {cpu_on:.3f} |"
        )


async def cpu_per_inference(request: ai.AsyncInferRequest, feed: Feed, count: int = 200) -> float:
    """Process CPU seconds per inference with 1 ms between inferences (what spinning
    threads burn while they wait for the next one counts too)."""
    await request.infer(feed)
    start = time.process_time()
    for _ in range(count):
        await request.infer(feed)
        await anyio.sleep(0.001)
    await anyio.sleep(0.01)  # spinning goes on for a while after the last run
    return (time.process_time() - start) / count


def relu_model(width: int = 16) -> onnx.ModelProto:
    """One Relu on ``[1, width]``: a run of a few microseconds, so that what surrounds
    it is most of a call's time."""
    import onnx.helper as oh

    shape = [1, width]
    graph = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["y"])],
        "relu",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, shape)],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", models.OPSET)])


async def own_time(core: ai.Core, blocks: int, calls: int = 2000) -> None:
    """aioinfer's own time per call: the fastest block of each side on a one-Relu
    model, whose run is a few microseconds. The fastest of many short blocks is the
    least disturbed by other processes, so this holds on a loaded machine too."""
    print()
    print("(6) aioinfer's own time per call (ORT, one Relu on [1, 16], LATENCY): fastest")
    print(f"    of {blocks} interleaved blocks of {calls} calls per side")
    compiled = core.compile_model(relu_model(), "ORT", {"PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    session = compiled.session  # type: ignore[attr-defined]
    feed = {"x": np.ones((1, 16), np.float32)}

    async def awaited() -> None:
        for _ in range(calls):
            await request.infer(feed)

    async def synchronous() -> None:
        for _ in range(calls):
            request.infer_sync(feed)

    async def direct() -> None:
        for _ in range(calls):
            session.run(None, feed)

    sides = {"await request.infer()": awaited, "infer_sync": synchronous, "session.run": direct}
    best = dict.fromkeys(sides, float("inf"))
    for _ in range(blocks):
        for label, side in sides.items():
            start = time.perf_counter()
            await side()
            best[label] = min(best[label], (time.perf_counter() - start) / calls)
    base = best["session.run"]
    print("| call | us per call | over session.run, us |")
    print("|---|---:|---:|")
    for label, seconds in best.items():
        print(f"| {label} | {seconds * 1e6:.2f} | {(seconds - base) * 1e6:.2f} |")
    await compiled.close()


async def main(args: argparse.Namespace) -> None:
    print(machine())
    load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), f"backend {args.backend}")
    print(f"load average at the start: {load}")
    core = ai.Core()
    sections = {
        "1": lambda: latency(core, args.rounds, args.seconds, args.device),
        "2": lambda: throughput(core, args.rounds, args.seconds),
        "3": lambda: loop_lag(core, args.rounds, args.seconds),
        "4": lambda: cancellation(core, args.trials),
        "5": lambda: spinning(core, args.rounds, args.seconds),
        "6": lambda: own_time(core, blocks=30),
    }
    for number in args.sections.split(","):
        await sections[number.strip()]()


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="ABBA rounds per comparison")
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds per block")
    parser.add_argument("--trials", type=int, default=30, help="cancellations per model")
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--sections", default="1,2,3,4,5,6", help="which to run, e.g. 1,4")
    parser.add_argument(
        "--device", default="ORT", help="section (1)'s device (AUTO: compile_model(model))"
    )
    args = parser.parse_args(argv)
    anyio.run(main, args, backend=args.backend)


if __name__ == "__main__":
    cli()
