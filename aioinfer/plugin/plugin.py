"""Plugin: a device as the Core sees it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from aioinfer.errors import ImportModelError, UnknownDeviceError
from aioinfer.properties import (
    DEVICE_NAME,
    NUM_CORES,
    SUPPORTED_PROPERTIES,
    Property,
    check_readable,
    declare,
    num_cores,
    parse_config,
    property_name,
)

if TYPE_CHECKING:
    from aioinfer.core import Core
    from aioinfer.model import Model
    from aioinfer.plugin.compiled_model import CompiledModel


class Plugin(ABC):
    """A device: compiles models for itself and answers questions about itself.

    A third-party device subclasses this and registers the class under the entry-point
    group ``aioinfer.plugins`` with the device name as the entry-point name.
    """

    device_name: str = ""
    properties: Mapping[str, Property] = MappingProxyType({})
    """The properties this device supports, by name (build it with
    :func:`aioinfer.properties.declare`): the shared declarations of
    :mod:`aioinfer.properties` it uses, and its own. ``compile_model`` accepts the
    configurable ones; ``get_property`` answers them all."""

    @property
    def supported_properties(self) -> tuple[str, ...]:
        """The names of :attr:`properties` (``SUPPORTED_PROPERTIES``)."""
        return tuple(self.properties)

    def parse_config(self, config: Mapping[str, Any] | None) -> dict[str, Any]:
        """``config`` checked against :attr:`properties`, with the defaults filled in.

        Raises:
            UnknownPropertyError, ReadOnlyPropertyError, InvalidPropertyValueError: see
                :func:`aioinfer.properties.parse_config`.
        """
        return parse_config(config, self.properties)

    @abstractmethod
    def compile_model(self, model: Model, config: Mapping[str, Any]) -> CompiledModel:
        """Transform, lower and allocate ``model`` for this device.

        Raises:
            UnknownPropertyError, InvalidPropertyValueError: a bad config.
            UnsupportedOperatorError: an operator the device cannot run.
            CompileError: any other reason the model cannot run here.
        """

    def import_model(self, blob: bytes, config: Mapping[str, Any] | None = None) -> CompiledModel:
        """A compiled model from a blob of ``CompiledModel.export_model``; ``config`` may
        change run-time properties.

        Raises:
            ImportModelError: the device cannot import models, or (subclasses) the blob is
                invalid, truncated or corrupted, of another version, or for another device.
        """
        raise ImportModelError(f"device {self.device_name!r} does not import compiled models")

    @abstractmethod
    def query_model(self, model: Model) -> dict[str, str]:
        """Map each node name this device can run to the device name."""

    def get_property(self, name: str) -> Any:
        """A device-level property (``SUPPORTED_PROPERTIES``, ``DEVICE_NAME``,
        ``FULL_DEVICE_NAME`` (here: the device name; a device overrides it), ``NUM_CORES``)."""
        device_level = ("SUPPORTED_PROPERTIES", "DEVICE_NAME", "FULL_DEVICE_NAME", "NUM_CORES")
        check_readable(name, [n for n in self.supported_properties if n in device_level])
        if name == "SUPPORTED_PROPERTIES":
            return self.supported_properties
        if name in ("DEVICE_NAME", "FULL_DEVICE_NAME"):
            return self.device_name
        return num_cores()


def _device_name(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("expected a device name such as 'CPU'")
    return value


TARGET_DEVICE = Property(
    "TARGET_DEVICE",
    "A virtual device: the device that runs its models ('BATCH:CPU' sets it).",
    default="CPU",
    parse=_device_name,
)


class VirtualPlugin(Plugin):
    """A device that runs models on another device, its target (``BATCH:CPU``,
    ``PROCESS:CPU``): the Core that loads it hands itself over (:meth:`set_core`), and
    the target devices are found there. It declares :data:`TARGET_DEVICE`."""

    properties = declare(TARGET_DEVICE, SUPPORTED_PROPERTIES, DEVICE_NAME, NUM_CORES)

    def split_config(self, config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Split a compile config: this device's own configurable properties, parsed
        with their defaults (``TARGET_DEVICE``, ...), and the rest, as given, for the
        target device (which checks them).

        Raises:
            InvalidPropertyValueError: a bad value of one of this device's properties.
        """
        own: dict[str, Any] = {}
        rest: dict[str, Any] = {}
        for raw_name, value in config.items():
            name = property_name(raw_name)
            declared = self.properties.get(name)
            (own if declared is not None and declared.configurable else rest)[name] = value
        return self.parse_config(own), rest

    def __init__(self) -> None:
        self._core: Core | None = None

    def set_core(self, core: Core) -> None:
        """Called by the Core that loads this plugin."""
        self._core = core

    @property
    def core(self) -> Core:
        """The Core this plugin finds and compiles its target devices with.

        Raises:
            UnknownDeviceError: no Core loaded this plugin (it was never given one).
        """
        if self._core is None:
            raise UnknownDeviceError(f"the {self.device_name} device works only through a Core")
        return self._core
