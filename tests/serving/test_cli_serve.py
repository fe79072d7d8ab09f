"""``aioinfer serve``: a real process on a random port, SIGTERM drains it."""

from __future__ import annotations

import os
import queue
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import onnx
import tritonclient.http as httpclient
import trustme

from tests.helpers import mlp_model, reference_outputs
from tests.serving.conftest import WIDE, chain_model

ROOT = Path(__file__).resolve().parents[2]


def start(
    *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "aioinfer.cli", "serve", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert process.stderr is not None
    stream = process.stderr
    threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
    return process, lines


def wait_for(lines: queue.Queue[str], pattern: str, timeout: float = 60) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match
    raise AssertionError(f"no line matching {pattern!r} in {seen}")


def test_serve_a_model_file_and_drain_on_sigterm(tmp_path: Path) -> None:
    model = chain_model(300)
    onnx.save(model, tmp_path / "chain.onnx")
    process, lines = start(str(tmp_path / "chain.onnx"), "--port", "0")
    try:
        port = wait_for(lines, r"running on http://127\.0\.0\.1:(\d+)").group(1)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=120)
        assert client.is_server_ready()
        x = np.random.default_rng(0).standard_normal((2, WIDE)).astype(np.float32)
        tensor = httpclient.InferInput("x", [2, WIDE], "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer("chain", [tensor])
        expected = reference_outputs(model, {"x": x})[0]
        np.testing.assert_allclose(result.as_numpy("y"), expected, rtol=1e-4, atol=1e-5)

        big = np.ones((1024, WIDE), np.float32)
        slow = httpclient.InferInput("x", list(big.shape), "FP32")
        slow.set_data_from_numpy(big)
        outcome: list[object] = []

        def infer_slow() -> None:  # a client of its own: gevent clients stay in one thread
            other = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=120)
            outcome.append(other.infer("chain", [slow]))

        worker = threading.Thread(target=infer_slow)
        worker.start()
        gauge = 'aioinfer_inference_requests_in_flight{model="chain",version="1"} 1.0'
        deadline = time.monotonic() + 60
        while gauge not in httpx.get(f"http://127.0.0.1:{port}/metrics").text:
            assert time.monotonic() < deadline, "the slow request never started"
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        assert worker.is_alive()  # SIGTERM arrived while the inference was running
        worker.join(120)
        # uvicorn re-raises the signal once it has shut down gracefully.
        assert process.wait(120) in (0, -signal.SIGTERM)
        assert len(outcome) == 1 and outcome[0].as_numpy("y").shape == (1024, WIDE)  # type: ignore[attr-defined]
        wait_for(lines, "Application shutdown complete")
    finally:
        process.kill()
        process.wait()


def test_serve_logs_what_each_model_is_served_with(tmp_path: Path) -> None:
    """No config.json: the server's defaults, said in the startup log."""
    (tmp_path / "mlp" / "1").mkdir(parents=True)
    onnx.save(mlp_model(), tmp_path / "mlp" / "1" / "model.onnx")
    process, lines = start(str(tmp_path), "--port", "0")
    try:
        line = wait_for(lines, r"model 'mlp' version 1: .*").group(0)
        assert re.match(
            r"model 'mlp' version 1: BATCH:(PROCESS:)?AUTO on ORT, hint THROUGHPUT", line
        )
        assert "(server defaults: device AUTO, hint THROUGHPUT, dynamic batching (BATCH)" in line
        wait_for(lines, r"running on http://127\.0\.0\.1:(\d+)")
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) in (0, -signal.SIGTERM)
    finally:
        process.kill()
        process.wait()


def test_serve_reports_a_bad_repository_and_exits_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "aioinfer.cli", "serve", str(tmp_path / "none"), "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "error: model repository" in done.stderr and "does not exist" in done.stderr


def test_serve_with_tls_an_api_key_from_the_environment_and_limits(tmp_path: Path) -> None:
    onnx.save(chain_model(2), tmp_path / "chain.onnx")
    authority = trustme.CA()
    issued = authority.issue_cert("127.0.0.1")
    issued.cert_chain_pems[0].write_to_path(str(tmp_path / "server.pem"))
    issued.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    authority.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    flags = ["--port", "0", "--max-header-count", "10", "--header-timeout", "30"]
    flags += ["--ssl-certfile", str(tmp_path / "server.pem")]
    flags += ["--ssl-keyfile", str(tmp_path / "server.key")]
    process, lines = start(str(tmp_path / "chain.onnx"), *flags, env={"AIOINFER_API_KEY": "k1"})
    try:
        port = wait_for(lines, r"running on https://127\.0\.0\.1:(\d+)").group(1)
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=context) as client:
            assert client.get("/v2/health/ready").status_code == 200
            assert client.get("/v2/models/chain").status_code == 401
            assert client.get("/v2/models/chain", headers={"X-API-Key": "k1"}).status_code == 200
            many = {f"X-{index}": "1" for index in range(12)}
            assert client.get("/v2/health/live", headers=many).status_code == 431
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) in (0, -signal.SIGTERM)
    finally:
        process.kill()
        process.wait()
    done = subprocess.run(
        [sys.executable, "-m", "aioinfer.cli", "serve", str(tmp_path / "chain.onnx")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "AIOINFER_API_KEY": ""},
    )
    assert done.returncode == 2 and "error: the API key is empty" in done.stderr
