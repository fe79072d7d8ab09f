"""``aioinfer bench``: the workload, the report, the comparison, the plot, the errors."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import onnx
import pytest

from aioinfer.bench import WARMUP_ROUNDS, Measurement, measure
from aioinfer.cli import main
from aioinfer.properties import num_cores
from tests.helpers import mlp_model


def _bench_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(["bench", *argv, "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out)


def _check_latencies(report: dict) -> None:
    lat = report["latency_ms"]
    order = [lat[k] for k in ("min", "p50", "p90", "p95", "p99", "max")]
    assert order == sorted(order) and order[0] > 0
    assert lat["min"] <= lat["mean"] <= lat["max"]
    assert report["throughput"] == pytest.approx(report["count"] / report["seconds"])


def test_iterations_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    start = time.perf_counter()
    report = _bench_json(capsys, ["--iterations", "25", "--no-progress"])
    elapsed = time.perf_counter() - start
    assert report["model"] == "tiny_cnn"
    assert report["device"] == "AUTO (on ORT)"  # the default device, and its choice
    assert report["config"] == {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
    assert report["requests"] == 1  # OPTIMAL_NUMBER_OF_INFER_REQUESTS under LATENCY
    assert report["inputs"] == {"image": {"dtype": "float32", "shape": [1, 3, 32, 32]}}
    assert report["count"] == 25
    # Seconds, each a part of the command's run.
    assert 0 < report["compile_seconds"] < elapsed
    assert 0 < report["first_inference_seconds"] < elapsed
    assert "compare" not in report
    _check_latencies(report)


def test_duration_hint_streams_and_requests(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--duration", "0.3", "--hint", "throughput", "--requests", "3", "--no-progress"]
    report = _bench_json(capsys, argv)
    assert report["config"] == {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": num_cores()}
    assert report["requests"] == 3
    # The callers stop at the first inference that ends after the deadline: each caller's
    # last inference began before it (a second duration of slack for the loop's turns).
    assert 0.3 <= report["seconds"] < 2 * 0.3 + report["latency_ms"]["max"] / 1000
    assert report["count"] > 3
    _check_latencies(report)
    report = _bench_json(capsys, ["--iterations", "4", "--streams", "2", "--no-progress"])
    assert report["config"]["NUM_STREAMS"] == 2
    assert report["requests"] == 2


def test_shape_for_dynamic_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(in_features=4), path)
    report = _bench_json(
        capsys, [str(path), "--shape", "x=16,4", "--iterations", "5", "--no-progress"]
    )
    assert report["model"] == "mlp"
    assert report["inputs"] == {"x": {"dtype": "float32", "shape": [16, 4]}}
    assert report["count"] == 5


def test_text_report_and_progress_bar(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--iterations", "30"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "model:           tiny_cnn" in out
    assert "device:          AUTO (on ORT) (LATENCY, 1 stream(s), 1 request(s) in flight)" in out
    assert "inputs:          image float32 [1, 3, 32, 32]" in out
    assert re.search(r"compile time: +\d+\.\d+ ms", out)
    assert "inferences:      30 in " in out
    assert re.search(r"latency: +median [\d.]+ ms, p90 [\d.]+, p95 [\d.]+, p99 [\d.]+", out)
    assert re.search(r"throughput: +[\d.]+ inferences/s", out)
    # The bar is redrawn in place on stderr and ends full, on its own line.
    assert "\r   aioinfer [" in captured.err
    assert re.search(r"\[#{30}\] 100% +30 inferences +[\d.]+ s\n$", captured.err)


@pytest.mark.anyio
async def test_measure_counts_every_inference_once() -> None:
    calls = []

    async def infer() -> None:
        calls.append(1)

    result = await measure("fake", [infer, infer, infer], duration=None, iterations=10)
    # Untimed warm-up rounds of every caller, then exactly the iterations asked for.
    assert len(calls) == 3 * WARMUP_ROUNDS + 10
    assert len(result.latencies) == 10
    assert result.runtime == "fake" and result.seconds > 0


def test_measurement_percentiles() -> None:
    m = Measurement("x", [i / 1000 for i in range(1, 101)], seconds=2.0)
    assert m.throughput == 50
    lat = m.latency_ms()
    assert lat["min"] == pytest.approx(1) and lat["max"] == pytest.approx(100)
    assert lat["p50"] == pytest.approx(50.5) and lat["p99"] == pytest.approx(99.01)


def test_compare_onnxruntime(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("onnxruntime")
    report = _bench_json(capsys, ["--iterations", "20", "--compare", "onnxruntime"])
    theirs = report["compare"]
    assert theirs["runtime"] == "onnxruntime" and theirs["count"] == 20
    _check_latencies(theirs)
    assert theirs["throughput_ratio"] == pytest.approx(report["throughput"] / theirs["throughput"])
    assert theirs["median_latency_ratio"] == pytest.approx(
        theirs["latency_ms"]["p50"] / report["latency_ms"]["p50"]
    )
    assert main(["bench", "--iterations", "5", "--compare", "onnxruntime"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"ratio: +throughput [\d.]+x, median latency [\d.]+x", out)


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "latency.png"
    assert main(["bench", "--iterations", "20", "--no-progress", "--plot", str(plot)]) == 0
    assert f"histogram:       {plot}" in capsys.readouterr().out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.stat().st_size > 5000


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--iterations", "0"], "error: --iterations must be >= 1, got 0"),
        (["--duration", "0"], "error: --duration must be > 0 seconds, got 0.0"),
        (["--requests", "-1"], "error: --requests must be >= 0"),
        (["--streams", "0"], "invalid value 0 for property 'NUM_STREAMS'"),
        (["--shape", "label=1", "--iterations", "1"], "no input named 'label'"),
        (["--shape", "image=1,3", "--iterations", "1"], "expected rank 4"),
        (["--device", "TPU"], "unknown device 'TPU'"),
        (["--duration", "1", "--iterations", "1"], "not allowed with argument"),
        (["--compare", "tensorrt"], "invalid choice: 'tensorrt'"),
    ],
)
def test_user_errors(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert expected in _error(capsys, argv)


@pytest.mark.parametrize(
    ("module", "argv", "expected"),
    [
        ("matplotlib", ["--plot", "x.png"], "--plot needs the matplotlib package"),
        ("onnxruntime", ["--compare", "onnxruntime"], "needs the onnxruntime package"),
    ],
)
def test_missing_optional_package_is_a_clear_error(
    module: str,
    argv: list[str],
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # import now raises ImportError
    message = _error(capsys, [*argv, "--iterations", "1"])
    assert expected in message and "pip install" in message


def test_unwritable_plot_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "missing-dir" / "plot.png"
    message = _error(capsys, ["--iterations", "3", "--no-progress", "--plot", str(target)])
    assert message.startswith("error: --plot: cannot write") and "missing-dir" in message
