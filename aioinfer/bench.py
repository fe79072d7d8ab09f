"""``aioinfer bench``: latency and throughput of a model under a steady load.

aioinfer bench [MODEL] [--device AUTO] [--hint LATENCY|THROUGHPUT] [--streams N]
               [--requests N] [--duration S | --iterations N] [--shape NAME=D0,D1,...]
               [--input NAME=FILE.npy] [--compare onnxruntime] [--json] [--plot FILE.png]

``--requests`` infer requests (default: the compiled model's
``OPTIMAL_NUMBER_OF_INFER_REQUESTS``) each run inferences back to back until the duration
has passed or the iterations are done; every inference's latency is recorded. With
``--compare onnxruntime`` the same workload (same inputs, same number of concurrent
callers, threads split the same way) then runs on one shared onnxruntime session through
``anyio.to_thread.run_sync`` — the glue async applications write by hand today.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio
import anyio.to_thread
import numpy as np

import aioinfer
from aioinfer._cli_shared import UsageError, _dims, _inputs, _ms, _pairs, _read_npy, device_label
from aioinfer.models import default_model_path
from aioinfer.properties import num_cores

PERCENTILES = (50, 90, 95, 99)
_BAR_WIDTH = 30
_PROGRESS_SECONDS = 0.1
"""How often the progress bar is redrawn."""
WARMUP_ROUNDS = 2
"""Untimed inferences per caller before the timed ones (caches, thread pools, BLAS)."""

Infer = Callable[[], Coroutine[Any, Any, Any]]
"""One inference of the workload (awaitable, so that callers overlap)."""


@dataclass
class Measurement:
    """The latencies (seconds) of one runtime's run and the wall time it took."""

    runtime: str
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def throughput(self) -> float:
        """Completed inferences per second of wall time."""
        return len(self.latencies) / self.seconds if self.seconds > 0 else 0.0

    def latency_ms(self) -> dict[str, float]:
        """min, mean, percentiles and max of the latencies, in milliseconds."""
        values = np.asarray(self.latencies) * 1e3
        summary = {"min": float(values.min()), "mean": float(values.mean())}
        for p in PERCENTILES:
            summary[f"p{p}"] = float(np.percentile(values, p))
        summary["max"] = float(values.max())
        return summary

    def to_dict(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "count": len(self.latencies),
            "seconds": self.seconds,
            "throughput": self.throughput,
            "latency_ms": self.latency_ms(),
        }


def add_parser(commands: Any) -> None:
    """Declare ``aioinfer bench`` and its options on the ``aioinfer`` subcommands."""
    bench = commands.add_parser(
        "bench",
        help="measure latency and throughput under a steady load",
        description="Run a model under a steady load; report latency percentiles, "
        "throughput and compile time.",
    )
    bench.add_argument(
        "model", nargs="?", type=Path, help="ONNX model file (default: the bundled tiny_cnn)"
    )
    bench.add_argument(
        "--device", default="AUTO", help="device to compile for (default: AUTO, the best installed)"
    )
    bench.add_argument("--hint", type=str.upper, choices=("LATENCY", "THROUGHPUT"))
    bench.add_argument("--streams", type=int, help="NUM_STREAMS (default: follows the hint)")
    bench.add_argument(
        "--requests",
        type=int,
        default=0,
        help="infer requests in flight (default 0: OPTIMAL_NUMBER_OF_INFER_REQUESTS)",
    )
    budget = bench.add_mutually_exclusive_group()
    budget.add_argument("--duration", type=float, help="seconds to run (default: 5)")
    budget.add_argument("--iterations", type=int, help="inferences to run in total")
    bench.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=D0,D1,...",
        help="shape of the random input NAME (repeatable); unset dynamic dims are 1",
    )
    bench.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="take input NAME from a .npy file (repeatable); other inputs are random",
    )
    bench.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    bench.add_argument(
        "--compare",
        choices=("onnxruntime",),
        help="run the same workload on onnxruntime and print the ratios",
    )
    bench.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    bench.add_argument(
        "--plot", type=Path, metavar="FILE.png", help="write a latency histogram (matplotlib)"
    )
    bench.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


async def run(args: argparse.Namespace) -> None:
    """Run ``aioinfer bench`` with parsed ``args``; print the report.

    Raises:
        UsageError: a bad option value, or an optional package that is missing.
        AioinferError: the model cannot be read, compiled or run with these inputs.
    """
    _check_options(args)
    model_path = args.model if args.model is not None else default_model_path()
    files = _pairs(args.input, "--input", "NAME=FILE.npy")
    shapes = {n: _dims(n, t) for n, t in _pairs(args.shape, "--shape", "NAME=D0,D1,...").items()}
    arrays = {name: _read_npy(name, file) for name, file in files.items()}
    config: dict[str, Any] = {}
    if args.hint:
        config["PERFORMANCE_HINT"] = args.hint
    if args.streams is not None:
        config["NUM_STREAMS"] = args.streams

    start = time.perf_counter()
    compiled = await aioinfer.Core().compile_model_async(model_path, args.device, config)
    compile_seconds = time.perf_counter() - start
    device = device_label(args.device, compiled)
    async with compiled:
        for name in [*files, *shapes]:
            compiled.input(name)  # raises UnknownInputError naming the inputs that exist
        inputs = _inputs(compiled.inputs, arrays, shapes, np.random.default_rng(args.seed))
        count = args.requests or int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        streams = int(compiled.get_property("NUM_STREAMS"))
        hint = str(compiled.get_property("PERFORMANCE_HINT"))
        requests = [compiled.create_infer_request() for _ in range(count)]

        start = time.perf_counter()
        await requests[0].infer(inputs)
        first_seconds = time.perf_counter() - start
        progress = None if args.no_progress else sys.stderr
        measurements = [
            await measure(
                "aioinfer",
                [functools.partial(r.infer, inputs) for r in requests],
                args.duration,
                args.iterations,
                progress,
            )
        ]
    if args.compare == "onnxruntime":
        measurements.append(
            await _measure_onnxruntime(model_path, inputs, streams, count, args, progress)
        )

    report = {
        "model": compiled.name,
        "path": str(model_path),
        "device": device,
        "config": {"PERFORMANCE_HINT": hint, "NUM_STREAMS": streams},
        "requests": count,
        "inputs": {n: {"dtype": str(a.dtype), "shape": list(a.shape)} for n, a in inputs.items()},
        "compile_seconds": compile_seconds,
        "first_inference_seconds": first_seconds,
        **measurements[0].to_dict(),
    }
    if len(measurements) > 1:
        report["compare"] = _comparison(measurements[0], measurements[1])
    if args.plot is not None:
        write_histogram(args.plot, measurements, f"{compiled.name} on {args.device}")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report, args.plot)


def _check_options(args: argparse.Namespace) -> None:
    """Fail before compiling anything: bad numbers, or a missing optional package."""
    if args.iterations is not None and args.iterations < 1:
        raise UsageError(f"--iterations must be >= 1, got {args.iterations}")
    if args.duration is not None and not args.duration > 0:
        raise UsageError(f"--duration must be > 0 seconds, got {args.duration}")
    if args.requests < 0:
        raise UsageError(f"--requests must be >= 0 (0: the optimal number), got {args.requests}")
    if args.iterations is None and args.duration is None:
        args.duration = 5.0
    if args.compare == "onnxruntime":
        _require("onnxruntime", "--compare onnxruntime", "onnxruntime")
    if args.plot is not None:
        _require("matplotlib", "--plot", "'aioinfer[plot]'")


def _require(module: str, option: str, install: str) -> None:
    try:
        __import__(module)
    except ImportError:
        raise UsageError(
            f"{option} needs the {module} package, which is not installed (pip install {install})"
        ) from None


async def measure(
    runtime: str,
    infers: Sequence[Infer],
    duration: float | None,
    iterations: int | None,
    progress: TextIO | None = None,
) -> Measurement:
    """Run ``infers`` concurrently, each back to back, until ``iterations`` inferences in
    total have completed or ``duration`` seconds have passed; time each inference.

    Each caller first runs :data:`WARMUP_ROUNDS` untimed inferences. ``progress``, when
    given, gets a progress bar redrawn in place.
    """
    for _ in range(WARMUP_ROUNDS):
        async with anyio.create_task_group() as warmup:
            for infer in infers:
                warmup.start_soon(infer)
    result = Measurement(runtime)
    remaining = iterations
    start = time.perf_counter()
    deadline = start + duration if duration is not None else math.inf

    async def caller(infer: Infer) -> None:
        nonlocal remaining
        while True:
            if remaining is not None:
                if remaining == 0:
                    return
                remaining -= 1
            elif time.perf_counter() >= deadline:
                return
            began = time.perf_counter()
            await infer()
            result.latencies.append(time.perf_counter() - began)

    def fraction() -> float:
        if iterations is not None:
            return len(result.latencies) / iterations
        return min(1.0, (time.perf_counter() - start) / (deadline - start))

    async with anyio.create_task_group() as outer:
        if progress is not None:
            outer.start_soon(_draw_progress, progress, runtime, result, fraction, start)
        async with anyio.create_task_group() as callers:
            for infer in infers:
                callers.start_soon(caller, infer)
        result.seconds = time.perf_counter() - start
        outer.cancel_scope.cancel()
    if progress is not None:
        _draw_bar(progress, runtime, 1.0, len(result.latencies), result.seconds)
        progress.write("\n")
    return result


async def _draw_progress(
    out: TextIO,
    runtime: str,
    result: Measurement,
    fraction: Callable[[], float],
    start: float,
) -> None:
    while True:
        _draw_bar(out, runtime, fraction(), len(result.latencies), time.perf_counter() - start)
        await anyio.sleep(_PROGRESS_SECONDS)


def _draw_bar(out: TextIO, runtime: str, fraction: float, done: int, seconds: float) -> None:
    filled = round(_BAR_WIDTH * fraction)
    bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
    out.write(f"\r{runtime:>11} [{bar}] {fraction:4.0%} {done:7d} inferences {seconds:6.1f} s")
    out.flush()


async def _measure_onnxruntime(
    model_path: Path,
    inputs: dict[str, np.ndarray],
    streams: int,
    callers: int,
    args: argparse.Namespace,
    progress: TextIO | None,
) -> Measurement:
    """The same workload on one shared onnxruntime session, called through threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    # Split the cores between concurrent runs as aioinfer splits them between streams.
    options.intra_op_num_threads = max(1, num_cores() // streams)
    # Spinning workers would hold the cores after each run and tax the event loop.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = await anyio.to_thread.run_sync(
        lambda: ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    )

    async def infer() -> None:
        await anyio.to_thread.run_sync(session.run, None, inputs)

    return await measure("onnxruntime", [infer] * callers, args.duration, args.iterations, progress)


def _comparison(ours: Measurement, theirs: Measurement) -> dict[str, Any]:
    return {
        **theirs.to_dict(),
        "version": _version(theirs.runtime),
        "throughput_ratio": ours.throughput / theirs.throughput,
        "median_latency_ratio": theirs.latency_ms()["p50"] / ours.latency_ms()["p50"],
    }


def _version(module: str) -> str:
    return str(getattr(sys.modules.get(module), "__version__", "unknown"))


def write_histogram(path: Path, measurements: Sequence[Measurement], title: str) -> None:
    """Write a histogram of the latencies of each measurement to ``path`` (PNG etc.).

    Raises:
        UsageError: the file cannot be written.
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4), layout="constrained")
    axes = figure.add_subplot()
    every = np.concatenate([m.latencies for m in measurements]) * 1e3
    bins = np.linspace(every.min(), np.percentile(every, 99.5), 50).tolist()
    for m in measurements:
        median = m.latency_ms()["p50"]
        axes.hist(
            np.asarray(m.latencies) * 1e3,
            bins=bins,
            alpha=0.6,
            label=f"{m.runtime} (median {median:.2f} ms, {m.throughput:.0f}/s)",
        )
    axes.set_xlabel("latency (ms)")
    axes.set_ylabel("inferences")
    axes.set_title(f"aioinfer bench: {title}")
    axes.legend()
    try:
        figure.savefig(path)
    except OSError as exc:
        raise UsageError(f"--plot: cannot write {str(path)!r}: {exc}") from None


def _print_report(report: dict[str, Any], plot: Path | None) -> None:
    config = report["config"]
    print(f"model:           {report['model']} ({report['path']})")
    print(
        f"device:          {report['device']} ({config['PERFORMANCE_HINT']}, "
        f"{config['NUM_STREAMS']} stream(s), {report['requests']} request(s) in flight)"
    )
    shapes = ", ".join(f"{n} {i['dtype']} {i['shape']}" for n, i in report["inputs"].items())
    print(f"inputs:          {shapes}")
    print(f"compile time:    {_ms(report['compile_seconds'])}")
    print(f"first inference: {_ms(report['first_inference_seconds'])}")
    _print_measurement(report)
    if "compare" in report:
        theirs = report["compare"]
        print(f"onnxruntime {theirs['version']} (one session, to_thread, spinning off):")
        _print_measurement(theirs)
        print(
            f"ratio:           throughput {theirs['throughput_ratio']:.2f}x, "
            f"median latency {theirs['median_latency_ratio']:.2f}x (>1: aioinfer is faster)"
        )
    if plot is not None:
        print(f"histogram:       {plot}")


def _print_measurement(m: dict[str, Any]) -> None:
    lat = m["latency_ms"]
    print(f"inferences:      {m['count']} in {m['seconds']:.2f} s")
    print(
        f"latency:         median {lat['p50']:.3f} ms, p90 {lat['p90']:.3f}, "
        f"p95 {lat['p95']:.3f}, p99 {lat['p99']:.3f}, min {lat['min']:.3f}, "
        f"max {lat['max']:.3f}"
    )
    print(f"throughput:      {m['throughput']:.1f} inferences/s")
