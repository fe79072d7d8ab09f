"""``aioinfer serve REPO --ray --replicas 2`` as a new user runs it: no Ray cluster of
their own (the command starts a local instance of the machine's CPUs), a repository of
two models without Ray options, tritonclient as the client, and SIGTERM or Ctrl-C to
stop it, after which none of the processes it started may remain.

Each test starts its own local Ray instance (tens of seconds on a small machine), so
there are few of them; the fixture kills whatever a failed test leaves behind.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
import tritonclient.http as triton

from tests.helpers import mlp_model, reference_outputs, wait_until
from tests.ray.conftest import free_port
from tests.serving.conftest import write_config, write_model

MODELS = {"mlp": mlp_model(seed=0), "wide": mlp_model(8, 5, seed=1)}
"""The repository: two small models, no config."""

START_GUARD = 600
"""Seconds a command may take to start Ray and deploy (a hang guard, not a measure)."""

EXIT_GUARD = 120
"""Seconds a command may take to exit after a signal (a hang guard; the tests compare
with a control)."""


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("two-models")
    for name, model in MODELS.items():
        write_model(repo, name, 1, model)
    return repo


@dataclass
class ServeCommand:
    """A running ``aioinfer serve REPO --ray --replicas 2`` (in a process group of its
    own) and the processes it was seen to start."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path
    started: set[psutil.Process] = field(default_factory=set)
    """Every descendant seen so far (Ray's workers leave the command's process group)."""

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def descendants(self) -> set[psutil.Process]:
        """The command's descendants now, remembered in :attr:`started`."""
        try:
            now = set(psutil.Process(self.process.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            now = set()
        self.started |= now
        return now

    def leftovers(self) -> list[psutil.Process]:
        """The processes it started that still run: those seen, those in its process
        group, and the workers of its raylets (they carry their raylet's pid)."""
        raylets = {str(p.pid) for p in self.started if _is_raylet(p)}
        alive = {p for p in self.started if _running(p)}
        for process in psutil.process_iter():
            try:
                if os.getpgid(process.pid) == self.process.pid or (
                    process.environ().get("RAY_RAYLET_PID") in raylets
                ):
                    alive.add(process)
            except (psutil.Error, ProcessLookupError):
                continue
        return sorted((p for p in alive if _running(p)), key=lambda p: p.pid)

    def ready(self) -> bool:
        """Whether the server says it is ready (False while it deploys)."""
        if self.process.poll() is not None:
            raise AssertionError(f"aioinfer serve --ray exited: {self.stderr()}")
        self.descendants()
        try:
            return httpx.get(f"http://{self.url}/v2/health/ready", timeout=10).status_code == 200
        except httpx.TransportError:
            return False


def _name(process: psutil.Process) -> str:
    """The process's command line (Ray's workers set theirs to ``ray::<actor class>``;
    their short name is cut at 15 characters)."""
    try:
        return " ".join(process.cmdline()) or process.name()
    except psutil.Error:
        return ""


def _is_raylet(process: psutil.Process) -> bool:
    return _name(process).split(" ")[0].endswith("/raylet")


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture
def serve_command(tmp_path: Path) -> Iterator[Callable[[Path], ServeCommand]]:
    """Start ``aioinfer serve REPO --ray --replicas 2`` as a user would (no
    ``RAY_ADDRESS``); at the end, kill whatever it left running."""
    commands: list[ServeCommand] = []

    def start(repo: Path) -> ServeCommand:
        port = free_port()
        env = {name: value for name, value in os.environ.items() if name != "RAY_ADDRESS"}
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        log = tmp_path / f"stderr-{len(commands)}"
        argv = ["serve", str(repo), "--ray", "--replicas", "2", "--port", str(port)]
        with log.open("wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "aioinfer.cli", *argv],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        commands.append(ServeCommand(process, f"127.0.0.1:{port}", log))
        return commands[-1]

    yield start
    for command in commands:
        if command.process.poll() is None:
            command.descendants()
            os.killpg(command.process.pid, signal.SIGKILL)
        command.process.wait()
        for process in command.leftovers():
            process.kill()


def stop_and_check(command: ServeCommand, signum: int, control: float) -> None:
    """Send ``signum`` (SIGINT to the process group, as a terminal's Ctrl-C does) and
    check that the command exits with 0 within ``control`` seconds (measured by the
    test) and that none of the processes it started remain soon after."""
    command.descendants()
    assert any(_is_raylet(p) for p in command.started), "no local Ray instance seen"
    start = time.perf_counter()
    if signum == signal.SIGINT:
        os.killpg(command.process.pid, signal.SIGINT)
    else:
        command.process.send_signal(signum)
    code = command.process.wait(EXIT_GUARD)
    took = time.perf_counter() - start
    assert code == 0, command.stderr()
    assert took < control, (took, control, command.stderr())
    wait_until(lambda: not command.leftovers(), timeout=30, what="Ray's processes to exit")


def infer(client: triton.InferenceServerClient, name: str, x: np.ndarray) -> None:
    """Infer ``name`` on ``x`` through tritonclient and compare with onnxruntime."""
    inputs = [triton.InferInput("x", list(x.shape), "FP32")]
    inputs[0].set_data_from_numpy(x)
    result = client.infer(name, inputs)
    expected = reference_outputs(MODELS[name], {"x": x})
    for output, want in zip(("y", "z"), expected, strict=True):
        np.testing.assert_allclose(result.as_numpy(output), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_two_models_with_two_replicas_serve_then_stop_with_ray(two_models, serve_command, signum):
    command = serve_command(two_models)
    # The control: starting Ray and deploying; stopping must take less.
    started = wait_until(command.ready, timeout=START_GUARD, what="aioinfer serve --ray")
    client = triton.InferenceServerClient(command.url, network_timeout=60)
    assert client.is_server_ready()
    rng = np.random.default_rng(0)
    for name in MODELS:
        assert client.is_model_ready(name)
        width = MODELS[name].graph.input[0].type.tensor_type.shape.dim[1].dim_value
        for rows in (1, 3):
            infer(client, name, rng.standard_normal((rows, width)).astype(np.float32))
    client.close()
    stop_and_check(command, signum, control=started)


def test_sigterm_while_deploying_stops_it_and_its_ray_instance(two_models, serve_command):
    command = serve_command(two_models)

    def deploying() -> bool:
        assert not command.ready()
        return any("ServeController" in _name(p) for p in command.descendants())

    # The control: from the start to Serve's controller, which then deploys the models
    # (on a quiet machine the first model replica can come within a poll of readiness,
    # so the signal goes at the controller, while the deployment waits for the models).
    started = wait_until(deploying, timeout=START_GUARD, what="Serve's controller to start")
    stop_and_check(command, signal.SIGTERM, control=started)


def test_replicas_the_machine_cannot_hold_are_refused_naming_the_model(
    two_models, serve_command, tmp_path
):
    repo = tmp_path / "repo"
    shutil.copytree(two_models, repo)
    asked = 4 * (os.cpu_count() or 1)
    write_config(repo, "wide", {"ray": {"ray_actor_options": {"num_cpus": asked}}})
    command = serve_command(repo)

    def exited() -> bool:
        command.descendants()
        return command.process.poll() is not None

    wait_until(exited, timeout=START_GUARD, what="aioinfer serve --ray to refuse the replicas")
    assert command.process.returncode == 2, command.stderr()
    # Refused before anything was deployed: Serve never started.
    assert not any("Serve" in _name(p) for p in command.started), command.started
    error = command.stderr()
    found = re.search(
        rf"error: the replicas of .* do not fit the local Ray instance: model 'wide' asks "
        rf"for {asked} CPUs per replica, more than any node of the cluster has \(the largest "
        r"has (\d+) CPUs?\)",
        error,
    )
    assert found, error
    assert 1 <= int(found.group(1)) < asked
    assert "model 'mlp'" not in error.partition("error: ")[2]
    wait_until(lambda: not command.leftovers(), timeout=30, what="Ray's processes to exit")
