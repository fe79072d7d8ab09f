"""A third-party device is found through its entry point, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

from tests.behaviour.conftest import EXAMPLE_DEVICE, ROOT


def test_fresh_interpreter_finds_the_example_device_by_entry_point():
    script = """
import aioinfer as ai
from importlib.metadata import entry_points
(entry,) = [e for e in entry_points(group="aioinfer.plugins") if e.name == "TWOSTAGE"]
print(entry.value)
core = ai.Core()
print(",".join(core.available_devices))
plugin = core.get_plugin("TWOSTAGE")
print(type(plugin).__module__, plugin.device_name)
import aioinfer_twostage
print(aioinfer_twostage.__file__)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd="/", timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "aioinfer_twostage:TwoStagePlugin"
    assert "CPU" in lines[1].split(",") and "TWOSTAGE" in lines[1].split(",")
    assert lines[2] == "aioinfer_twostage.plugin TWOSTAGE"
    assert lines[3].startswith(str(EXAMPLE_DEVICE))


def test_cli_runs_on_the_example_device():
    aioinfer = [sys.executable, "-m", "aioinfer.cli"]
    info = subprocess.run([*aioinfer, "info"], capture_output=True, text=True, cwd=ROOT)
    assert info.returncode == 0, info.stderr
    assert "TWOSTAGE\n  PERFORMANCE_HINT: LATENCY" in info.stdout
    assert "  DEVICE_NAME: TWOSTAGE" in info.stdout
    run = subprocess.run(
        [*aioinfer, "run", "--device", "TWOSTAGE", "--iterations", "3"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    assert "device:       TWOSTAGE" in run.stdout
    assert "probabilities: float32 [1, 10]" in run.stdout
