"""Plugin: a device as the Core sees it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aioinfer.errors import ImportModelError, UnknownDeviceError
from aioinfer.properties import check_readable, num_cores

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
    supported_properties: tuple[str, ...] = ()
    """Names (declared in :mod:`aioinfer.properties`) that ``compile_model`` accepts or
    that ``get_property`` answers."""
    handles_state: bool = False
    """Whether ``compile_model`` takes ``STATEFUL`` itself: the device keeps variables in
    its own requests (or refuses them with an error of its own). When False, the Core
    keeps the variables above the device (:mod:`aioinfer.plugin.stateful`): the device
    compiles the model with its state inputs and outputs and never sees ``STATEFUL``."""

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


class VirtualPlugin(Plugin):
    """A device that runs models on another device, its target (``BATCH:CPU``,
    ``PROCESS:CPU``): the Core that loads it hands itself over (:meth:`set_core`), and
    the target devices are found there."""

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
