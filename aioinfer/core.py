"""Core: finds devices, reads models and compiles them."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any, BinaryIO

import anyio.to_thread

from aioinfer.devices.batch.plugin import auto_batching
from aioinfer.errors import UnknownDeviceError
from aioinfer.frontend import ModelSource, read_ir_model
from aioinfer.model import Model
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.plugin.plugin import Plugin

PLUGIN_GROUP = "aioinfer.plugins"
"""Entry-point group under which a package registers a device (name = device name)."""

_BUILTIN_DEVICES: dict[str, str] = {
    "CPU": "aioinfer.devices.cpu:CPUPlugin",
    "BATCH": "aioinfer.devices.batch:BatchPlugin",
}


def _give_core(plugin: Plugin, core: Core) -> None:
    """Hand ``core`` to a plugin that compiles through other devices (``BATCH``): such a
    plugin has a ``set_core(core)`` method, as in the plugin API of the big runtimes."""
    set_core = getattr(plugin, "set_core", None)
    if callable(set_core):
        set_core(core)


def _load(target: str) -> Callable[[], Plugin]:
    module_name, _, attr = target.partition(":")
    module = __import__(module_name, fromlist=[attr])
    factory: Callable[[], Plugin] = getattr(module, attr)
    return factory


class Core:
    """The entry point: ``Core().compile_model("model.onnx", "CPU")``.

    Devices are the built-in ones plus every plugin registered under the entry-point
    group ``aioinfer.plugins``; each is loaded on first use.
    """

    def __init__(self) -> None:
        self._targets: dict[str, Callable[[], Any]] = {
            name: functools.partial(_load, target) for name, target in _BUILTIN_DEVICES.items()
        }
        for entry in entry_points(group=PLUGIN_GROUP):
            self._targets.setdefault(entry.name, entry.load)
        self._plugins: dict[str, Plugin] = {}
        self._lock = threading.Lock()

    # -- devices --------------------------------------------------------------------------

    @property
    def available_devices(self) -> list[str]:
        """Names of the devices this Core can compile for: the built-in ones first (``CPU``,
        then the virtual ``BATCH``), then the others by name."""
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

    def get_property(self, device: str, name: str) -> Any:
        """A device-level property, e.g. ``SUPPORTED_PROPERTIES`` or ``NUM_CORES``."""
        return self.get_plugin(device).get_property(name)

    # -- models ---------------------------------------------------------------------------

    def read_model(self, model: ModelSource) -> Model:
        """Read an ONNX model from a path, bytes, an ``onnx.ModelProto`` or an
        ``onnx_ir.Model``. External data next to a model file is found.

        Raises:
            ModelNotFoundError: the path does not exist.
            InvalidModelError: not an ONNX model, truncated, or an invalid graph.
        """
        return Model(read_ir_model(model))

    async def read_model_async(self, model: ModelSource) -> Model:
        """:meth:`read_model` on a worker thread, so a large file does not stall the loop."""
        return await anyio.to_thread.run_sync(self.read_model, model, abandon_on_cancel=True)

    def query_model(self, model: Model | ModelSource, device: str = "CPU") -> dict[str, str]:
        """Which nodes of ``model`` the device can run (node name -> device). A virtual
        device with a target (``"BATCH:ORT"``) answers for the nodes its target runs."""
        model = model if isinstance(model, Model) else self.read_model(model)
        name, _, target = device.partition(":")
        plugin = self.get_plugin(name)
        if target and "TARGET_DEVICE" in plugin.supported_properties:
            return {node: name for node in self.query_model(model, target)}
        return plugin.query_model(model)

    def compile_model(
        self,
        model: Model | ModelSource,
        device: str = "CPU",
        config: Mapping[str, Any] | None = None,
    ) -> CompiledModel:
        """Compile ``model`` for ``device``: transformation passes, lowering, weights.

        ``model`` may be a :class:`Model` or anything :meth:`read_model` takes. A virtual
        device names its target after a colon: ``"BATCH:CPU"`` batches on the CPU (the
        target goes to the virtual device as its ``TARGET_DEVICE`` property). With the
        ``THROUGHPUT`` hint, a device that supports ``ALLOW_AUTO_BATCHING`` gets a
        batchable, stateless model wrapped in ``BATCH`` (see docs/batching.md).

        Raises:
            UnknownDeviceError: no such device, or a target given to a device that takes
                none.
            UnknownPropertyError, InvalidPropertyValueError: a bad ``config``.
            UnsupportedOperatorError: an operator the device cannot run (named).
            NotBatchableError: ``BATCH`` was asked for a model it cannot batch.
            ModelReadError: ``model`` could not be read.
        """
        name, _, target = device.partition(":")
        plugin = self.get_plugin(name)
        model = model if isinstance(model, Model) else self.read_model(model)
        config = dict(config or {})
        if target:
            if "TARGET_DEVICE" not in plugin.supported_properties:
                raise UnknownDeviceError(
                    f"device {name!r} takes no target device, but {device!r} names one"
                )
            config["TARGET_DEVICE"] = target
        elif auto_batching(plugin, model, config):
            config["TARGET_DEVICE"] = name
            plugin = self.get_plugin("BATCH")
        return plugin.compile_model(model, config)

    def import_model(
        self,
        blob: bytes | bytearray | memoryview | BinaryIO,
        device: str = "CPU",
        config: Mapping[str, Any] | None = None,
    ) -> CompiledModel:
        """A compiled model from the blob of ``compiled.export_model()`` (bytes, or a
        binary stream to read it from), without running the passes again. ``config`` may
        change run-time properties (``PERFORMANCE_HINT``, ``NUM_STREAMS``, ...).

        Raises:
            UnknownDeviceError: no such device.
            InvalidBlobError: not a blob, or a truncated or corrupted one.
            BlobVersionError: written by another aioinfer or format version.
            BlobDeviceError: exported for another device.
            ImportModelError: the device does not import models.
        """
        data = blob.read() if hasattr(blob, "read") else blob
        return self.get_plugin(device).import_model(bytes(data), dict(config or {}))

    async def import_model_async(
        self,
        blob: bytes | bytearray | memoryview | BinaryIO,
        device: str = "CPU",
        config: Mapping[str, Any] | None = None,
    ) -> CompiledModel:
        """:meth:`import_model` on a worker thread; the event loop stays free."""
        return await anyio.to_thread.run_sync(
            functools.partial(self.import_model, blob, device, config), abandon_on_cancel=True
        )

    async def compile_model_async(
        self,
        model: Model | ModelSource,
        device: str = "CPU",
        config: Mapping[str, Any] | None = None,
    ) -> CompiledModel:
        """:meth:`compile_model` on a worker thread; the event loop stays free."""
        return await anyio.to_thread.run_sync(
            functools.partial(self.compile_model, model, device, config), abandon_on_cancel=True
        )
