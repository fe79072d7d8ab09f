"""Plugin: a device as the Core sees it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from aioinfer.errors import ImportModelError, InvalidBlobError, PropertyError, UnknownDeviceError
from aioinfer.plugin.blob import ExportedModel, load
from aioinfer.properties import (
    DEVICE_NAME,
    NUM_CORES,
    SUPPORTED_PROPERTIES,
    Property,
    check_mutable,
    check_readable,
    declare,
    num_cores,
    parse_config,
    property_name,
)

if TYPE_CHECKING:
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

    optimization_capabilities: tuple[str, ...] = ()
    """The device-level ``OPTIMIZATION_CAPABILITIES`` (declare the property to answer
    it): ``"EXPORT_IMPORT"`` when its compiled models export and import."""

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
        change the run-time (``mutable``) properties. The framing is checked here, the
        payload by :meth:`import_payload`.

        Raises:
            ImportModelError: the device does not import models.
            InvalidBlobError, BlobVersionError, BlobDeviceError: see
                :func:`aioinfer.plugin.blob.load`, and :meth:`import_exported`.
            InvalidPropertyValueError: a property fixed by the compile (``STATEFUL``), or
                a bad value.
            UnknownPropertyError: a name the device does not support.
        """
        given = dict(config or {})
        self._check_imports()
        check_mutable(given, self.properties, "when importing")
        self.parse_config(given)  # the caller's mistakes first, before the blob's
        return self.import_exported(load(blob, self.device_name), given)

    def import_exported(
        self, exported: ExportedModel, config: Mapping[str, Any] | None = None
    ) -> CompiledModel:
        """A compiled model from a checked blob (:func:`aioinfer.plugin.blob.load`): the
        blob's config, validated like a compile config, with the names ``config`` gives
        overriding it, goes to :meth:`import_payload`. The Core's model cache imports
        through here.

        Raises:
            ImportModelError: the device does not import models.
            InvalidBlobError: the blob's config is not one this device accepts, or (from
                :meth:`import_payload`) its payload is bad.
            InvalidPropertyValueError: ``config`` sets a property fixed by the compile.
        """
        self._check_imports()
        check_mutable(config or {}, self.properties, "when importing")
        try:
            stored = self.parse_config(exported.config)
        except PropertyError as exc:
            raise InvalidBlobError(f"the blob's config is not valid: {exc}") from None
        given = self.parse_config(config)
        names = {property_name(name) for name in config or {}}
        return self.import_payload(exported, {**stored, **{n: given[n] for n in names}})

    def import_payload(self, exported: ExportedModel, config: dict[str, Any]) -> CompiledModel:
        """A device that imports models overrides this: build the compiled model from
        ``exported.payload`` (what its ``export_payload`` wrote), its source ports
        ``exported.inputs``/``outputs`` and ``config`` (parsed, final), without compiling
        again.

        Raises:
            InvalidBlobError: a payload that does not parse or does not fit the header.
        """
        raise self._no_import()

    def _check_imports(self) -> None:
        if type(self).import_payload is Plugin.import_payload:
            raise self._no_import()

    def _no_import(self) -> ImportModelError:
        return ImportModelError(f"device {self.device_name!r} does not import compiled models")

    def unavailable_reason(self) -> str | None:
        """Why this device cannot run models here although its plugin loads (an engine
        package that is imported on first use is missing), or None. ``AUTO`` passes over
        such a device and ``aioinfer info`` shows the reason."""
        return None

    @abstractmethod
    def query_model(self, model: Model, config: Mapping[str, Any] | None = None) -> dict[str, str]:
        """Map each node name this device can run to the device name; ``config`` is a
        compile config (a virtual device finds its ``TARGET_DEVICE`` there)."""

    def get_property(self, name: str) -> Any:
        """A device-level property (``SUPPORTED_PROPERTIES``, ``DEVICE_NAME``,
        ``FULL_DEVICE_NAME`` (here: the device name; a device overrides it), ``NUM_CORES``,
        ``OPTIMIZATION_CAPABILITIES``)."""
        device_level = (
            "SUPPORTED_PROPERTIES",
            "DEVICE_NAME",
            "FULL_DEVICE_NAME",
            "NUM_CORES",
            "OPTIMIZATION_CAPABILITIES",
        )
        check_readable(name, [n for n in self.supported_properties if n in device_level])
        if name == "SUPPORTED_PROPERTIES":
            return self.supported_properties
        if name == "OPTIMIZATION_CAPABILITIES":
            return self.optimization_capabilities
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


class PluginCore(Protocol):
    """What a plugin that runs models on other devices needs of the Core that loads it
    (``aioinfer.Core`` is one): the other devices' plugins, and compiling, importing and
    querying on them. The plugin API names this rather than the Core, which sits above it.
    """

    def get_plugin(self, device: str) -> Plugin:
        """The plugin of ``device`` (``"BATCH:CPU"``: ``BATCH``), loaded on first use.

        Raises:
            UnknownDeviceError: no such device.
        """
        ...

    def compile_model(
        self,
        model: Model,
        device: str,
        config: Mapping[str, Any] | None = None,
        *,
        auto_batching: bool = True,
    ) -> CompiledModel:
        """``model`` compiled on ``device`` as ``Core.compile_model`` does it (the model
        cache, variables kept above a device that does not keep them); a virtual device
        passes ``auto_batching=False`` for its target.

        Raises:
            UnknownDeviceError, UnsupportedOperatorError, CompileError: as
                ``Core.compile_model`` raises them (and its config errors).
        """
        ...

    def import_model(
        self, blob: bytes, device: str | None = None, config: Mapping[str, Any] | None = None
    ) -> CompiledModel:
        """A compiled model from ``blob`` on ``device`` (None: the one the blob names).

        Raises:
            InvalidBlobError, BlobVersionError, BlobDeviceError, ImportModelError: as
                ``Core.import_model`` raises them.
        """
        ...

    def query_model(
        self, model: Model, device: str, config: Mapping[str, Any] | None = None
    ) -> dict[str, str]:
        """The nodes of ``model`` that ``device`` runs (node name -> device name)."""
        ...


class VirtualPlugin(Plugin):
    """A device that runs models on another device, its target (``BATCH:CPU``,
    ``PROCESS:CPU``): the Core that loads it hands itself over (:meth:`set_core`, as a
    :class:`PluginCore`), and the target devices are found there. It declares
    :data:`TARGET_DEVICE`."""

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
        self._core: PluginCore | None = None

    def set_core(self, core: PluginCore) -> None:
        """Called by the Core that loads this plugin."""
        self._core = core

    def query_model(self, model: Model, config: Mapping[str, Any] | None = None) -> dict[str, str]:
        """The nodes the target device runs (``TARGET_DEVICE`` of ``config``, else its
        default), mapped to this device.

        Raises:
            UnknownDeviceError: the target is unknown, or this device itself.
        """
        own, _ = self.split_config(config or {})
        target = own["TARGET_DEVICE"]
        if target.partition(":")[0] == self.device_name:
            raise UnknownDeviceError(
                f"the {self.device_name} device cannot target itself; got {target!r}"
            )
        return {name: self.device_name for name in self.core.query_model(model, target)}

    @property
    def core(self) -> PluginCore:
        """The Core this plugin finds and compiles its target devices with.

        Raises:
            UnknownDeviceError: no Core loaded this plugin (it was never given one).
        """
        if self._core is None:
            raise UnknownDeviceError(f"the {self.device_name} device works only through a Core")
        return self._core
