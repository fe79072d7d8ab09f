"""Core: finds devices, reads models and compiles them."""

from __future__ import annotations

import contextvars
import functools
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import IO, Any, overload

import anyio.to_thread

from aioinfer.cache import compile_cached
from aioinfer.errors import UnknownDeviceError, UnknownPropertyError
from aioinfer.frontend import ModelSource, read_ir_model, read_stream
from aioinfer.model import Model, batch_problem
from aioinfer.plugin.blob import load as load_blob
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.plugin.plugin import Plugin, PluginCore
from aioinfer.plugin.stateful import compile_stateful
from aioinfer.properties import (
    ALLOW_AUTO_BATCHING,
    COMMON,
    PERFORMANCE_HINT,
    Property,
    parse_config,
    property_name,
)
from aioinfer.transforms.compile_rewrites import compile_rewrites

PLUGIN_GROUP = "aioinfer.plugins"
"""Entry-point group under which a package registers a device (name = device name)."""

_BUILTIN_DEVICES: dict[str, str] = {
    "CPU": "aioinfer.devices.cpu:CPUPlugin",
    "BATCH": "aioinfer.devices.batch:BatchPlugin",
    "AUTO": "aioinfer.devices.auto:AutoPlugin",
}

DEFAULT_DEVICE = "AUTO"
"""The device ``compile_model`` uses when none is named: the first device of AUTO's
priority list that is installed and can run the model (see docs/auto.md)."""

_TARGET_PROPERTIES = ("TARGET_DEVICE", "DEVICE_PRIORITIES")
"""The properties that take what follows the colon of a device string: the target of
``"BATCH:CPU"``, the list of ``"AUTO:ORT,CPU"``. A device declaring one is virtual."""


_REWRITTEN: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "aioinfer_model_rewritten", default=False
)
"""True within a compile whose model was rewritten (:func:`compile_rewrites`): a virtual
device compiling its target there gets the model as rewritten, and ``LOGITS`` was taken
from the config, so its compile must not choose again."""


def _give_core(plugin: Plugin, core: PluginCore) -> None:
    """Hand ``core`` to a plugin that compiles through other devices (``BATCH``): such a
    plugin has a ``set_core(core)`` method, as in the plugin API of the big runtimes."""
    set_core = getattr(plugin, "set_core", None)
    if callable(set_core):
        set_core(core)


Settings = Mapping[str, Any] | tuple[str, Any]
"""What :meth:`Core.set_property` takes: properties by name, or one ``(name, value)``."""


def _as_settings(properties: Settings) -> Mapping[str, Any]:
    """``properties`` as a mapping: one ``(name, value)`` pair becomes ``{name: value}``.

    Raises:
        TypeError: neither a mapping nor a pair.
    """
    if isinstance(properties, Mapping):
        return properties
    if isinstance(properties, tuple) and len(properties) == 2:
        name, value = properties
        return {property_name(name): value}
    raise TypeError(
        "set_property takes the properties as a mapping {name: value} or one (name, value) "
        f"pair, not {type(properties).__name__}"
    )


def _load(target: str) -> Callable[[], Plugin]:
    module_name, _, attr = target.partition(":")
    module = __import__(module_name, fromlist=[attr])
    factory: Callable[[], Plugin] = getattr(module, attr)
    return factory


@dataclass(frozen=True)
class DeviceVersion:
    """What :meth:`Core.get_versions` tells about one device."""

    build_number: str
    """The version of the package that provides the device (aioinfer's for ``CPU``,
    ``BATCH`` and ``PROCESS``): its ``__version__``, else the version of the installed
    distribution that registers the device, else ``"unknown"``."""
    description: str
    """The plugin class that implements the device, with its module."""


class Core:
    """The entry point: ``Core().compile_model("model.onnx", "CPU")``.

    Devices are the built-in ones plus every plugin registered under the entry-point
    group ``aioinfer.plugins``; each is loaded on first use.
    """

    def __init__(self) -> None:
        self._targets: dict[str, Callable[[], Any]] = {
            name: functools.partial(_load, target) for name, target in _BUILTIN_DEVICES.items()
        }
        self._distribution_versions: dict[str, str] = {}
        """Device name -> version of the installed package whose entry point declares it."""
        for entry in entry_points(group=PLUGIN_GROUP):
            self._targets.setdefault(entry.name, entry.load)
            if entry.dist is not None:
                self._distribution_versions.setdefault(entry.name, entry.dist.version)
        self._plugins: dict[str, Plugin] = {}
        self._lock = threading.Lock()
        self._settings: dict[str, dict[str, Any]] = {}
        """What :meth:`set_property` set: ``""`` (every device) or a device name -> values."""

    # -- devices --------------------------------------------------------------------------

    @property
    def available_devices(self) -> list[str]:
        """Names of the devices this Core can compile for: the built-in ones first (``CPU``,
        then the virtual ``BATCH`` and ``AUTO``), then the others by name."""
        others = sorted((set(self._targets) | set(self._plugins)) - set(_BUILTIN_DEVICES))
        return [*_BUILTIN_DEVICES, *others]

    def register_plugin(self, plugin: Plugin) -> None:
        """Make ``plugin`` available under its ``device_name`` (in-process registration)."""
        _give_core(plugin, self)
        with self._lock:
            self._plugins[plugin.device_name] = plugin

    def get_plugin(self, device: str) -> Plugin:
        """The plugin of ``device``, loading it on first use (``"BATCH:CPU"``: ``BATCH``).

        Raises:
            UnknownDeviceError: no such device (the message lists the available ones).
        """
        device = device.partition(":")[0]
        with self._lock:
            plugin = self._plugins.get(device)
            if plugin is not None:
                return plugin
            target = self._targets.get(device)
            if target is None:
                raise UnknownDeviceError(
                    f"unknown device {device!r}; available: {', '.join(self.available_devices)}"
                )
            loaded = target()
            plugin = loaded() if isinstance(loaded, type) else loaded
            _give_core(plugin, self)
            self._plugins[device] = plugin
            return plugin

    def get_available_devices(self) -> list[str]:
        """Names of the devices that can run models here, in the order of
        :attr:`available_devices`: each device whose plugin loads, leaving out the virtual
        devices (``BATCH``, ``PROCESS``, ``AUTO``: they run models on another device)."""
        devices = []
        for name in self.available_devices:
            try:
                plugin = self.get_plugin(name)
            except Exception:  # a plugin that cannot load here: the device is not available
                continue
            if not set(_TARGET_PROPERTIES) & set(plugin.supported_properties):
                devices.append(name)
        return devices

    def get_versions(self, device: str) -> dict[str, DeviceVersion]:
        """The version of each device ``device`` names (``"BATCH:CPU"``: ``BATCH`` and
        ``CPU``), by device name.

        Raises:
            UnknownDeviceError: no such device.
        """
        versions = {}
        for name in device.split(":"):
            plugin_class = type(self.get_plugin(name))
            package = sys.modules.get(plugin_class.__module__.partition(".")[0])
            declared = getattr(package, "__version__", None)
            versions[name] = DeviceVersion(
                build_number=declared
                if isinstance(declared, str)
                else self._distribution_versions.get(name, "unknown"),
                description=f"{plugin_class.__module__}.{plugin_class.__qualname__}",
            )
        return versions

    # -- properties -----------------------------------------------------------------------

    @overload
    def set_property(self, properties: Settings, /) -> None: ...

    @overload
    def set_property(self, device: str, properties: Settings, /) -> None: ...

    def set_property(self, device: str | Settings, properties: Settings | None = None, /) -> None:
        """Set properties that every later :meth:`compile_model` of this Core uses.

        ``core.set_property({"CACHE_DIR": path})`` sets them for every device (each device
        gets the names it supports, a virtual device also those of its target);
        ``core.set_property("CPU", {"PERFORMANCE_HINT": "THROUGHPUT"})`` for one device,
        over the former. One property may be given alone as a ``(name, value)`` pair, as
        OpenVINO's property helpers make them: ``core.set_property("CPU",
        ("NUM_STREAMS", 2))``. The config given to ``compile_model`` wins over both; the
        properties not named keep what was set before. :meth:`get_property` reads the
        values back. Models compiled before keep their config; ``import_model`` uses the
        blob's config and its own ``config`` argument only.

        Raises:
            UnknownDeviceError: no such device, or a device naming a target (``BATCH:CPU``).
            UnknownPropertyError: a name the device (any device, for the first form) does
                not support.
            ReadOnlyPropertyError: a read-only property.
            InvalidPropertyValueError: a value the property does not accept.
        """
        if isinstance(device, str):
            if properties is None:
                raise TypeError("set_property(device, properties) needs the properties")
            if ":" in device:
                raise UnknownDeviceError(
                    f"set_property takes a device name such as 'CPU', not {device!r}: set "
                    "the properties of each device named there"
                )
            key, given = device, _as_settings(properties)
            declared = self.get_plugin(device).properties
        else:
            if properties is not None:
                raise TypeError("set_property(properties) takes one mapping or (name, value)")
            key, given, declared = "", _as_settings(device), self._every_device_properties()
        names = {property_name(name) for name in given}
        parsed = parse_config(given, declared)
        with self._lock:
            self._settings[key] = {
                **self._settings.get(key, {}),
                **{name: parsed[name] for name in names},
            }

    @overload
    def get_property(self, name: str, /) -> Any: ...

    @overload
    def get_property(self, device: str, name: str, /) -> Any: ...

    def get_property(self, device: str, name: str | None = None, /) -> Any:
        """A property of ``device``, or with one argument a property set for every device.

        ``core.get_property("CPU", "FULL_DEVICE_NAME")`` reads a device-level property
        (``SUPPORTED_PROPERTIES``, ``DEVICE_NAME``, ``FULL_DEVICE_NAME``, ``NUM_CORES``) or
        the value a compile-time property (``PERFORMANCE_HINT``, ``CACHE_DIR``, ...) takes
        when ``compile_model`` is not given it (:meth:`set_property`, else its default).
        ``core.get_property("CACHE_DIR")`` reads what ``core.set_property({...})`` set for
        every device (else the default).

        Raises:
            UnknownDeviceError: no such device.
            UnknownPropertyError: the device (every device, with one argument) has no such
                property, or it is read per compiled model only (``NETWORK_NAME``, ...).
        """
        if name is None:
            name = property_name(device)
            every = self._every_device_properties()
            configurable = sorted(n for n, p in every.items() if p.configurable)
            if name not in configurable:
                raise UnknownPropertyError(
                    f"unknown property {name!r} for every device; supported: "
                    f"{', '.join(configurable)} (device properties: get_property(device, name))"
                )
            return self._settings.get("", {}).get(name, every[name].default)
        name = property_name(name)
        plugin = self.get_plugin(device)
        declared = plugin.properties.get(name)
        if declared is not None and declared.configurable:
            everywhere = self._settings.get("", {}).get(name, declared.default)
            return self._settings.get(device.partition(":")[0], {}).get(name, everywhere)
        return plugin.get_property(name)

    def _every_device_properties(self) -> dict[str, Property]:
        """The properties :meth:`set_property` takes for every device: the shared
        declarations, then those of each device that loads here (first one wins)."""
        declared = dict(COMMON)
        for name in self.available_devices:
            try:
                plugin = self.get_plugin(name)
            except Exception:  # a plugin that cannot load here declares nothing
                continue
            for prop in plugin.properties.values():
                declared.setdefault(prop.name, prop)
        return declared

    def _settings_for(
        self, device: str, config: Mapping[str, Any], seen: frozenset[str] = frozenset()
    ) -> dict[str, Any]:
        """The :meth:`set_property` values a compile on ``device`` uses: for each device
        it involves (``BATCH:CPU``: ``BATCH``, then ``CPU``; a virtual device named alone:
        its ``TARGET_DEVICE``), the values set for every device that it supports, then
        those set for it; ``TARGET_DEVICE`` only from the outermost device."""
        name, _, target = device.partition(":")
        declared = self.get_plugin(name).properties
        everywhere = self._settings.get("", {})
        settings = {key: value for key, value in everywhere.items() if key in declared}
        settings.update(self._settings.get(name, {}))
        if "TARGET_DEVICE" in declared:
            target = (
                target
                or config.get("TARGET_DEVICE")
                or settings.get("TARGET_DEVICE")
                or declared["TARGET_DEVICE"].default
            )
            if target.partition(":")[0] not in seen | {name}:  # else the device says no
                inner = self._settings_for(target, {}, seen | {name})
                inner.pop("TARGET_DEVICE", None)
                settings = {**inner, **settings}
        return settings

    # -- models ---------------------------------------------------------------------------

    def read_model(self, model: ModelSource) -> Model:
        """Read an ONNX model from a path, bytes, a binary file object (``open(path,
        "rb")``, ``io.BytesIO``), an ``onnx.ModelProto`` or an ``onnx_ir.Model``.
        External data next to a model file is found (also for an open file).

        A file object is read from its current position to its end; one that is seekable
        and has nothing left to read (just written to) is read from its start.

        Raises:
            ModelNotFoundError: the path does not exist.
            InvalidModelError: not an ONNX model, truncated, or an invalid graph.
            TypeError: not one of these (or a file object opened in text mode).
        """
        return Model(read_ir_model(model))

    async def read_model_async(self, model: ModelSource) -> Model:
        """:meth:`read_model` on a worker thread, so a large file does not stall the loop
        (a file object is read there too)."""
        return await anyio.to_thread.run_sync(self.read_model, model, abandon_on_cancel=True)

    def query_model(
        self,
        model: Model | ModelSource,
        device: str = DEFAULT_DEVICE,
        config: Mapping[str, Any] | None = None,
    ) -> dict[str, str]:
        """Which nodes of ``model`` the device can run (node name -> device); a virtual
        device answers for its target (``"BATCH:PROCESS:CPU"``: what the CPU runs).

        Raises:
            UnknownDeviceError: no such device, or a target given to a device that takes
                none.
        """
        model = model if isinstance(model, Model) else self.read_model(model)
        plugin, config = self._device_config(device, config)
        return plugin.query_model(model, config)

    def compile_model(
        self,
        model: Model | ModelSource,
        device: str = DEFAULT_DEVICE,
        config: Mapping[str, Any] | None = None,
        *,
        auto_batching: bool = True,
    ) -> CompiledModel:
        """Compile ``model`` for ``device``: transformation passes, lowering, weights.

        ``model`` may be a :class:`Model` or anything :meth:`read_model` takes. Without a
        device, ``"AUTO"`` chooses one: the first of its priority list (``ORT``,
        ``OPENVINO``, ``CPU``; ``DEVICE_PRIORITIES`` or ``"AUTO:ORT,CPU"`` changes it)
        that is installed and compiles the model; ``EXECUTION_DEVICES`` names it. A
        virtual device names its target after a colon: ``"BATCH:CPU"`` batches on the CPU
        (the target goes to the virtual device as its ``TARGET_DEVICE`` property). With the
        ``THROUGHPUT`` hint, a device that supports ``ALLOW_AUTO_BATCHING`` gets a
        batchable, stateless model wrapped in ``BATCH`` (see docs/batching.md), unless
        ``auto_batching`` is False (a virtual device compiles its target so).

        With ``CACHE_DIR``, on a device that declares it, the model is loaded from the
        model cache when it was compiled before with the same device, config and aioinfer
        version, else compiled and stored there (see :mod:`aioinfer.cache`).

        Before any device sees it, the model gets the rewrites every device shares
        (:mod:`aioinfer.transforms.compile_rewrites`: grouped-query attention without a
        repeated cache; with ``LOGITS`` ``"LAST"``, the default for a decoder that
        ``STATEFUL`` makes stateful, logits of the last position only, ``[batch, 1,
        vocab]``; ``"ALL"`` keeps every position).

        A device that does not handle ``STATEFUL`` itself (``Plugin.handles_state``
        False) gets its variables kept above it (see :mod:`aioinfer.plugin.stateful`):
        the device compiles the model with its state ports, through the model cache,
        and the variables are kept outside; such a stateful model does not export.

        Raises:
            UnknownDeviceError: no such device, or a target given to a device that takes
                none.
            UnknownPropertyError, InvalidPropertyValueError: a bad ``config``.
            UnsupportedOperatorError: an operator the device cannot run (named).
            NotBatchableError: ``BATCH`` was asked for a model it cannot batch.
            ModelReadError: ``model`` could not be read.
            InvalidModelError: ``LOGITS`` ``"LAST"`` for a model whose logits cannot be
                sliced (named).
        """
        model = model if isinstance(model, Model) else self.read_model(model)
        plugin, config = self._device_config(device, config)
        if _REWRITTEN.get():
            return self._compile(plugin, model, config, device, auto_batching)
        model, config = compile_rewrites(model, config)
        rewritten = _REWRITTEN.set(True)
        try:
            return self._compile(plugin, model, config, device, auto_batching)
        finally:
            _REWRITTEN.reset(rewritten)

    def _compile(
        self,
        plugin: Plugin,
        model: Model,
        config: dict[str, Any],
        device: str,
        auto_batching: bool,
    ) -> CompiledModel:
        """:meth:`compile_model` once the model is rewritten: automatic batching, the
        variables above a device that keeps none, the model cache."""
        if auto_batching and self._batches_automatically(plugin, model, config):
            if self._settings:  # the BATCH device's own settings apply too
                config = {**self._settings_for("BATCH", {"TARGET_DEVICE": device}), **config}
            config["TARGET_DEVICE"] = device
            plugin = self.get_plugin("BATCH")
        if not plugin.handles_state and "STATEFUL" in config:
            # The variables live above the device, which compiles (through the model
            # cache) the model with its state ports and never sees STATEFUL.
            return compile_stateful(plugin, model, config, compile_cached)
        return compile_cached(plugin, model, config)

    def _device_config(
        self, device: str, config: Mapping[str, Any] | None
    ) -> tuple[Plugin, dict[str, Any]]:
        """The plugin ``device`` names and the config it gets: ``config`` over this Core's
        settings, with the target of ``"BATCH:CPU"`` as ``TARGET_DEVICE`` (the list of
        ``"AUTO:ORT,CPU"`` as ``DEVICE_PRIORITIES``)."""
        name, _, target = device.partition(":")
        plugin = self.get_plugin(name)
        given = {property_name(key): value for key, value in (config or {}).items()}
        if self._settings:
            given = {**self._settings_for(device, given), **given}
        if target:
            key = next((k for k in _TARGET_PROPERTIES if k in plugin.properties), None)
            if key is None:
                raise UnknownDeviceError(
                    f"device {name!r} takes no target device, but {device!r} names one"
                )
            given[key] = target
        return plugin, given

    @staticmethod
    def _batches_automatically(plugin: Plugin, model: Model, config: Mapping[str, Any]) -> bool:
        """Whether to batch ``model`` on the BATCH device although ``plugin``'s device was
        asked for: the device opts in (it declares ``ALLOW_AUTO_BATCHING``), the config
        has the ``THROUGHPUT`` hint and does not set ``ALLOW_AUTO_BATCHING`` to NO, the
        model keeps no state and is batchable (:func:`aioinfer.model.batch_problem`)."""
        if ALLOW_AUTO_BATCHING.name not in plugin.properties:
            return False
        try:  # AUTO passes the hint on without declaring it
            hint = PERFORMANCE_HINT.parse(config.get(PERFORMANCE_HINT.name, "LATENCY"))
            allowed = ALLOW_AUTO_BATCHING.parse(
                config.get(ALLOW_AUTO_BATCHING.name, ALLOW_AUTO_BATCHING.default)
            )
        except ValueError:
            return False  # the device itself reports the bad value
        return (
            hint == "THROUGHPUT"
            and allowed
            and not config.get("STATEFUL")
            and batch_problem(model.inputs, model.outputs) is None
        )

    def import_model(
        self,
        blob: bytes | bytearray | memoryview | IO[bytes],
        device: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> CompiledModel:
        """A compiled model from the blob of ``compiled.export_model()`` (bytes, or a
        binary stream to read it from), without running the passes again, on ``device``
        (None: the device the blob names). ``config`` may change run-time properties
        (``PERFORMANCE_HINT``, ``NUM_STREAMS``, ...).

        A stream is read from its current position to its end, so a blob stored after
        other data is found; a seekable stream with nothing left to read is read from its
        start, so the stream ``export_model(stream)`` just wrote can be passed as it is.

        Raises:
            UnknownDeviceError: no such device.
            InvalidBlobError: not a blob, or a truncated or corrupted one.
            BlobVersionError: written by another aioinfer or format version.
            BlobDeviceError: exported for another device.
            ImportModelError: the device does not import models.
        """
        data = bytes(read_stream(blob, "import_model") if hasattr(blob, "read") else blob)
        if device is None:  # the blob names it: checked once, imported on that device
            exported = load_blob(data, None)
            return self.get_plugin(exported.device).import_exported(exported, config)
        return self.get_plugin(device).import_model(data, dict(config or {}))

    async def import_model_async(
        self,
        blob: bytes | bytearray | memoryview | IO[bytes],
        device: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> CompiledModel:
        """:meth:`import_model` on a worker thread (a stream is read there too); the event
        loop stays free."""
        return await anyio.to_thread.run_sync(
            functools.partial(self.import_model, blob, device, config), abandon_on_cancel=True
        )

    async def compile_model_async(
        self,
        model: Model | ModelSource,
        device: str = DEFAULT_DEVICE,
        config: Mapping[str, Any] | None = None,
    ) -> CompiledModel:
        """:meth:`compile_model` on a worker thread; the event loop stays free."""
        return await anyio.to_thread.run_sync(
            functools.partial(self.compile_model, model, device, config), abandon_on_cancel=True
        )


def compile_model(
    model: Model | ModelSource,
    device: str = DEFAULT_DEVICE,
    config: Mapping[str, Any] | None = None,
) -> CompiledModel:
    """``Core().compile_model(model, device, config)`` in one call, with a new Core.

    For scripts; an application that compiles several models keeps one :class:`Core`
    (its plugins and :meth:`Core.set_property` settings are shared), and compiles with
    :meth:`Core.compile_model_async` on an event loop.

    Raises:
        The errors of :meth:`Core.compile_model`.
    """
    return Core().compile_model(model, device, config)
