"""``aioinfer serve`` with models on the OPENVINO device (config.json ``"device"``): a real
server process on a random port, queried with tritonclient."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import tritonclient.http as httpclient

from tests.helpers import mlp_model, reference_outputs

ROOT = Path(__file__).resolve().parents[2]


def write_model(repo: Path, name: str, config: dict[str, object]) -> onnx.ModelProto:
    model = mlp_model(seed=len(name))
    (repo / name / "1").mkdir(parents=True)
    onnx.save(model, repo / name / "1" / "model.onnx")
    (repo / name / "config.json").write_text(json.dumps(config))
    return model


def test_serve_models_on_openvino(tmp_path: Path) -> None:
    # ENABLE_CPU_PINNING is an OpenVINO property: the CPU device would refuse it, so the
    # server serves these models on OPENVINO or not at all.
    engine = {"ENABLE_CPU_PINNING": False}
    plain = write_model(tmp_path, "plain", {"device": "OPENVINO", "properties": engine})
    batched = write_model(
        tmp_path,
        "batched",
        {
            "device": "OPENVINO",
            "properties": engine,
            "batching": {"max_batch_size": 8, "timeout_ms": 20},
        },
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "aioinfer.cli", "serve", str(tmp_path), "--port", "0"],
        cwd=ROOT,
        env=dict(os.environ),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        port = _port(process)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", concurrency=8)
        assert client.is_model_ready("plain") and client.is_model_ready("batched")
        for name, model in (("plain", plain), ("batched", batched)):
            x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
            result = client.infer(name, [_input(x)])
            want_y, want_z = reference_outputs(model, {"x": x})
            np.testing.assert_allclose(result.as_numpy("y"), want_y, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(result.as_numpy("z"), want_z, rtol=1e-4, atol=1e-5)
        # Concurrent requests to the batched model (BATCH:OPENVINO): each gets its rows.
        xs = [np.full((1, 4), i, np.float32) for i in range(8)]
        pending = [client.async_infer("batched", [_input(x)]) for x in xs]
        results = [request.get_result() for request in pending]
        for x, result in zip(xs, results):
            want = reference_outputs(batched, {"x": x})[0]
            np.testing.assert_allclose(result.as_numpy("y"), want, rtol=1e-4, atol=1e-5)
        client.close()
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            assert process.wait(60) in (0, -signal.SIGTERM)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def _input(x: np.ndarray) -> httpclient.InferInput:
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


def _port(process: subprocess.Popen[str]) -> str:
    """The port the server says it listens on (its stderr is read on a thread, so that a
    server that never says it cannot hang the test)."""
    assert process.stderr is not None
    stream = process.stderr
    found: list[str] = []
    seen: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in stream:
            seen.append(line)
            match = re.search(r"running on http://127\.0\.0\.1:(\d+)", line)
            if match and not found:
                found.append(match.group(1))
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 60
    while not ready.wait(0.2):
        if process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the server did not start: {seen}")
    return found[0]
