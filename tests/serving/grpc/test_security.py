"""gRPC with the REST server's security and limits: TLS from the same certificate files,
the API key from call metadata (health open), the request size limit; and ``aioinfer
serve --grpc-port`` as a real process.

grpc.aio is asyncio's: these servers run under asyncio only (the REST app also runs
under trio, elsewhere).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import trustme
from tritonclient.utils import InferenceServerException

from aioinfer.errors import ServingConfigError
from aioinfer.serving.connection import ConnectionLimits
from aioinfer.serving.grpc import GrpcServer
from tests.helpers import mlp_model, reference_outputs, wait_until
from tests.helpers import scrape_metric as metric
from tests.serving.conftest import WIDE, chain_model, write_model
from tests.serving.grpc.live import LiveGrpcServer

KEY = "s3cret-key-0123456789"
BEARER = {"authorization": f"Bearer {KEY}"}
ROOT = Path(__file__).resolve().parents[3]
RTOL, ATOL = 1e-5, 1e-6


class Certificates:
    """A CA and a server certificate it signed for 127.0.0.1, as PEM files (and the
    certificate and key in one file)."""

    def __init__(self, directory: Path) -> None:
        authority = trustme.CA()
        issued = authority.issue_cert("127.0.0.1", "localhost")
        self.ca = directory / "ca.pem"
        self.cert = directory / "server.pem"
        self.key = directory / "server.key"
        self.combined = directory / "combined.pem"
        authority.cert_pem.write_to_path(str(self.ca))
        issued.cert_chain_pems[0].write_to_path(str(self.cert))
        issued.private_key_pem.write_to_path(str(self.key))
        self.combined.write_bytes(self.key.read_bytes() + self.cert.read_bytes())


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secure-grpc") / "mlp.onnx"
    onnx.save(mlp_model(), path)
    return path


@pytest.fixture(scope="module")
def repository_with_slow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("limits-grpc")
    write_model(repo, "mlp", 1, mlp_model())
    write_model(repo, "slow", 1, chain_model(300))
    return repo


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return Certificates(tmp_path_factory.mktemp("certificates"))


@pytest.fixture(scope="module")
def secure(model_file: Path, certificates: Certificates) -> Iterator[LiveGrpcServer]:
    """TLS with an API key, on both transports."""
    tls = (certificates.cert, certificates.key)
    with LiveGrpcServer(model_file, api_key=KEY, tls=tls) as live:
        yield live


def tls_client(url: str, certificates: Certificates) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(url, ssl=True, root_certificates=str(certificates.ca))


def mlp_input(x: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


def test_tls_with_the_key_in_metadata(secure, certificates):
    client = tls_client(secure.grpc_url, certificates)
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    result = client.infer("mlp", [mlp_input(x)], headers=BEARER)
    expected = reference_outputs(mlp_model(), {"x": x})[0]
    np.testing.assert_allclose(result.as_numpy("y"), expected, rtol=RTOL, atol=ATOL)
    assert client.get_model_metadata("mlp", headers={"x-api-key": KEY}).name == "mlp"
    client.close()


def test_every_rpc_but_health_needs_the_key(secure, certificates):
    client = tls_client(secure.grpc_url, certificates)
    assert client.is_server_live() and client.is_server_ready()  # open, as REST's health
    x = np.ones((1, 4), np.float32)
    calls = [
        lambda headers: client.is_model_ready("mlp", headers=headers),
        lambda headers: client.get_server_metadata(headers=headers),
        lambda headers: client.get_model_metadata("mlp", headers=headers),
        lambda headers: client.infer("mlp", [mlp_input(x)], headers=headers),
    ]
    for call in calls:
        with pytest.raises(InferenceServerException) as caught:
            call(None)
        assert caught.value.status() == "StatusCode.UNAUTHENTICATED"
        assert caught.value.message() == (
            "this RPC needs the server's API key: send it as metadata "
            "'authorization: Bearer <key>' or 'x-api-key: <key>'"
        )
        with pytest.raises(InferenceServerException, match=r"the API key is not valid$"):
            call({"authorization": "Bearer wrong"})
        assert call(BEARER)
    # A stream is refused as a whole, as it opens.
    answers: list[tuple[object, object]] = []
    done = threading.Event()
    client.start_stream(lambda result, error: (answers.append((result, error)), done.set()))
    try:
        client.async_stream_infer("mlp", [mlp_input(x)])
    except InferenceServerException as exc:  # the refusal came first
        assert "no longer in valid state" in exc.message()
    assert done.wait(60)
    client.stop_stream()
    assert answers[0][0] is None
    assert "needs the server's API key" in str(answers[0][1])
    client.close()


def test_plaintext_is_refused_by_a_tls_server(secure):
    client = grpcclient.InferenceServerClient(secure.grpc_url)
    with pytest.raises(InferenceServerException) as caught:
        client.is_server_live(client_timeout=30)
    assert caught.value.status() == "StatusCode.UNAVAILABLE"
    client.close()


def test_a_certificate_file_that_holds_its_key(model_file, certificates):
    with LiveGrpcServer(model_file, tls=(certificates.combined, certificates.combined)) as live:
        assert tls_client(live.grpc_url, certificates).is_server_ready()


def test_bad_security_options_are_refused(model_file, certificates):
    with LiveGrpcServer(model_file) as live:
        service = live.service
        with pytest.raises(ServingConfigError, match="ssl_keyfile needs ssl_certfile"):
            GrpcServer(service, ssl_keyfile=certificates.key)
        with pytest.raises(ServingConfigError, match=r"ssl_certfile .*none\.pem. cannot be read"):
            GrpcServer(service, ssl_certfile=certificates.ca.parent / "none.pem")
        with pytest.raises(ServingConfigError, match="the API key is empty"):
            GrpcServer(service, api_key="")


def test_messages_over_the_request_size_limit_are_refused(model_file):
    with LiveGrpcServer(model_file, max_request_bytes=4096) as live:
        client = grpcclient.InferenceServerClient(live.grpc_url)
        small = np.ones((8, 4), np.float32)
        assert client.infer("mlp", [mlp_input(small)]).as_numpy("y").shape == (8, 3)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("mlp", [mlp_input(np.ones((2048, 4), np.float32))])
        assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert client.infer("mlp", [mlp_input(small)]).as_numpy("y").shape == (8, 3)
        client.close()


def test_connection_limits_bound_concurrent_rpcs_and_metadata(repository_with_slow):
    limits = ConnectionLimits(limit_concurrency=1, max_header_bytes=2048)
    with LiveGrpcServer(repository_with_slow, limits=limits) as live:
        client = grpcclient.InferenceServerClient(live.grpc_url)
        x = np.ones((1, 4), np.float32)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("mlp", [mlp_input(x)], headers={"x-big": "b" * 4096})
        assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "metadata size exceeds hard limit" in caught.value.message()
        assert client.infer("mlp", [mlp_input(x)], headers={"x-small": "s"})
        # One RPC at a time: while slow computes, another call is refused.
        slow = grpcclient.InferInput("x", [1024, WIDE], "FP32")
        slow.set_data_from_numpy(np.ones((1024, WIDE), np.float32))
        outcome: list[object] = []
        other = grpcclient.InferenceServerClient(live.grpc_url)
        worker = threading.Thread(target=lambda: outcome.append(other.infer("slow", [slow])))
        worker.start()
        in_flight = "aioinfer_inference_requests_in_flight"
        wait_until(lambda: metric(live.url, in_flight, model="slow") == 1, 60, "in flight")
        with pytest.raises(InferenceServerException) as caught:
            client.infer("mlp", [mlp_input(x)])
        assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        worker.join(120)
        assert len(outcome) == 1
        assert client.infer("mlp", [mlp_input(x)])
        other.close()
        client.close()


def test_the_grpc_client_example_runs():
    done = subprocess.run(
        [sys.executable, "examples/grpc_client.py"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "live True, ready True"
    assert lines[1] == "model tiny_cnn versions ['1']: image FP32[-1, 3, 32, 32]"
    assert re.fullmatch(r"8 concurrent requests: classes \[(\d, ){7}\d\]", lines[2])
    assert lines[3] == "stream answered ['s0', 's1', 's2']"
    assert lines[4] == "512 images with a 5 ms deadline: StatusCode.DEADLINE_EXCEEDED"
    assert re.fullmatch(r"the next request: class \d in \d+ ms", lines[5])


# -- aioinfer serve --grpc-port --------------------------------------------------------------


def start(*args: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "aioinfer.cli", "serve", *args],
        cwd=ROOT,
        env={**os.environ, **env},
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


def test_serve_grpc_port_with_tls_and_a_key(model_file, certificates):
    flags = ["--port", "0", "--grpc-port", "0"]
    flags += ["--ssl-certfile", str(certificates.cert), "--ssl-keyfile", str(certificates.key)]
    process, lines = start(str(model_file), *flags, env={"AIOINFER_API_KEY": KEY})
    try:
        port = wait_for(lines, r"gRPC running on 127\.0\.0\.1:(\d+) \(TLS\)").group(1)
        wait_for(lines, r"running on https://127\.0\.0\.1:\d+")
        client = tls_client(f"127.0.0.1:{port}", certificates)
        assert client.is_server_ready()
        x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
        result = client.infer("mlp", [mlp_input(x)], headers=BEARER)
        expected = reference_outputs(mlp_model(), {"x": x})[0]
        np.testing.assert_allclose(result.as_numpy("y"), expected, rtol=RTOL, atol=ATOL)
        with pytest.raises(InferenceServerException, match="needs the server's API key"):
            client.get_model_metadata("mlp")
        client.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) in (0, -signal.SIGTERM)
    finally:
        process.kill()
        process.wait()


def test_sigterm_lets_an_inference_in_flight_over_grpc_finish(tmp_path):
    model = chain_model(300)
    onnx.save(model, tmp_path / "chain.onnx")
    process, lines = start(str(tmp_path / "chain.onnx"), "--port", "0", "--grpc-port", "0", env={})
    try:
        port = wait_for(lines, r"gRPC running on 127\.0\.0\.1:(\d+) \(plaintext\)").group(1)
        rest = wait_for(lines, r"running on http://127\.0\.0\.1:(\d+)").group(1)
        # 4096 rows: about a second of compute, so that the inference seen in flight
        # is still running when the signal follows on a loaded machine.
        x = np.random.default_rng(0).standard_normal((4096, WIDE)).astype(np.float32)
        tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        outcome: list[object] = []

        def infer() -> None:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
            try:
                outcome.append(client.infer("chain", [tensor]).as_numpy("y"))
            except InferenceServerException as exc:
                outcome.append(exc)
            client.close()

        worker = threading.Thread(target=infer)
        worker.start()
        in_flight = "aioinfer_inference_requests_in_flight"
        wait_until(
            lambda: metric(f"127.0.0.1:{rest}", in_flight, model="chain") == 1, 60, "in flight"
        )
        process.send_signal(signal.SIGTERM)
        assert worker.is_alive()  # SIGTERM arrived while the inference was running
        worker.join(120)
        assert process.wait(120) in (0, -signal.SIGTERM)
        assert len(outcome) == 1 and isinstance(outcome[0], np.ndarray), outcome
        expected = reference_outputs(model, {"x": x})[0]
        # 300 chained float32 products: rounding accumulates.
        np.testing.assert_allclose(outcome[0], expected, rtol=1e-3, atol=1e-4)
    finally:
        process.kill()
        process.wait()


def test_a_grpc_port_in_use_is_reported_and_exits_2(model_file):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "aioinfer.cli", "serve", str(model_file)]
        done = subprocess.run(
            [*command, "--port", "0", "--grpc-port", str(port)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2
    assert f"error: cannot serve gRPC on 127.0.0.1:{port}: " in done.stderr
