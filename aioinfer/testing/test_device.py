"""The device as the Core sees it: found by its entry point under its own name, its
device-level properties readable, and every property a compiled model lists readable."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

import aioinfer as ai
from aioinfer.testing.devices import EXPORT_IMPORT, capabilities, is_virtual


def test_plugin_is_found_by_its_entry_point_under_its_name(every_device):
    name, _, target = every_device.partition(":")
    registered = {entry.name for entry in entry_points(group="aioinfer.plugins")}
    assert name in registered, f"no entry point in group aioinfer.plugins for {name}"
    core = ai.Core()
    plugin = core.get_plugin(every_device)
    assert plugin.device_name == name
    assert is_virtual(plugin) == bool(target)
    assert name in core.available_devices


def test_device_level_properties(every_device):
    core = ai.Core()
    plugin = core.get_plugin(every_device)
    supported = core.get_property(every_device, "SUPPORTED_PROPERTIES")
    assert tuple(supported) == tuple(plugin.properties)
    for key, declared in plugin.properties.items():
        assert declared.name == key and declared.doc, f"{every_device}: {key}'s declaration"
    assert core.get_property(every_device, "DEVICE_NAME") == plugin.device_name
    if "OPTIMIZATION_CAPABILITIES" in supported:
        found = core.get_property(every_device, "OPTIMIZATION_CAPABILITIES")
        assert isinstance(found, tuple) and all(isinstance(c, str) for c in found), found
        assert capabilities(core, every_device) == frozenset(found)
    if EXPORT_IMPORT in capabilities(core, every_device):
        assert "CACHE_DIR" in supported, "a device whose models export keeps them in CACHE_DIR"
    with pytest.raises(ai.UnknownPropertyError, match="'NO_SUCH_PROPERTY'"):
        core.get_property(every_device, "NO_SUCH_PROPERTY")


def test_compiled_model_answers_every_property_it_lists(every_accumulator):
    _, compiled = every_accumulator
    listed = compiled.get_property("SUPPORTED_PROPERTIES")
    assert "NETWORK_NAME" in listed and "OPTIMAL_NUMBER_OF_INFER_REQUESTS" in listed
    values = {name: compiled.get_property(name) for name in listed}
    assert values["NETWORK_NAME"] == "accumulator"
    assert values["OPTIMAL_NUMBER_OF_INFER_REQUESTS"] >= 1
