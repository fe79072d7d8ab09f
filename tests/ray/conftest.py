"""One local Ray cluster and one aioinfer application on it for the whole test session.

Starting Ray and the replicas takes seconds, so every Ray test shares them: 2 logical
CPUs, each replica a fraction of one. The cluster is a new local one (never one found
on the machine), and is shut down, with every process it started, at the end. The
application is deployed by the command line, ``aioinfer serve REPO --ray``, joining the
cluster.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from aioinfer.ray import APP_NAME  # noqa: E402
from tests import helpers  # noqa: E402
from tests.helpers import wait_until  # noqa: E402
from tests.serving.conftest import write_config, write_model  # noqa: E402

SLOW_WIDTH = 256
"""The width of the slow model's chain (its input is ``[n, SLOW_WIDTH]``)."""

RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    # Ray Serve kills a proxy that is not ready within 5 s; on a loaded machine starting
    # its process takes longer (aioinfer.ray.run allows a local instance as much).
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
}


def _replicas(count: int) -> dict[str, Any]:
    return {"num_replicas": count, "ray_actor_options": {"num_cpus": 0.2}}


@dataclass
class RayApp:
    """The application under test: its URL (host:port of Ray's proxy) and repository."""

    url: str
    repository: Path

    def handle(self, model: str) -> Any:
        """The deployment handle of ``model``'s replicas (from the test process)."""
        return serve.get_deployment_handle(f"model:{model}", app_name=APP_NAME)

    def replica_statuses(self, model: str, count: int, timeout: float = 60) -> dict[int, Any]:
        """``status()`` of ``count`` distinct replicas of ``model`` (by pid): asked until
        Ray's routing has reached that many."""
        handle = self.handle(model)
        statuses: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(statuses) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"reached {len(statuses)} replicas of {model}, not {count}")
            status = handle.status.remote().result(timeout_s=timeout)
            statuses[status["pid"]] = status
        return statuses


@pytest.fixture(scope="session")
def ray_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mlp (versions 1 and 2, both served, batched, 2 replicas), accumulator (stateful, 2 replicas),
    slow (a long chain, one inference at a time per replica, 2 replicas)."""
    repo = tmp_path_factory.mktemp("ray-repo")
    write_model(repo, "mlp", 1, helpers.mlp_model(seed=0))
    write_model(repo, "mlp", 2, helpers.mlp_model(seed=1))
    write_config(
        repo,
        "mlp",
        {
            "batching": {"max_batch_size": 8, "timeout_ms": 20},
            "ray": _replicas(2),
            "version_policy": {"all": {}},
        },
    )
    write_model(repo, "accumulator", 1, helpers.accumulator_model())
    write_config(repo, "accumulator", {"stateful": {"past": "present"}, "ray": _replicas(2)})
    write_model(repo, "slow", 1, helpers.chain_model(500, SLOW_WIDTH, seed=1))
    write_config(repo, "slow", {"max_concurrency": 1, "max_queue": 4, "ray": _replicas(2)})
    return repo


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def ray_app(ray_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayApp]:
    """The repository served by ``aioinfer serve --ray`` on a new local cluster (once per
    session): the tests connect to the cluster, the command joins it (``RAY_ADDRESS``).

    At the end the command gets SIGTERM: its teardown checks that it exits with 0 and
    deletes its application; then the cluster is shut down with every process of it.
    """
    saved = {name: os.environ.get(name) for name in RAY_ENV}
    os.environ.update(RAY_ENV)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    command = None
    try:
        port = free_port()
        env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
        log = tmp_path_factory.mktemp("ray-serve") / "stderr"
        arguments = ["serve", str(ray_repository), "--ray", "--port", str(port)]
        with log.open("wb") as stderr:
            command = subprocess.Popen(
                [sys.executable, "-m", "aioinfer.cli", *arguments],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        url = f"127.0.0.1:{port}"
        wait_until(lambda: _ready(url, command, log), timeout=300, what="aioinfer serve --ray")
        yield RayApp(url, ray_repository)
        command.send_signal(signal.SIGTERM)
        assert command.wait(120) == 0, log.read_text()[-2000:]
        assert APP_NAME not in serve.status().applications
    finally:
        if command is not None and command.poll() is None:
            command.kill()
            command.wait()
        serve.shutdown()
        ray.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _ready(url: str, command: subprocess.Popen[bytes], log: Path) -> bool:
    if command.poll() is not None:
        raise AssertionError(f"aioinfer serve --ray exited: {log.read_text()[-2000:]}")
    try:
        if httpx.get(f"http://{url}/v2/health/ready", timeout=10).status_code == 200:
            return True
    except httpx.TransportError:
        pass
    time.sleep(0.2)
    return False
