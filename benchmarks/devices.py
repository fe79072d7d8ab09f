"""ORT vs OPENVINO vs CPU through aioinfer's own requests: the figures behind AUTO's order.

    python -m benchmarks.devices [--rounds 4] [--seconds 0.5] [--models tiny_cnn,mlp1,...]

(1) Latency: ``await request.infer(feeds)`` on each device (``PERFORMANCE_HINT``
    LATENCY), over the latency set of ``benchmarks/ort_device.py`` (from the bundled
    tiny CNN to a ResNet-18-like CNN). Per model the devices take turns in
    ``--rounds`` rounds (the order reversed each round), each turn warm-up runs then
    ``--seconds`` of timed runs; the median of all timed runs of a device is reported,
    with the geometric mean over the models of each device's time relative to ORT.
(2) Queue throughput, batch 1: an ``AsyncInferQueue`` (jobs = the device's
    ``OPTIMAL_NUMBER_OF_INFER_REQUESTS``, ``PERFORMANCE_HINT`` THROUGHPUT, compiled
    without automatic batching so that the devices themselves compare) kept full for
    ``--seconds`` per turn, the devices taking turns as above; median inferences/s.

A device that is not installed is left out. The machine is printed first.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import anyio

import aioinfer as ai
from benchmarks.compare import machine
from benchmarks.ort_device import latency_set

DEVICES = ("ORT", "OPENVINO", "CPU")
SHORT = {
    "tiny CNN (bundled), batch 1": "tiny_cnn",
    "LSTM 2x50, 50 steps x 4": "lstm",
    "MLP 4x1024, batch 1": "mlp1",
    "CNN 64x64, batch 1": "cnn",
    "MLP 4x1024, batch 64": "mlp64",
    "SqueezeNet, 1x3x224x224": "squeezenet",
    "ResNet-18-like, 1x3x224x224": "resnet18",
}
QUEUE_MODELS = ("tiny_cnn", "mlp1", "cnn")


def installed(core: ai.Core) -> list[str]:
    """The devices of :data:`DEVICES` whose plugin loads here."""
    found = []
    for device in DEVICES:
        try:
            core.get_plugin(device)
        except (ImportError, ai.AioinferError):
            continue
        found.append(device)
    return found


async def turns(
    devices: list[str], rounds: int, measure: Callable[[str], Any]
) -> dict[str, list[Any]]:
    """``await measure(device)`` for each device, ``rounds`` times, order reversed each
    round: a burst of load from other processes hits every device alike."""
    results: dict[str, list[Any]] = {device: [] for device in devices}
    for index in range(rounds):
        for device in devices if index % 2 == 0 else devices[::-1]:
            results[device].append(await measure(device))
    return results


async def latency_turn(request: ai.AsyncInferRequest, feeds: dict, seconds: float) -> list[float]:
    for _ in range(3):
        await request.infer(feeds)
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 5:
        start = time.perf_counter()
        await request.infer(feeds)
        times.append(time.perf_counter() - start)
    return times


async def queue_turn(compiled: ai.CompiledModel, feeds: dict, seconds: float) -> float:
    queue = ai.AsyncInferQueue(compiled)
    done = 0

    def count(request: ai.AsyncInferRequest, userdata: object) -> None:
        nonlocal done
        done += 1

    queue.set_callback(count)
    for _ in range(len(queue) * 2):  # warm-up
        await queue.start_async(feeds)
    await queue.wait_all()
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        await queue.start_async(feeds)
    await queue.wait_all()
    rate = done / (time.perf_counter() - start)
    await queue.close()
    return rate


def openvino_version() -> str:
    import openvino

    return str(openvino.get_version())


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


async def main(args: argparse.Namespace) -> None:
    core = ai.Core()
    devices = installed(core)
    print(f"machine: {machine()}")
    print(
        f"devices: {', '.join(devices)}"
        + (f"; OpenVINO {openvino_version()}" if "OPENVINO" in devices else "")
    )
    wanted = set(args.models.split(",")) if args.models else None
    cases = [
        (SHORT[label], label, model, feeds)
        for label, model, feeds in latency_set()
        if wanted is None or SHORT[label] in wanted
    ]
    print("\n(1) latency, LATENCY hint, await request.infer(), median ms")
    print("| model | " + " | ".join(f"{d} ms" for d in devices) + " |")
    print("|---|" + "---:|" * len(devices))
    relative: dict[str, list[float]] = {d: [] for d in devices}
    for _, label, model, feeds in cases:
        compiled = {
            d: core.compile_model(model, d, {"PERFORMANCE_HINT": "LATENCY"}) for d in devices
        }
        requests = {d: c.create_infer_request() for d, c in compiled.items()}
        blocks = await turns(
            devices,
            args.rounds,
            lambda d, feeds=feeds, requests=requests: latency_turn(
                requests[d], feeds, args.seconds
            ),
        )
        medians = {d: statistics.median(t for b in blocks[d] for t in b) * 1e3 for d in devices}
        for d in devices:
            relative[d].append(medians[d] / medians[devices[0]])
        print(f"| {label} | " + " | ".join(f"{medians[d]:.3f}" for d in devices) + " |")
        for c in compiled.values():
            await c.close()
    print(
        f"geometric mean of the time relative to {devices[0]}: "
        + ", ".join(f"{d} {geomean(relative[d]):.2f}x" for d in devices)
    )
    print("\n(2) AsyncInferQueue throughput, batch 1, THROUGHPUT hint, median inferences/s")
    print("| model | " + " | ".join(f"{d} inf/s" for d in devices) + " |")
    print("|---|" + "---:|" * len(devices))
    for short, label, model, feeds in cases:
        if short not in QUEUE_MODELS:
            continue
        compiled = {
            d: core.compile_model(model, d, {"PERFORMANCE_HINT": "THROUGHPUT"}, auto_batching=False)
            for d in devices
        }
        rates = await turns(
            devices,
            args.rounds,
            lambda d, feeds=feeds, compiled=compiled: queue_turn(compiled[d], feeds, args.seconds),
        )
        print(
            f"| {label} | "
            + " | ".join(f"{statistics.median(rates[d]):.0f}" for d in devices)
            + " |"
        )
        for c in compiled.values():
            await c.close()


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="turns of each device per model")
    parser.add_argument("--seconds", type=float, default=0.5, help="seconds per turn")
    parser.add_argument("--models", default="", help="comma-separated short names (all)")
    args = parser.parse_args(argv)
    anyio.run(main, args)


if __name__ == "__main__":
    cli()
