"""One decode step of a grouped-query decoder, as exported against with the query heads
grouped (:func:`aioinfer.generation.grouped_query_attention`, which every compile now
applies), on each device, alternating.

    python -m benchmarks.generation_steps DIR/onnx/model.onnx
        [--devices CPU ORT OPENVINO] [--rows 32] [--past 96] [--rounds 3] [--handoff]

Each device compiles both models with its own plugin (no ``STATEFUL``: the Core's
rewrites are not applied, so the exported one keeps its repeat), and each step is fed a
cache of ``--past`` random positions and one token per row. Per round and model: two
untimed steps, then the median of five; the table gives the median over rounds and the
per-round ratios (the machine is shared: only those carry).

``--handoff`` measures instead how the cache goes from one step to the next on
onnxruntime (the grouped decoder, four steps from ``--past`` positions, the cache of
each step fed to the next): as numpy arrays (``run``), as onnxruntime's own values
(``run_with_ort_values``), and through aioinfer's ``ORT`` device with ``STATEFUL``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

import aioinfer as ai
from aioinfer.generation import grouped_query_attention
from benchmarks.compare import machine


def step_feeds(model: ai.Model, rows: int, past: int) -> dict[str, np.ndarray]:
    """One decode step's inputs: one token per row after ``past`` cached positions."""
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {
        "input_ids": rng.integers(3, 300, (rows, 1)),
        "attention_mask": np.ones((rows, past + 1), np.int64),
        "position_ids": np.full((rows, 1), past, np.int64),
    }
    for port in model.inputs:
        if port.name.startswith("past_key_values."):
            assert port.shape is not None
            heads, width = port.shape[1], port.shape[3]
            assert isinstance(heads, int) and isinstance(width, int)
            feeds[port.name] = rng.standard_normal((rows, heads, past, width)).astype(np.float32)
    return feeds


def step_seconds(request: ai.InferRequest, feeds: dict[str, np.ndarray]) -> float:
    """The median of five timed steps after two untimed ones."""
    for _ in range(2):
        request.infer_sync(feeds)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        request.infer_sync(feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def handoff(model: ai.Model, rows: int, past: int, rounds: int) -> None:
    """Print the median step of each way of handing the cache on (see the module)."""
    from aioinfer.devices.ort.session import ModelBytes

    feeds = step_feeds(model, rows, past)
    cache = {name: value for name, value in feeds.items() if name.startswith("past_")}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(ModelBytes.from_model(model).model, options)
    binding = session._sess
    names = [o.name for o in session.get_outputs()]
    compiled = ai.Core().compile_model(model, "ORT", {"STATEFUL": "auto"})
    request = compiled.create_infer_request()

    def step(position: int) -> dict[str, np.ndarray]:
        return {
            "input_ids": feeds["input_ids"],
            "attention_mask": np.ones((rows, position + 1), np.int64),
            "position_ids": np.full((rows, 1), position, np.int64),
        }

    def as_numpy() -> list[float]:
        values, times = dict(cache), []
        for k in range(4):
            fed = {**step(past + k), **values}
            start = time.perf_counter()
            produced = dict(zip(names, binding.run(names, fed, None)))
            times.append(time.perf_counter() - start)
            values = {n: produced[n.replace("past_key_values", "present")] for n in values}
        return times

    def as_ort_values() -> list[float]:
        values = {n: _ort_value(v) for n, v in cache.items()}
        times = []
        for k in range(4):
            fed = {n: _ort_value(v) for n, v in step(past + k).items()}
            start = time.perf_counter()
            produced = dict(zip(names, binding.run_with_ort_values({**fed, **values}, names, None)))
            times.append(time.perf_counter() - start)
            values = {n: produced[n.replace("past_key_values", "present")] for n in values}
        return times

    def through_aioinfer() -> list[float]:
        for state in request.query_state():
            state.state = cache[state.name]
        times = []
        for k in range(4):
            fed = step(past + k)
            start = time.perf_counter()
            request.infer_sync(fed)
            times.append(time.perf_counter() - start)
        return times

    ways = {"numpy arrays": as_numpy, "OrtValues": as_ort_values, "ORT, STATEFUL": through_aioinfer}
    times: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(rounds):
        for way, run in ways.items():
            times[way].append(statistics.median(run()[1:]))
    print(f"\n{rows} rows from {past} cached positions\n")
    print("| cache handed on as | step, median | per round |")
    print("|---|---:|---|")
    for way, seconds in times.items():
        rounds_text = ", ".join(f"{t * 1000:.0f}" for t in seconds)
        print(f"| {way} | {statistics.median(seconds) * 1000:.0f} ms | {rounds_text} |")


def _ort_value(array: np.ndarray) -> object:
    """``array`` as the value ``run_with_ort_values`` takes (sharing its memory)."""
    return ort.OrtValue.ortvalue_from_numpy(array)._ortvalue


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="the decoder's model.onnx")
    parser.add_argument("--devices", nargs="+", default=["CPU", "ORT", "OPENVINO"])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--past", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--handoff", action="store_true", help="the cache between steps")
    args = parser.parse_args()
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.1f}", flush=True)
    core = ai.Core()
    exported = core.read_model(args.model)
    grouped = grouped_query_attention(exported)
    if args.handoff:
        handoff(grouped, args.rows, args.past, args.rounds)
        print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
        return
    feeds = step_feeds(exported, args.rows, args.past)
    print(f"\n{args.rows} rows, {args.past} cached positions\n")
    print("| Device | as exported | grouped | as exported / grouped, per round |")
    print("|---|---:|---:|---|")
    for device in args.devices:
        plugin = core.get_plugin(device)
        requests = {
            kind: plugin.compile_model(model, {}).create_infer_request()
            for kind, model in (("exported", exported), ("grouped", grouped))
        }
        times: dict[str, list[float]] = {kind: [] for kind in requests}
        for _ in range(args.rounds):
            for kind, request in requests.items():
                times[kind].append(step_seconds(request, feeds))
        ratios = ", ".join(f"{a / b:.2f}" for a, b in zip(times["exported"], times["grouped"]))
        print(
            f"| `{device}` | {statistics.median(times['exported']) * 1000:.0f} ms | "
            f"{statistics.median(times['grouped']) * 1000:.0f} ms | {ratios} |",
            flush=True,
        )
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
