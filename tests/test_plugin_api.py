"""The open plugin API: a device declares its own properties, without editing aioinfer.

The device here is the CPU device plus one property of its own, ``COLOUR``, declared in
this module (as a third-party package would declare it in its own).
"""

from __future__ import annotations

import numpy as np
import pytest

import aioinfer as ai
from aioinfer.devices.cpu.plugin import CPUPlugin
from aioinfer.properties import Property, choice, declare
from tests.helpers import mlp_model

MLP = mlp_model()
X = np.ones((2, 4), np.float32)

COLOUR = Property(
    "COLOUR", "A setting of this device alone.", default="RED", parse=choice("RED", "BLUE")
)


class ColourPlugin(CPUPlugin):
    """The CPU device, with a property of its own."""

    device_name = "COLOUR"
    properties = declare(*CPUPlugin.properties.values(), COLOUR)


@pytest.fixture
def core() -> ai.Core:
    core = ai.Core()
    core.register_plugin(ColourPlugin())
    return core


def test_a_device_declares_a_property_of_its_own(core: ai.Core) -> None:
    compiled = core.compile_model(MLP, "COLOUR", {"COLOUR": "blue"})
    assert compiled.get_property("COLOUR") == "BLUE"
    assert "COLOUR" in compiled.get_property("SUPPORTED_PROPERTIES")
    assert core.compile_model(MLP, "COLOUR").get_property("COLOUR") == "RED"  # the default
    assert core.get_property("COLOUR", "COLOUR") == "RED"
    with pytest.raises(ai.InvalidPropertyValueError, match="'GREEN' for property 'COLOUR'"):
        core.compile_model(MLP, "COLOUR", {"COLOUR": "GREEN"})
    # Another device does not know it.
    with pytest.raises(ai.UnknownPropertyError, match="'COLOUR'"):
        core.compile_model(MLP, "CPU", {"COLOUR": "BLUE"})
    assert "COLOUR" not in core.get_property("CPU", "SUPPORTED_PROPERTIES")


def test_core_settings_take_a_property_a_device_declares(core: ai.Core) -> None:
    core.set_property({"COLOUR": "BLUE"})  # for every device: the one that declares it
    assert core.get_property("COLOUR") == "BLUE"
    assert core.compile_model(MLP, "COLOUR").get_property("COLOUR") == "BLUE"
    assert core.compile_model(MLP, "CPU").get_property("DEVICE_NAME") == "CPU"  # unaffected
    core.set_property("COLOUR", {"COLOUR": "RED"})
    assert core.compile_model(MLP, "COLOUR").get_property("COLOUR") == "RED"
    with pytest.raises(ai.InvalidPropertyValueError, match="COLOUR"):
        core.set_property({"COLOUR": 7})


def test_device_properties_live_with_their_device() -> None:
    core = ai.Core()
    cpu = set(core.get_property("CPU", "SUPPORTED_PROPERTIES"))
    assert {
        "MAX_BATCH_SIZE",
        "BATCH_TIMEOUT_MS",
        "WORKER_TIMEOUT_S",
        "TARGET_DEVICE",
    } & cpu == set()
    assert {"ACTIVATION_MEMORY_BYTES", "ALLOW_AUTO_BATCHING"} <= cpu
    assert "MAX_BATCH_SIZE" in core.get_property("BATCH", "SUPPORTED_PROPERTIES")
    assert "WORKER_TIMEOUT_S" in core.get_property("PROCESS", "SUPPORTED_PROPERTIES")


def test_import_refuses_properties_fixed_by_the_compile() -> None:
    """Only properties declared mutable may be given again at import (the others would be
    silently ignored: the blob holds what the compile made of them)."""
    core = ai.Core()
    blob = core.compile_model(MLP, "CPU").export_model()
    for fixed in ({"STATEFUL": {}}, {"ALLOW_AUTO_BATCHING": False}):
        (name,) = fixed
        with pytest.raises(ai.InvalidPropertyValueError, match=f"{name} cannot be set when"):
            core.import_model(blob, "CPU", fixed)
    imported = core.import_model(blob, "CPU", {"NUM_STREAMS": 2, "PERF_COUNT": True})
    assert imported.get_property("NUM_STREAMS") == 2
    assert imported.create_infer_request().infer_sync({"x": X})
