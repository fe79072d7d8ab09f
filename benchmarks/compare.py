"""aioinfer vs onnxruntime vs onnx.reference on real model families, in one process.

    python -m benchmarks.compare [--models mlp,bert,...] [--blocks 5] [--runs 10]
                                 [--device CPU|ORT|AUTO|...]
                                 [--reference-budget 20] [--output table.md]

``--device`` (default ``CPU``) is the device aioinfer compiles for; ``AUTO`` is what
``compile_model(model)`` without a device does.

Latency: for each model, aioinfer (``PERFORMANCE_HINT=LATENCY``, ``infer_sync``) and
onnxruntime (CPU, 2 intra-op threads, default spinning) run alternately in ``--blocks``
blocks; each block starts with untimed warm-up runs, ``--warmup`` of them and for at
least :data:`WARMUP_SECONDS` (onnxruntime's spinning workers tax the runtime after it for
that long), then ``--runs`` timed runs; the median of all timed runs is reported.
onnx.reference is slow: it runs once after a warm-up-free first call and at most until
``--reference-budget`` seconds are spent (up to 3 runs), its median marked with the
number of runs.

Peak memory: each runtime runs the model in a fresh subprocess (``--memory-probe``),
which imports the runtime, builds the model and its inputs, resets the kernel's peak-RSS
counter (``VmHWM``, through ``/proc/self/clear_refs``; Linux only) and notes the RSS,
then compiles (or creates the session) and runs 5 inferences; the reported peak is
``VmHWM`` minus that RSS: the runtime's weights, buffers and temporaries, compile time
included.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from benchmarks import models

MODELS: dict[str, tuple[Callable[[], onnx.ModelProto], str]] = {
    "mlp": (models.mlp, "MLP 4x1024, batch 64"),
    "bert": (models.bert, "BERT-style encoder (MiniLM-L6 sizes), batch 8 x 128 tokens"),
    "resnet18": (models.resnet18, "ResNet-18-like CNN, 1x3x224x224"),
    "lstm": (models.lstm, "2-layer LSTM (50 units), 50 steps x batch 4"),
    "resnet50": (lambda: models.light_model("resnet50"), "onnx light ResNet-50, 1x3x224x224"),
    "squeezenet": (lambda: models.light_model("squeezenet"), "onnx light SqueezeNet, 1x3x224x224"),
}


def feeds_for(name: str, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Random inputs of the benchmark shapes (fixed seed)."""
    rng = np.random.default_rng(0)
    if name == "mlp":
        return {"x": rng.standard_normal((64, 1024)).astype(np.float32)}
    if name == "bert":
        mask = np.ones((8, 128), np.int64)
        mask[:, 100:] = 0  # padded tail: the mask matters
        return {
            "hidden_states": rng.standard_normal((8, 128, 384)).astype(np.float32),
            "attention_mask": mask,
        }
    if name == "lstm":
        return {"x": rng.standard_normal((50, 4, 50)).astype(np.float32)}
    image = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    return {model.graph.input[0].name: image}


def aioinfer_runner(
    model: onnx.ModelProto, device: str = "CPU"
) -> Callable[[Mapping[str, np.ndarray]], list]:
    import aioinfer as ai

    compiled = ai.Core().compile_model(model, device, {"PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    return lambda feeds: list(request.infer_sync(dict(feeds)).to_tuple())


def onnxruntime_runner(model: onnx.ModelProto) -> Callable[[Mapping[str, np.ndarray]], list]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return lambda feeds: session.run(None, dict(feeds))


def reference_runner(model: onnx.ModelProto) -> Callable[[Mapping[str, np.ndarray]], list]:
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(model)
    return lambda feeds: evaluator.run(None, dict(feeds))


LIBRARIES = {
    "aioinfer": "aioinfer.devices.cpu",
    "onnxruntime": "onnxruntime",
    "reference": "onnx.reference",
}
RUNNERS = {
    "aioinfer": aioinfer_runner,
    "onnxruntime": onnxruntime_runner,
    "reference": reference_runner,
}


WARMUP_SECONDS = 0.15
"""The least time of untimed runs at the start of every block. onnxruntime's intra-op
threads keep spinning after its last run (its default) and hold the cores: aioinfer's
inferences right after an onnxruntime block took 1.5-3.5x their steady time for the
first 50-75 ms (2026-12-01, 2-core AMD EPYC: Magika, PP-LCNet; with spinning off,
none); a warm-up of a few runs is gone in a few milliseconds on a small model. Every
runtime gets the same warm-up."""


def warmups(count: int, seconds: float = WARMUP_SECONDS) -> Iterator[None]:
    """One item per untimed run of a warm-up (a call or an await each): ``count`` of
    them, and more until ``seconds`` passed."""
    done = 0
    deadline = time.perf_counter() + seconds
    while done < count or time.perf_counter() < deadline:
        yield None
        done += 1


def warm(run: Callable[[], object], count: int, seconds: float = WARMUP_SECONDS) -> int:
    """Untimed calls of ``run`` (see :func:`warmups`); returns how many ran."""
    ran = 0
    for _ in warmups(count, seconds):
        run()
        ran += 1
    return ran


def timed(run: Callable[[], object], count: int) -> list[float]:
    """The seconds of ``count`` calls of ``run``, one by one."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


@dataclass
class Row:
    """One model's figures (milliseconds, megabytes)."""

    name: str
    title: str
    aioinfer_ms: float
    onnxruntime_ms: float
    reference_ms: float | None
    reference_runs: int
    max_abs_diff: float
    aioinfer_mb: float | None = None
    onnxruntime_mb: float | None = None


def measure(
    name: str, blocks: int, runs: int, warmup: int, budget: float, device: str = "CPU"
) -> Row:
    """Latencies of one model: aioinfer on ``device`` and onnxruntime alternating in
    blocks, then the time-boxed reference."""
    build, title = MODELS[name]
    model = build()
    feeds = feeds_for(name, model)
    ours = aioinfer_runner(model, device)
    theirs = onnxruntime_runner(model)
    times: dict[str, list[float]] = {"aioinfer": [], "onnxruntime": []}
    for _ in range(blocks):
        for runtime, runner in (("onnxruntime", theirs), ("aioinfer", ours)):
            warm(lambda runner=runner: runner(feeds), warmup)
            times[runtime] += timed(lambda runner=runner: runner(feeds), runs)
    diff = max(
        float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
        for a, b in zip(ours(feeds), theirs(feeds))
    )
    reference_times: list[float] = []
    if budget > 0:
        evaluate = reference_runner(model)
        while len(reference_times) < 3 and sum(reference_times) < budget:
            reference_times += timed(lambda: evaluate(feeds), 1)
    return Row(
        name,
        title,
        statistics.median(times["aioinfer"]) * 1e3,
        statistics.median(times["onnxruntime"]) * 1e3,
        statistics.median(reference_times) * 1e3 if reference_times else None,
        len(reference_times),
        diff,
    )


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1])


def memory_probe(runtime: str, name: str) -> float:
    """Peak RSS growth (MB) while ``runtime`` compiles and runs ``name``: the peak (VmHWM,
    reset once the model and inputs are built) minus the RSS at that moment."""
    importlib.import_module(LIBRARIES[runtime])  # code is not what is measured
    build, _ = MODELS[name]
    model = build()
    feeds = feeds_for(name, model)
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM (the peak RSS) to the current RSS
    before = _status_kib("VmRSS")
    run = RUNNERS[runtime](model)
    for _ in range(5):
        run(feeds)
    return (_status_kib("VmHWM") - before) / 1024


def peak_memory(runtime: str, name: str) -> float:
    """:func:`memory_probe` in a fresh interpreter."""
    output = subprocess.run(
        [sys.executable, "-m", "benchmarks.compare", "--memory-probe", runtime, name],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(json.loads(output.strip().splitlines()[-1])["peak_mb"])


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def machine() -> str:
    """CPU model, cores, and the versions of the libraries measured."""
    import onnxruntime as ort
    from threadpoolctl import threadpool_info

    import aioinfer as ai

    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if "model name" in line)
    except (OSError, StopIteration):
        pass
    blas = ", ".join(
        f"{p.get('internal_api')} {p.get('version')} ({p.get('architecture')})"
        for p in threadpool_info()
        if p.get("user_api") == "blas"
    )
    return (
        f"{cpu}, {len(os.sched_getaffinity(0))} cores; Python {platform.python_version()}, "
        f"numpy {np.__version__} with {blas or 'unknown BLAS'}, onnxruntime {ort.__version__}, "
        f"onnx {onnx.__version__}, aioinfer {ai.__version__}"
    )


def table(rows: list[Row], budget: float) -> str:
    """The markdown table, with geometric means."""
    lines = [
        "| model | aioinfer ms | onnxruntime ms | onnx.reference ms | aioinfer/ort | "
        "reference/aioinfer | peak MB aioinfer | peak MB ort | memory aioinfer/ort |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ref = "skipped" if r.reference_ms is None else f"{r.reference_ms:.1f} ({r.reference_runs}x)"
        speedup = "" if r.reference_ms is None else f"{r.reference_ms / r.aioinfer_ms:.0f}x"
        memory = (
            f"{r.aioinfer_mb / r.onnxruntime_mb:.2f}"
            if r.aioinfer_mb is not None and r.onnxruntime_mb
            else ""
        )
        lines.append(
            f"| {r.title} | {r.aioinfer_ms:.2f} | {r.onnxruntime_ms:.2f} | {ref} | "
            f"{r.aioinfer_ms / r.onnxruntime_ms:.2f} | {speedup} | "
            f"{_mb(r.aioinfer_mb)} | {_mb(r.onnxruntime_mb)} | {memory} |"
        )
    latency = geomean([r.aioinfer_ms / r.onnxruntime_ms for r in rows])
    refs = [r.reference_ms / r.aioinfer_ms for r in rows if r.reference_ms is not None]
    mems = [
        r.aioinfer_mb / r.onnxruntime_mb
        for r in rows
        if r.aioinfer_mb is not None and r.onnxruntime_mb
    ]
    lines.append(
        f"| **geometric mean** | | | | **{latency:.2f}** | "
        f"**{geomean(refs):.0f}x** | | | **{geomean(mems):.2f}** |"
        if refs and mems
        else f"| **geometric mean** | | | | **{latency:.2f}** | | | | |"
    )
    lines.append("")
    lines.append(
        f"onnx.reference: at most 3 runs, stopped once {budget:.0f} s were spent (runs in "
        "parentheses). Max |aioinfer - onnxruntime| per model: "
        + ", ".join(f"{r.name} {r.max_abs_diff:.1e}" for r in rows)
        + "."
    )
    return "\n".join(lines)


def _mb(value: float | None) -> str:
    return "" if value is None else f"{value:.0f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names")
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--runs", type=int, default=10, help="timed runs per block")
    parser.add_argument(
        "--warmup",
        type=int,
        default=3,
        help=f"untimed runs per block (for at least {WARMUP_SECONDS} s)",
    )
    parser.add_argument(
        "--device", default="CPU", help="aioinfer's device (AUTO: compile_model(model))"
    )
    parser.add_argument("--reference-budget", type=float, default=20.0, help="seconds")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak memory runs")
    parser.add_argument("--output", help="also write the table (markdown) to this file")
    parser.add_argument(
        "--memory-probe", nargs=2, metavar=("RUNTIME", "MODEL"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.memory_probe:
        print(json.dumps({"peak_mb": memory_probe(*args.memory_probe)}))
        return
    rows = []
    for name in args.models.split(","):
        row = measure(name, args.blocks, args.runs, args.warmup, args.reference_budget, args.device)
        if not args.no_memory:
            row.aioinfer_mb = peak_memory("aioinfer", name)
            row.onnxruntime_mb = peak_memory("onnxruntime", name)
        rows.append(row)
        print(
            f"{name}: aioinfer {row.aioinfer_ms:.2f} ms, onnxruntime {row.onnxruntime_ms:.2f} ms",
            file=sys.stderr,
            flush=True,
        )
    text = (
        f"Machine: {machine()}; aioinfer on {args.device}\n\n{table(rows, args.reference_budget)}\n"
    )
    print(text)
    if args.output:
        with open(args.output, "w") as out:
            out.write(text)


if __name__ == "__main__":
    main()
