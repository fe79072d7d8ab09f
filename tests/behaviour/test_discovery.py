"""A third-party device, installed, is found through its entry point in a fresh
interpreter, and runs the conformance suite by the command its README gives."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

from tests.example_device import ADDED_PATHS, EXAMPLE_DEVICE, ROOT


def install(target: Path) -> dict[str, str]:
    """Install the example device into ``target`` as a user would (a wheel built from its
    ``pyproject.toml``, without dependencies or build isolation: no package registry); the
    environment of an interpreter that sees that installation, not the test run's path."""
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
    command += ["--no-build-isolation", "--no-compile", "--target", str(target)]
    done = subprocess.run(
        [*command, str(EXAMPLE_DEVICE)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    env = dict(os.environ)
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in ADDED_PATHS]
    env["PYTHONPATH"] = os.pathsep.join([str(target), *kept])
    return env


def test_fresh_interpreter_finds_the_installed_example_device_by_entry_point(tmp_path):
    target = tmp_path / "site-packages"
    env = install(target)
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
        [sys.executable, "-c", script], capture_output=True, text=True, cwd="/", env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "aioinfer_twostage:TwoStagePlugin"
    assert "CPU" in lines[1].split(",") and "TWOSTAGE" in lines[1].split(",")
    assert lines[2] == "aioinfer_twostage.plugin TWOSTAGE"
    assert lines[3].startswith(str(target))


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


PYTEST11 = '"aioinfer.testing.plugin" = "aioinfer.testing.plugin"'
"""aioinfer's ``pytest11`` entry point, as pyproject.toml declares it."""


def pytest11_entry_points(tmp_path: Path) -> dict[str, str]:
    """The environment for a pytest that loads aioinfer's pytest plugin by its
    ``pytest11`` entry point, as an installed aioinfer does: when the installed metadata
    predates the entry point, a distribution in ``tmp_path`` declares it."""
    assert PYTEST11 in (ROOT / "pyproject.toml").read_text()
    env = dict(os.environ)
    tmp_path.mkdir()
    if any(e.value == "aioinfer.testing.plugin" for e in entry_points(group="pytest11")):
        return env
    dist = tmp_path / "aioinfer_pytest11-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: aioinfer-pytest11\nVersion: 0\n")
    entry = PYTEST11.replace('"', "")  # TOML's quotes off: the INI of entry_points.txt
    (dist / "entry_points.txt").write_text(f"[pytest11]\n{entry}\n")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    return env


def run_suite(cwd: Path, env: dict[str, str], *options: str) -> list[str]:
    """Run ``pytest --pyargs aioinfer.testing`` in ``cwd``; the tests that passed."""
    command = [sys.executable, "-m", "pytest", "--pyargs", "aioinfer.testing"]
    done = subprocess.run(
        [*command, "-v", "-p", "no:cacheprovider", *options],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert "SKIPPED" not in done.stdout and "FAILED" not in done.stdout, done.stdout[-3000:]
    return [line.split()[0] for line in done.stdout.splitlines() if " PASSED" in line]


def test_the_example_device_runs_the_conformance_suite_as_documented(tmp_path):
    """The commands of the example's README run the suite on TWOSTAGE alone: in
    examples/custom_device, selected by its pyproject.toml; anywhere, selected by
    ``--aioinfer-device``. Only the modules that check the device's declarations: the
    others ran on TWOSTAGE in this session already."""
    env = pytest11_entry_points(tmp_path / "site")
    declarations = ["-k", "test_device or test_export"]
    ran = run_suite(EXAMPLE_DEVICE, env, *declarations)
    assert len(ran) >= 5 and all("TWOSTAGE" in test for test in ran), ran
    assert not any(":TWOSTAGE" in test for test in ran), ran  # no virtual device
    ran = run_suite(tmp_path, env, "--aioinfer-device", "TWOSTAGE,BATCH", "-k", "test_device")
    devices = {test.partition("[")[2].rstrip("]") for test in ran}
    assert devices == {"TWOSTAGE", "BATCH:TWOSTAGE"}, ran
