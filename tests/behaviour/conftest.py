"""The behaviour suite: the same tests on every device, the built-in ``CPU``, the
onnxruntime device ``ORT`` and the example third-party device ``TWOSTAGE``
(``examples/custom_device``).

The example package is installed into the running environment when it is missing
(``pip install -e``, without dependencies; without build isolation when hatchling is
present, so only the package registry is ever needed), and found by the Core through its
``aioinfer.plugins`` entry point, as any third-party device would be.
"""

from __future__ import annotations

import importlib
import importlib.util
import site
import subprocess
import sys
import sysconfig
from importlib.metadata import entry_points
from pathlib import Path

import onnx
import pytest

import aioinfer as ai
from tests.helpers import mlp_model
from tests.test_async import chain_model

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_DEVICE = ROOT / "examples" / "custom_device"
DEVICES = ("CPU", "TWOSTAGE", "ORT", "OPENVINO")
EXPORTING = ("CPU", "TWOSTAGE", "OPENVINO")
"""The devices that export compiled models (ORT raises ExportError: not yet)."""


def install_example_device() -> None:
    """Install ``examples/custom_device`` (editable) unless its entry point is present."""
    if not any(e.name == "TWOSTAGE" for e in entry_points(group="aioinfer.plugins")):
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
        if importlib.util.find_spec("hatchling") is not None:
            command.append("--no-build-isolation")
        subprocess.run([*command, "-e", str(EXAMPLE_DEVICE)], check=True)
    if importlib.util.find_spec("aioinfer_twostage") is None:
        # Installed during this run: read the editable install's new .pth file.
        site.addsitedir(sysconfig.get_paths()["purelib"])
        importlib.invalidate_caches()


@pytest.fixture(scope="session")
def example_device() -> None:
    install_example_device()


@pytest.fixture(scope="session", params=DEVICES)
def device(request: pytest.FixtureRequest, example_device: None) -> str:
    """The device under test."""
    return str(request.param)


WRAPPED = ("BATCH:CPU", "PROCESS:CPU")
"""The virtual devices, over CPU: the tests that take ``every_device`` run on them too."""


@pytest.fixture(scope="session", params=DEVICES + WRAPPED)
def every_device(request: pytest.FixtureRequest, example_device: None) -> str:
    """The device under test, the virtual devices included (compile with a Core of the
    test's own: the ``core`` fixture is for ``device``)."""
    return str(request.param)


@pytest.fixture(scope="session")
def core(device: str) -> ai.Core:
    core = ai.Core()
    # An environment installed before an entry point was added needs a reinstall.
    assert device in core.available_devices, f"no entry point for {device}: reinstall aioinfer"
    return core


@pytest.fixture(scope="session")
def small(core: ai.Core, device: str) -> tuple[onnx.ModelProto, ai.CompiledModel]:
    """A 3-step chain: quick inferences."""
    model = chain_model(3)
    return model, core.compile_model(model, device)


@pytest.fixture(scope="session")
def slow(core: ai.Core, device: str) -> tuple[onnx.ModelProto, ai.CompiledModel]:
    """A 400-step chain: an inference of 800 kernels, long enough to cancel midway."""
    model = chain_model(400)
    return model, core.compile_model(model, device)


@pytest.fixture(scope="session")
def mlp(core: ai.Core, device: str) -> tuple[onnx.ModelProto, ai.CompiledModel]:
    """Two outputs (``y``, ``z``) and a dynamic batch."""
    model = mlp_model()
    return model, core.compile_model(model, device)
