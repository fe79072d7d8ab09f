"""A served PROCESS model whose worker dies or hangs: real server processes, real signals.

``aioinfer serve`` runs a PROCESS model and a CPU model. A killed worker fails its
inference with 503 and an error naming the model and the signal; the model reports
not ready until its new worker runs, then answers again; the CPU model, the metrics and
the health endpoints answer throughout. A stopped worker is killed after
``WORKER_TIMEOUT_S`` (503 naming the timeout). SIGTERM ends a server whose worker is
stopped. Results are compared with onnx.reference within ``rtol=1e-4, atol=1e-5``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers import (
    all_threads_stopped,
    chain_model,
    mlp_model,
    process_alive,
    reference_outputs,
)
from tests.serving.conftest import WIDE, write_config, write_model

ROOT = Path(__file__).resolve().parents[2]
CHAIN = chain_model(300, WIDE, seed=2)
MLP = mlp_model(seed=3)
HANG_BOUND = 60.0
"""Seconds after which a wait counts as a hang (never reached when things work)."""
COMPUTING = 3
"""Clock ticks of CPU time an idle worker takes only once it computes."""


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """proc (PROCESS:CPU, a 2 s WORKER_TIMEOUT_S) and cpu (CPU)."""
    write_model(tmp_path, "proc", 1, CHAIN)
    config = {"NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": 1, "WORKER_TIMEOUT_S": 2}
    write_config(tmp_path, "proc", {"device": "PROCESS:CPU", "properties": config})
    write_model(tmp_path, "cpu", 1, MLP)
    write_config(tmp_path, "cpu", {"device": "CPU"})  # in the server's process: one worker
    return tmp_path


class Server:
    """A server process on a free port, its stderr read by a thread."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(
            command, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        stream = self.process.stderr
        assert stream is not None
        threading.Thread(target=lambda: [self.lines.put(x) for x in stream], daemon=True).start()
        seen = []
        deadline = time.monotonic() + HANG_BOUND
        while time.monotonic() < deadline:
            try:
                seen.append(self.lines.get(timeout=0.5))
            except queue.Empty:
                continue
            grpc = re.search(r"gRPC running on (127\.0\.0\.1:\d+)", seen[-1])
            if grpc:
                self.grpc_url = grpc.group(1)
            match = re.search(r"running on http://127\.0\.0\.1:(\d+)", seen[-1])
            if match:
                self.url = f"http://127.0.0.1:{match.group(1)}"
                return
        self.process.kill()
        raise AssertionError(f"the server did not start: {seen}")

    def worker_pid(self) -> int:
        """The pid of the server's PROCESS worker (its one child running the worker)."""
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rpartition(")")[2].split()
                command = (stat.parent / "cmdline").read_bytes()
            except OSError:
                continue
            if int(fields[1]) == self.process.pid and b"aioinfer.devices.process" in command:
                return int(stat.parent.name)
        raise AssertionError("the server has no PROCESS worker")

    def infer(self, model: str, x: np.ndarray, timeout: float = HANG_BOUND) -> httpx.Response:
        tensor = {
            "name": "x",
            "shape": list(x.shape),
            "datatype": "FP32",
            "data": x.ravel().tolist(),
        }
        return httpx.post(
            f"{self.url}/v2/models/{model}/infer", json={"inputs": [tensor]}, timeout=timeout
        )

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=HANG_BOUND)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def server(repository: Path) -> Iterator[Server]:
    live = Server([sys.executable, "-m", "aioinfer.cli", "serve", str(repository), "--port", "0"])
    try:
        yield live
    finally:
        live.stop()


def rows(count: int, seed: int, width: int = WIDE) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, width)).astype(np.float32)


def check(model: onnx.ModelProto, x: np.ndarray, response: httpx.Response) -> None:
    assert response.status_code == 200, response.text
    output = response.json()["outputs"][0]
    (expected,) = reference_outputs(model, {"x": x})[:1]
    got = np.array(output["data"], np.float32).reshape(output["shape"])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])


def in_background(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``call`` on a thread; its result (or exception) lands in the list."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_BOUND
    while not condition():
        assert time.monotonic() < deadline, f"waited {HANG_BOUND:g} s for {what}"
        time.sleep(0.02)


def assert_recovers(server: Server) -> None:
    """Not ready now; the CPU model answers meanwhile; ready again; proc answers."""
    assert server.get("/v2/models/proc/ready").status_code != 200
    x = rows(2, seed=5, width=4)
    check(MLP, x, server.infer("cpu", x))
    wait_until(lambda: server.get("/v2/models/proc/ready").status_code == 200, "readiness")
    x = rows(3, seed=6)
    check(CHAIN, x, server.infer("proc", x))
    failures = [
        line
        for line in server.get("/metrics").text.splitlines()
        if line.startswith("aioinfer_inference_failures_total") and 'model="proc"' in line
    ]
    assert any('reason="unavailable"' in line and line.endswith(" 1.0") for line in failures)


def test_killed_worker_answers_503_then_the_model_recovers(server: Server) -> None:
    x = rows(2, seed=1)
    check(CHAIN, x, server.infer("proc", x))
    pid = server.worker_pid()
    ticks = cpu_ticks(pid)
    # Rows enough for hundreds of milliseconds of compute: the kill lands mid-way even
    # when the kernels are fast and the machine is slow to deliver the signal.
    thread, outcome = in_background(lambda: server.infer("proc", rows(1024, seed=2)))
    wait_until(lambda: cpu_ticks(pid) >= ticks + COMPUTING, "the worker to compute")
    os_kill(pid, signal.SIGKILL)
    thread.join(HANG_BOUND)
    response = outcome[0]
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    for words in ("model 'proc' version 1", f"(pid {pid})", "SIGKILL", "retry"):
        assert words in error, error
    assert_recovers(server)
    assert server.worker_pid() != pid


def test_stopped_worker_answers_503_while_the_server_keeps_answering(server: Server) -> None:
    x = rows(2, seed=1)
    check(CHAIN, x, server.infer("proc", x))
    pid = server.worker_pid()
    stop_process(pid)
    try:
        thread, outcome = in_background(lambda: server.infer("proc", x))
        gauge = 'aioinfer_inference_requests_in_flight{model="proc",version="1"} 1.0'
        # While the worker hangs: metrics, health and the CPU model answer.
        wait_until(lambda: gauge in server.get("/metrics").text, "the request to be in flight")
        assert server.get("/v2/health/live").status_code == 200
        assert server.get("/v2/health/ready").status_code == 200
        small = rows(2, seed=5, width=4)
        check(MLP, small, server.infer("cpu", small))
        thread.join(HANG_BOUND)
        response = outcome[0]
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        for words in ("model 'proc' version 1", f"(pid {pid})", "WORKER_TIMEOUT_S", "retry"):
            assert words in error, error
        assert not process_alive(pid)
        assert_recovers(server)
    finally:
        os_kill(pid, signal.SIGKILL)


def test_sigterm_ends_a_server_whose_worker_is_stopped(repository: Path) -> None:
    """With the default WORKER_TIMEOUT_S (30 s) the stopped worker stays stopped through
    the shutdown; a 5 s drain keeps the test short (``aioinfer serve`` drains 30 s)."""
    write_config(repository, "proc", {"device": "PROCESS:CPU", "properties": {"NUM_STREAMS": 1}})
    script = (
        "import sys; from aioinfer.serving import serve; "
        "serve(sys.argv[1], port=0, drain_timeout=5)"
    )
    server = Server([sys.executable, "-c", script, str(repository)])
    pid = None
    try:
        x = rows(2, seed=1)
        check(CHAIN, x, server.infer("proc", x))
        pid = server.worker_pid()
        stop_process(pid)
        thread, outcome = in_background(lambda: server.infer("proc", x))
        gauge = 'aioinfer_inference_requests_in_flight{model="proc",version="1"} 1.0'
        wait_until(lambda: gauge in server.get("/metrics").text, "the request to be in flight")
        server.process.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal once it has shut down.
        assert server.process.wait(HANG_BOUND) in (0, -signal.SIGTERM)
        assert not process_alive(pid)
        thread.join(HANG_BOUND)
        # The stopped worker never answered: the request ended without a result.
        assert outcome and getattr(outcome[0], "status_code", None) != 200, outcome
    finally:
        os_kill(pid, signal.SIGKILL)
        server.stop()


CLIENT_TIMEOUT = 1.0
"""How long the clients of a stopped worker wait before they give up."""
GAUGE_MARGIN = 2.0
"""How long after its clients gave up a request may still count as in flight: generous
against a busy machine (the server sees each client go within milliseconds), and far
below the worker's timeout (30 s, so the heartbeat plays no part); before, the cancelled
inferences waited five seconds for the stopped worker."""


def in_flight(server: Server, model: str) -> float:
    """The model's ``aioinfer_inference_requests_in_flight`` gauge."""
    prefix = f'aioinfer_inference_requests_in_flight{{model="{model}",version="1"}} '
    for line in server.get("/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    raise AssertionError(f"no in-flight gauge for model {model!r}")


def test_clients_that_give_up_on_a_stopped_worker_are_no_longer_in_flight(
    repository: Path,
) -> None:
    """Two REST clients (httpx) and a gRPC one (tritonclient) give up after a second."""
    write_config(repository, "proc", {"device": "PROCESS:CPU", "properties": {"NUM_STREAMS": 1}})
    command = [sys.executable, "-m", "aioinfer.cli", "serve", str(repository), "--port", "0"]
    server = Server([*command, "--grpc-port", "0"])
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    pid = None
    try:
        x = rows(2, seed=1)
        check(CHAIN, x, server.infer("proc", x))
        pid = server.worker_pid()
        stop_process(pid)
        tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        clients = [
            in_background(lambda: server.infer("proc", x, timeout=CLIENT_TIMEOUT)),
            in_background(lambda: server.infer("proc", x, timeout=CLIENT_TIMEOUT)),
            in_background(lambda: grpc.infer("proc", [tensor], client_timeout=CLIENT_TIMEOUT)),
        ]
        for thread, _ in clients:
            thread.join(HANG_BOUND)
        gave_up = time.monotonic()
        for _, outcome in clients[:2]:
            assert isinstance(outcome[0], httpx.TimeoutException), outcome
        (deadline,) = clients[2][1]
        assert isinstance(deadline, InferenceServerException), deadline
        assert deadline.status() == "StatusCode.DEADLINE_EXCEEDED", deadline
        while (count := in_flight(server, "proc")) != 0:
            waited = time.monotonic() - gave_up
            assert waited < GAUGE_MARGIN, f"{count:g} in flight {waited:.1f} s after"
            time.sleep(0.05)
        assert process_alive(pid)  # the worker is still stopped: nothing answered them
        os.kill(pid, signal.SIGCONT)
        # The continued worker answers the next requests with their own results.
        for seed in (7, 8):
            x = rows(3, seed=seed)
            check(CHAIN, x, server.infer("proc", x))
        assert server.worker_pid() == pid
        assert in_flight(server, "proc") == 0
    finally:
        os_kill(pid, signal.SIGCONT)
        grpc.close()
        server.stop()


def stop_process(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until all its threads have stopped."""
    os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: all_threads_stopped(pid), f"every thread of {pid} to stop")


def os_kill(pid: int | None, signal_number: int) -> None:
    """``os.kill``, of a process that may be gone already."""
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal_number)
