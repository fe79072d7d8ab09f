"""How the conformance suite picks its devices (aioinfer.testing.devices): from the
entry points, virtual devices over a real one, a selection by name, capabilities from the
device-level properties."""

from __future__ import annotations

import pytest

import aioinfer as ai
from aioinfer.testing.devices import (
    DevicesUnderTest,
    capabilities,
    devices_under_test,
    exports,
    installed_devices,
    is_virtual,
)
from aioinfer.testing.models import mlp_model


@pytest.fixture(scope="module")
def core() -> ai.Core:
    return ai.Core()


def test_virtual_devices_are_those_that_declare_a_target(core):
    real, virtual = installed_devices(core)
    assert {"BATCH", "PROCESS"} <= set(virtual)
    assert {"CPU", "TWOSTAGE"} <= set(real)
    assert all(is_virtual(core.get_plugin(name)) for name in virtual)
    assert not any(is_virtual(core.get_plugin(name)) for name in real)
    assert real[0] == "CPU"  # the default device, which the virtual ones run over


def test_by_default_every_installed_device_and_the_virtual_ones_over_the_default(core):
    found = devices_under_test(core)
    real, virtual = installed_devices(core)
    assert found.real == tuple(real)
    assert found.wrapped == tuple(f"{name}:CPU" for name in virtual)
    assert found.every == found.real + found.wrapped


@pytest.mark.parametrize(
    ("selected", "real", "wrapped"),
    [
        (["TWOSTAGE"], ("TWOSTAGE",), ()),
        (["TWOSTAGE", "BATCH", "PROCESS"], ("TWOSTAGE",), ("BATCH:TWOSTAGE", "PROCESS:TWOSTAGE")),
        (["BATCH"], (), ("BATCH:CPU",)),
        (["CPU", "TWOSTAGE", "BATCH"], ("CPU", "TWOSTAGE"), ("BATCH:CPU", "BATCH:TWOSTAGE")),
        (["PROCESS:TWOSTAGE", "BATCH:PROCESS:CPU"], (), ("PROCESS:TWOSTAGE", "BATCH:PROCESS:CPU")),
        (["CPU", "", "CPU"], ("CPU",), ()),
    ],
)
def test_a_selection_names_exactly_the_devices(core, selected, real, wrapped):
    assert devices_under_test(core, selected) == DevicesUnderTest(real, wrapped)


def test_an_unknown_selected_device_is_an_error(core):
    with pytest.raises(ai.UnknownDeviceError, match="'NOPE'"):
        devices_under_test(core, ["CPU", "NOPE"])


def test_capabilities_come_from_the_device_level_property(core):
    assert capabilities(core, "CPU") == {"EXPORT_IMPORT"}
    assert exports(core, "CPU") and exports(core, "TWOSTAGE")
    assert core.get_property("BATCH", "OPTIMIZATION_CAPABILITIES") == ()
    assert not exports(core, "BATCH:CPU") and not exports(core, "PROCESS:CPU")
    with pytest.raises(ai.ExportError, match="'BATCH'"):
        core.compile_model(mlp_model(), "BATCH:CPU").export_model()
