"""``aioinfer serve REPO --ray``: a local Ray instance of its own, stopped by SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from aioinfer.cli import main
from tests.helpers import mlp_model, process_alive, wait_until
from tests.ray.conftest import RAY_ENV, free_port
from tests.serving.conftest import write_config, write_model


def descendants(pid: int) -> set[int]:
    """The processes below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def test_serve_ray_runs_the_repository_and_stops_on_sigterm(tmp_path):
    write_model(tmp_path, "mlp", 1, mlp_model())
    write_config(tmp_path, "mlp", {"ray": {"ray_actor_options": {"num_cpus": 0.2}}})
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    command = [sys.executable, "-m", "aioinfer.cli", "serve", str(tmp_path), "--ray"]
    server = subprocess.Popen(
        [*command, "--replicas", "1", "--port", str(port)],
        env={**env, **RAY_ENV},
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "stderr").open("wb"),
    )
    try:

        def ready() -> bool:
            assert server.poll() is None, "aioinfer serve --ray exited"
            try:
                return httpx.get(f"http://127.0.0.1:{port}/v2/health/ready").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, timeout=180, what="the Ray application to serve")
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1] * 4}]}
        response = httpx.post(f"http://127.0.0.1:{port}/v2/models/mlp/infer", json=body)
        assert response.status_code == 200 and response.json()["model_name"] == "mlp"
        started = descendants(server.pid)  # Ray's processes: GCS, raylet, workers
        assert started
        server.send_signal(signal.SIGTERM)
        assert server.wait(120) == 0
        wait_until(
            lambda: not any(process_alive(pid) for pid in started),
            timeout=60,
            what="Ray's processes to exit",
        )
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--replicas", "2"], "--replicas needs --ray"),
        (["--ray", "--header-timeout", "3"], "--header-timeout: not available with --ray"),
    ],
)
def test_serve_ray_refuses_options_it_cannot_honour(tmp_path, capsys, argv, words):
    write_model(tmp_path, "mlp", 1, mlp_model())
    assert main(["serve", str(tmp_path), *argv]) == 2
    assert words in capsys.readouterr().err
