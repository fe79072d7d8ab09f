"""Which devices the conformance suite runs on, and what each of them can do.

Devices are those the Core finds through the ``aioinfer.plugins`` entry points. A
*virtual* device runs models on another device: its plugin declares ``TARGET_DEVICE``
(as :class:`aioinfer.plugin.VirtualPlugin` does), the Core names it with its target
(``"BATCH:CPU"``), and the suite runs it over real devices only. What a test may ask of
a device it learns from the device's properties, never from its name: whether compiled
models export is ``"EXPORT_IMPORT"`` in the device-level ``OPTIMIZATION_CAPABILITIES``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from aioinfer.core import Core
from aioinfer.errors import UnknownDeviceError
from aioinfer.plugin.plugin import Plugin

EXPORT_IMPORT = "EXPORT_IMPORT"


@dataclass(frozen=True)
class DevicesUnderTest:
    """The devices one run of the suite covers."""

    real: tuple[str, ...]
    """Devices that compute themselves (``CPU``, ``ORT``, a third-party device)."""
    wrapped: tuple[str, ...]
    """Virtual devices over a real one (``BATCH:CPU``, ``PROCESS:ORT``)."""

    @property
    def every(self) -> tuple[str, ...]:
        """The real devices, then the wrapped ones."""
        return self.real + self.wrapped


def is_virtual(plugin: Plugin) -> bool:
    """Whether ``plugin``'s device runs its models on another device: it declares
    ``TARGET_DEVICE``, which the Core sets from ``"NAME:TARGET"``."""
    return "TARGET_DEVICE" in plugin.properties


def capabilities(core: Core, device: str) -> frozenset[str]:
    """The device-level ``OPTIMIZATION_CAPABILITIES`` of ``device`` (of the outer device
    of ``"BATCH:CPU"``); none when the device does not declare the property."""
    if "OPTIMIZATION_CAPABILITIES" not in core.get_plugin(device).supported_properties:
        return frozenset()
    return frozenset(core.get_property(device, "OPTIMIZATION_CAPABILITIES"))


def exports(core: Core, device: str) -> bool:
    """Whether compiled models of ``device`` export and import (``EXPORT_IMPORT``)."""
    return EXPORT_IMPORT in capabilities(core, device)


def installed_devices(core: Core) -> tuple[list[str], list[str]]:
    """The real and the virtual devices whose plugins load here, in the order of
    ``core.available_devices`` (a plugin whose engine is not installed is left out)."""
    real: list[str] = []
    virtual: list[str] = []
    for name in core.available_devices:
        try:
            plugin = core.get_plugin(name)
        except Exception:  # an entry point whose package cannot load here: not installed
            continue
        (virtual if is_virtual(plugin) else real).append(name)
    return real, virtual


def devices_under_test(core: Core, selected: Iterable[str] = ()) -> DevicesUnderTest:
    """The devices a run covers.

    With nothing ``selected``: every installed device, each virtual one over the Core's
    default device (the first real one, ``CPU``): a worker process or a batcher over
    every engine would cost more than the rest of the suite. Else exactly the names
    selected: a real device (``"MYDEV"``), a virtual device with its target
    (``"BATCH:MYDEV"``), or a virtual device alone (``"BATCH"``), which runs over each
    real device selected, or over the default device when none is.

    Raises:
        UnknownDeviceError: a selected device is not installed, or its plugin does not
            load (the message says which and why).
    """
    names = [name for name in selected if name]
    real, virtual = installed_devices(core)
    default = real[:1]
    if not names:
        return DevicesUnderTest(tuple(real), tuple(f"{v}:{r}" for v in virtual for r in default))
    chosen_real: list[str] = []
    chosen_virtual: list[str] = []
    wrapped: list[str] = []
    for name in dict.fromkeys(names):
        outer, _, target = name.partition(":")
        try:
            plugin = core.get_plugin(outer)
        except UnknownDeviceError:
            raise
        except Exception as exc:
            raise UnknownDeviceError(
                f"device {outer!r} was selected, but its plugin does not load: {exc!r}"
            ) from exc
        if target:
            wrapped.append(name)
        elif is_virtual(plugin):
            chosen_virtual.append(name)
        else:
            chosen_real.append(name)
    targets = chosen_real or default
    wrapped += [f"{v}:{t}" for v in chosen_virtual for t in targets]
    return DevicesUnderTest(tuple(chosen_real), tuple(dict.fromkeys(wrapped)))
