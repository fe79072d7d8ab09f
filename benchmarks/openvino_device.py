"""The OPENVINO device against OpenVINO called directly, in one process.

    python -m benchmarks.openvino_device [--models mlp,tiny_cnn,...] [--blocks 5]
                                         [--runs 20] [--seconds 1.0] [--jobs 0]
                                         [--only latency,throughput,devices]

Latency: ``await request.infer(feeds)`` on the OPENVINO device (``PERFORMANCE_HINT``
LATENCY) against OpenVINO's own request on a model compiled from the same ONNX bytes with
the same config, called two ways: ``infer(feeds, share_inputs=True)`` (computes on the
calling thread) and ``start_async`` + ``wait()`` (on OpenVINO's threads, as aioinfer
does); all copy the outputs. The sides alternate in ``--blocks`` blocks, the order
reversed each block; each turn starts with untimed warm-up runs, then ``--runs`` timed
runs. Reported: the medians of all timed runs, the ratio to the faster OpenVINO call,
and the geometric mean of the ratios (target: within 1.10).

Throughput: with the THROUGHPUT hint, aioinfer's ``AsyncInferQueue`` against OpenVINO's
own ``AsyncInferQueue``, with the same number of requests (OpenVINO's
``OPTIMAL_NUMBER_OF_INFER_REQUESTS`` unless ``--jobs``), each fed for ``--seconds`` per
turn, alternating in blocks as above; both share the caller's input arrays
(``share_inputs=True``) and neither sets a callback. Reported: median inferences per
second of the turns and their ratio (target: at least 1.0), and per job the median CPU
time of the whole process (every thread: OpenVINO's, the loop, aioinfer's) and its
context switches (voluntary and not): on a machine shared with other work the rates
move with the load, the CPU per job much less. The load average is printed with each
table.

Devices: ``await request.infer(feeds)`` on OPENVINO, ORT and CPU (LATENCY hint, f32),
alternating in blocks as above; reported: median latency per device and OPENVINO's ratio
to the fastest of the others (the figures behind AUTO's priority order).

The machine (CPU model, cores, OpenVINO version, the precision OpenVINO used) is printed
first: figures from different machines do not compare.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import resource
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import numpy as np
import onnx
import openvino as ov

import aioinfer as ai
from aioinfer.models import default_model_path
from aioinfer.properties import num_cores
from benchmarks import models

Feeds = dict[str, np.ndarray]

MODELS: dict[str, tuple[Callable[[], onnx.ModelProto], str]] = {
    "tiny_cnn": (lambda: onnx.load(default_model_path()), "bundled tiny CNN, 1x3x32x32"),
    "mlp": (models.mlp, "MLP 4x(Gemm 1024 + Relu), batch 64"),
    "cnn": (models.cnn, "small ResNet-style CNN, 1x3x64x64"),
    "lstm": (models.lstm, "2-layer LSTM (50 units), 50 steps x batch 4"),
    "squeezenet": (lambda: models.light_model("squeezenet"), "SqueezeNet, 1x3x224x224"),
    "resnet18": (models.resnet18, "ResNet-18-like CNN, 1x3x224x224"),
}
CONFIG = {"INFERENCE_PRECISION_HINT": "f32"}
"""Shared by both sides; aioinfer's default precision, spelled out for OpenVINO."""


def feeds_for(name: str, model: onnx.ModelProto) -> Feeds:
    """Random inputs of the benchmark shapes (fixed seed)."""
    rng = np.random.default_rng(0)
    if name == "mlp":
        return {"x": rng.standard_normal((64, 1024)).astype(np.float32)}
    if name == "lstm":
        return {"x": rng.standard_normal((50, 4, 50)).astype(np.float32)}
    size = {"tiny_cnn": 32, "cnn": 64}.get(name, 224)
    image = rng.standard_normal((1, 3, size, size)).astype(np.float32)
    return {model.graph.input[0].name: image}


def machine() -> str:
    """CPU model, cores, OpenVINO version and what OpenVINO's CPU device can do."""
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as info:
            names = [line.split(":", 1)[1].strip() for line in info if "model name" in line]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    core = ov.Core()
    capabilities = ", ".join(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    return (
        f"{cpu}, {num_cores()} cores; OpenVINO {ov.get_version()}; "
        f"CPU capabilities: {capabilities}; precision: f32 on both sides; "
        f"load average (1, 5, 15 min) at the start: {load}"
    )


def direct_model(model: onnx.ModelProto, hint: str) -> Any:
    core = ov.Core()
    ov_model = core.read_model(model.SerializeToString())
    return core.compile_model(ov_model, "CPU", {**CONFIG, "PERFORMANCE_HINT": hint})


async def timed(run: Callable[[], Awaitable[object]], warmup: int, runs: int) -> list[float]:
    for _ in range(warmup):
        await run()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        await run()
        times.append(time.perf_counter() - start)
    return times


async def latency(name: str, blocks: int, runs: int) -> dict[str, float]:
    """Median seconds of aioinfer (``ours``) and of OpenVINO's ``infer()`` and
    ``start_async()`` + ``wait()`` for one model."""
    model = MODELS[name][0]()
    feeds = feeds_for(name, model)
    compiled = ai.Core().compile_model(model, "OPENVINO", {"PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    direct = direct_model(model, "LATENCY")
    engine = direct.create_infer_request()
    outputs = range(len(direct.outputs))

    async def ours() -> object:
        return await request.infer(feeds)

    async def infer() -> object:
        return engine.infer(feeds, share_inputs=True)

    async def start_wait() -> object:
        engine.start_async(feeds, share_inputs=True)
        engine.wait()
        return [engine.get_output_tensor(i).data.copy() for i in outputs]

    runners = {"ours": ours, "infer": infer, "start_async": start_wait}
    times: dict[str, list[float]] = {side: [] for side in runners}
    for block in range(blocks):
        order = list(runners) if block % 2 == 0 else list(reversed(runners))
        for side in order:
            times[side] += await timed(runners[side], warmup=3, runs=runs)
    await compiled.close()
    return {side: statistics.median(values) for side, values in times.items()}


class Turn:
    """One queue turn: inferences per second, CPU seconds and context switches per job."""

    def __init__(self) -> None:
        self.count = 0
        self.start = time.perf_counter()
        self._cpu = time.process_time()
        self._switches = _switches()

    def end(self) -> tuple[float, float, float]:
        count = max(self.count, 1)
        return (
            count / (time.perf_counter() - self.start),
            (time.process_time() - self._cpu) / count,
            (_switches() - self._switches) / count,
        )


def _switches() -> int:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


QueueFigures = dict[str, tuple[float, float, float]]


async def throughput(name: str, blocks: int, seconds: float, jobs: int) -> tuple[QueueFigures, int]:
    """Per side (``ours``: aioinfer's queue, ``theirs``: OpenVINO's), the medians of
    inferences per second, CPU seconds per job and context switches per job; the jobs."""
    model = MODELS[name][0]()
    feeds = feeds_for(name, model)
    direct = direct_model(model, "THROUGHPUT")
    jobs = jobs or int(direct.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
    compiled = ai.Core().compile_model(model, "OPENVINO", {"PERFORMANCE_HINT": "THROUGHPUT"})
    queue = ai.AsyncInferQueue(compiled, jobs=jobs)
    engine_queue = ov.AsyncInferQueue(direct, jobs)

    async def ours(duration: float) -> tuple[float, float, float]:
        turn = Turn()
        while time.perf_counter() - turn.start < duration:
            await queue.start_async(feeds, share_inputs=True)
            turn.count += 1
        await queue.wait_all()
        return turn.end()

    async def theirs(duration: float) -> tuple[float, float, float]:
        turn = Turn()
        while time.perf_counter() - turn.start < duration:
            engine_queue.start_async(feeds, share_inputs=True)
            turn.count += 1
        engine_queue.wait_all()
        return turn.end()

    figures: dict[str, list[tuple[float, float, float]]] = {"ours": [], "theirs": []}
    runners = {"ours": ours, "theirs": theirs}
    for block in range(blocks):
        order = ("ours", "theirs") if block % 2 == 0 else ("theirs", "ours")
        for side in order:
            await runners[side](min(0.2, seconds))  # an untimed warm-up turn
            figures[side].append(await runners[side](seconds))
    await queue.close()
    medians = {
        side: (
            statistics.median(rate for rate, _, _ in turns),
            statistics.median(cpu for _, cpu, _ in turns),
            statistics.median(switches for _, _, switches in turns),
        )
        for side, turns in figures.items()
    }
    return medians, jobs


DEVICES = ("OPENVINO", "ORT", "CPU")


async def device_latency(name: str, blocks: int, runs: int) -> dict[str, float]:
    """Median seconds of ``await request.infer()`` on each of :data:`DEVICES`."""
    model = MODELS[name][0]()
    feeds = feeds_for(name, model)
    core = ai.Core()
    compiled = {d: core.compile_model(model, d, {"PERFORMANCE_HINT": "LATENCY"}) for d in DEVICES}
    requests = {d: m.create_infer_request() for d, m in compiled.items()}
    runners = {d: (lambda r=r: r.infer(feeds)) for d, r in requests.items()}
    times: dict[str, list[float]] = {d: [] for d in DEVICES}
    for block in range(blocks):
        order = DEVICES if block % 2 == 0 else tuple(reversed(DEVICES))
        for device in order:
            times[device] += await timed(runners[device], warmup=3, runs=runs)
    for model_on_device in compiled.values():
        await model_on_device.close()
    return {d: statistics.median(values) for d, values in times.items()}


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


async def main(args: argparse.Namespace) -> None:
    names = args.models.split(",")
    parts = args.only.split(",")
    print(f"machine: {machine()}\n")
    if "latency" in parts:
        await latency_table(names, args)
    if "throughput" in parts:
        await throughput_table(names, args)
    if "devices" in parts:
        await devices_table(names, args)


async def latency_table(names: list[str], args: argparse.Namespace) -> None:
    print("Latency: await request.infer() on OPENVINO vs OpenVINO's own calls (LATENCY hint);")
    print("the ratio is to the faster of OpenVINO's two")
    print("| model | aioinfer (ms) | OpenVINO infer() (ms) | start_async+wait (ms) | ratio |")
    print("|---|---:|---:|---:|---:|")
    ratios = []
    for name in names:
        got = await latency(name, args.blocks, args.runs)
        ratios.append(got["ours"] / min(got["infer"], got["start_async"]))
        print(
            f"| {MODELS[name][1]} | {got['ours'] * 1e3:.3f} | {got['infer'] * 1e3:.3f} "
            f"| {got['start_async'] * 1e3:.3f} | {ratios[-1]:.3f} |"
        )
    print(f"\nlatency ratio, geometric mean: {geometric_mean(ratios):.3f} (target <= 1.10)\n")


def load() -> str:
    return ", ".join(f"{value:.1f}" for value in os.getloadavg())


async def throughput_table(names: list[str], args: argparse.Namespace) -> None:
    print("Throughput: aioinfer AsyncInferQueue vs OpenVINO AsyncInferQueue (THROUGHPUT hint)")
    print(f"load average (1, 5, 15 min) before: {load()}")
    print(
        "| model | requests | aioinfer (inf/s) | OpenVINO (inf/s) | ratio "
        "| CPU µs/job aioinfer | OpenVINO | switches/job aioinfer | OpenVINO |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for name in names:
        got, jobs = await throughput(name, args.blocks, args.seconds, args.jobs)
        (ours, ours_cpu, ours_switches), (theirs, cpu, switches) = got["ours"], got["theirs"]
        ratios.append(ours / theirs)
        print(
            f"| {MODELS[name][1]} | {jobs} | {ours:.1f} | {theirs:.1f} | {ratios[-1]:.3f} "
            f"| {ours_cpu * 1e6:.1f} | {cpu * 1e6:.1f} | {ours_switches:.2f} | {switches:.2f} |"
        )
    print(f"\nthroughput ratio, geometric mean: {geometric_mean(ratios):.3f} (target >= 1.0)")
    print(f"load average (1, 5, 15 min) after: {load()}\n")


async def devices_table(names: list[str], args: argparse.Namespace) -> None:
    print("Devices: await request.infer() on each device (LATENCY hint, f32), median ms;")
    print("the ratio is OPENVINO's latency to the fastest other device's")
    print("| model | OPENVINO (ms) | ORT (ms) | CPU (ms) | OPENVINO / best other |")
    print("|---|---:|---:|---:|---:|")
    ratios = []
    for name in names:
        got = await device_latency(name, args.blocks, args.runs)
        ratios.append(got["OPENVINO"] / min(got["ORT"], got["CPU"]))
        cells = " | ".join(f"{got[d] * 1e3:.3f}" for d in DEVICES)
        print(f"| {MODELS[name][1]} | {cells} | {ratios[-1]:.3f} |")
    print(f"\nOPENVINO / best other, geometric mean: {geometric_mean(ratios):.3f}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    parser.add_argument("--blocks", type=int, default=5, help="alternating blocks per side")
    parser.add_argument("--runs", type=int, default=20, help="timed latency runs per block")
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds per queue turn")
    parser.add_argument("--jobs", type=int, default=0, help="queue requests (0: OpenVINO's)")
    parser.add_argument(
        "--only", default="latency,throughput,devices", help="comma-separated tables to run"
    )
    args = parser.parse_args()
    unknown = set(args.models.split(",")) - set(MODELS)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; known: {', '.join(MODELS)}")
    anyio.run(main, args)


if __name__ == "__main__":
    cli()
