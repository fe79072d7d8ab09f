"""The examples of examples/ (queue throughput, cancellation) run and say what they show."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from tests.helpers import mlp_model

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run_example(name: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_queue_throughput(backend: str) -> None:
    out = run_example("queue_throughput.py", "--seconds", "0.2", "--backend", backend)
    assert out.startswith("tiny_cnn.onnx: input image [1, 3, 32, 32], 0.2 s per hint\n")
    rows = re.findall(r"(LATENCY|THROUGHPUT) +(\d+) stream\(s\), (\d+) requests: +(\d+) ", out)
    assert [r[0] for r in rows] == ["LATENCY", "THROUGHPUT"]
    latency, throughput = rows
    assert latency[1:3] == ("1", "1")
    # Twice the streams, times 16 rows per batch: the THROUGHPUT hint batches tiny_cnn.
    assert int(throughput[2]) == 2 * int(throughput[1]) * 16
    assert all(int(r[3]) > 0 for r in rows)


def test_queue_throughput_batch_and_model(tmp_path: Path) -> None:
    model = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(in_features=8), model)
    out = run_example("queue_throughput.py", str(model), "--seconds", "0.1", "--batch", "3")
    assert out.startswith("mlp.onnx: input x [3, 8], 0.1 s per hint\n")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_cancellation(backend: str) -> None:
    out = run_example("cancellation.py", "--batch", "64", "--timeout-ms", "1", "--backend", backend)
    lines = out.splitlines()
    assert re.fullmatch(r"a full inference of 64 images takes [\d.]+ ms", lines[0])
    assert re.fullmatch(
        r"impatient client: client gone after [\d.]+ ms; request idle, "
        r"InferCancelledError\('the inference was cancelled'\)",
        lines[1],
    )
    # The same request served the next client.
    assert re.fullmatch(
        r"patient client: +answered in [\d.]+ ms: classes \[\d(, \d){7}\]", lines[2]
    )
    assert sorted(lines[3:]) == [
        "disconnected client: request idle",
        "staying client:      classes [0, 0, 0, 0]",
    ]
