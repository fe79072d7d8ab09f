"""The fixtures of the conformance suite: the devices under test, a Core for each, and
the models compiled for them. Every async test runs under asyncio and trio.

``aioinfer/testing/conftest.py`` brings them to the suite's tests; a project that runs
the suite's modules from a directory of its own does the same in its ``conftest.py``
(``from aioinfer.testing.fixtures import *``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import onnx
import pytest

import aioinfer as ai
from aioinfer.testing.devices import DevicesUnderTest, devices_under_test
from aioinfer.testing.models import accumulator_model, chain_model, mlp_model

__all__ = [
    "anyio_backend",
    "core",
    "device",
    "every_accumulator",
    "every_device",
    "mlp",
    "pytest_generate_tests",
    "slow",
    "small",
]

BACKENDS = ("asyncio", "trio")
_DEVICES = pytest.StashKey[DevicesUnderTest]()


def selected_devices(config: pytest.Config) -> list[str]:
    """The device names ``--aioinfer-device`` selects, else the ``aioinfer_devices`` ini
    setting (:mod:`aioinfer.testing.plugin` declares both); empty selects every device."""
    given = config.getoption("aioinfer_devices") or config.getini("aioinfer_devices")
    return [name.strip() for value in given for name in value.split(",") if name.strip()]


def devices_of_run(config: pytest.Config) -> DevicesUnderTest:
    """The devices of this run, found once (see :func:`devices_under_test`).

    Raises:
        pytest.UsageError: a selected device is not installed or does not load.
    """
    if _DEVICES not in config.stash:
        try:
            found = devices_under_test(ai.Core(), selected_devices(config))
        except ai.UnknownDeviceError as exc:
            raise pytest.UsageError(f"aioinfer conformance suite: {exc}") from None
        config.stash[_DEVICES] = found
    return config.stash[_DEVICES]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each test that uses ``device`` on every real device under test, and each one
    that uses ``every_device`` on the wrapped (virtual) devices too."""
    found = devices_of_run(metafunc.config)
    for name, devices in (("device", found.real), ("every_device", found.every)):
        if name in metafunc.fixturenames:
            metafunc.parametrize(name, devices, indirect=True, scope="session")


@pytest.fixture(params=BACKENDS, scope="module")
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """The anyio backend an async test runs on; parametrized so each test runs on both."""
    return str(request.param)


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    """The device under test: each real device of the run in turn."""
    return str(request.param)


@pytest.fixture(scope="session")
def every_device(request: pytest.FixtureRequest) -> str:
    """The device under test, the virtual devices over real ones included (compile with a
    Core of the test's own: the ``core`` fixture is for ``device``)."""
    return str(request.param)


@pytest.fixture(scope="session")
def core(device: str) -> ai.Core:
    """A Core that compiles for ``device``."""
    core = ai.Core()
    assert device in core.available_devices, f"no entry point for {device}"
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


def compile_accumulator(core: ai.Core, device: str, stateful: bool) -> ai.CompiledModel:
    """:func:`~aioinfer.testing.models.accumulator_model` compiled for ``device``, with
    ``STATEFUL`` ``{"past": "present"}`` when ``stateful``; a batching device (one that
    declares ``BATCH_TIMEOUT_MS``) runs each inference at once, as a batch of one."""
    config: dict[str, Any] = {}
    if "BATCH_TIMEOUT_MS" in core.get_plugin(device).properties:
        config["BATCH_TIMEOUT_MS"] = 0
    if stateful:
        config["STATEFUL"] = {"past": "present"}
    return core.compile_model(accumulator_model(), device, config)


def compile_stateful(core: ai.Core, device: str, model: onnx.ModelProto) -> ai.CompiledModel:
    """``model`` compiled for ``device`` with ``STATEFUL: auto``; a batching device runs
    each inference at once, as a batch of one (as :func:`compile_accumulator`)."""
    config: dict[str, Any] = {"STATEFUL": "auto"}
    if "BATCH_TIMEOUT_MS" in core.get_plugin(device).properties:
        config["BATCH_TIMEOUT_MS"] = 0
    return core.compile_model(model, device, config)


@pytest.fixture(scope="session")
def every_accumulator(every_device: str) -> Iterator[tuple[ai.Core, ai.CompiledModel]]:
    """:func:`compile_accumulator` (without ``STATEFUL``) for ``every_device``, with the
    Core that compiled it; closed at the end of the session, since a virtual device may
    hold a worker process (one compile serves the tests of both backends)."""
    core = ai.Core()
    compiled = compile_accumulator(core, every_device, stateful=False)
    yield core, compiled
    anyio.run(compiled.close)
