"""The AUTO device: the first device of a priority list that can run the model.

``core.compile_model(model)`` (or ``"AUTO"``, or ``"AUTO:ORT,CPU"`` with a list of its
own) tries each device of ``DEVICE_PRIORITIES`` in order: a device whose plugin does not
load (its engine package is not installed: the plugin's import fails, so nothing of the
engine is imported), whose ``query_model`` leaves nodes out, or whose compile fails (an
operator it lacks, a property it does not take) is passed over for the next. The
compiled model of the device chosen is wrapped, so that ``EXECUTION_DEVICES`` names it
and ``PASSED_OVER_DEVICES`` says why each device before it was passed over (also logged,
as a warning when a device that is available here was passed over); every other
property, every request and every inference is the chosen device's own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from aioinfer.devices.auto.properties import (
    DEVICE_PRIORITIES,
    EXECUTION_DEVICES,
    PASSED_OVER_DEVICES,
)
from aioinfer.errors import (
    AioinferError,
    CompileError,
    PropertyError,
    UnknownDeviceError,
    UnknownPropertyError,
    UnsupportedOperatorError,
)
from aioinfer.model import Model
from aioinfer.plugin.async_request import AsyncInferRequest
from aioinfer.plugin.blob import ExportedModel
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.plugin.plugin import PluginCore, VirtualPlugin
from aioinfer.properties import (
    ALLOW_AUTO_BATCHING,
    CACHE_DIR,
    DEVICE_NAME,
    LOADED_FROM_CACHE,
    NUM_CORES,
    OPTIMIZATION_CAPABILITIES,
    SUPPORTED_PROPERTIES,
    declare,
    parse_config,
    property_name,
)

if TYPE_CHECKING:
    from aioinfer.model import Port
    from aioinfer.plugin.executors import Executor
    from aioinfer.plugin.sync_request import Inputs, SyncInferRequest
    from aioinfer.results import InferResults

_logger = logging.getLogger(__name__)

_PASSED_OVER = (CompileError, PropertyError, UnknownDeviceError)
"""What a device's compile may raise that makes AUTO try the next device (a model that
cannot be read, or bad input, fails the same everywhere and is raised at once)."""

NODES_NAMED = 3
"""How many of the nodes a device cannot run the reason for passing it over names."""


def unsupported_nodes(nodes: Sequence[tuple[str, str]], total: int) -> str:
    """Why a device that leaves out the ``(name, operator)`` nodes of ``total`` is passed
    over: their count, their operators and the first :data:`NODES_NAMED` of them."""
    operators = sorted({op_type for _, op_type in nodes})
    named = ", ".join(repr(name) for name, _ in nodes[:NODES_NAMED])
    more = f" and {len(nodes) - NODES_NAMED} more" if len(nodes) > NODES_NAMED else ""
    return (
        f"cannot run {len(nodes)} of {total} nodes (operators {', '.join(operators)}): "
        f"{named}{more}"
    )


def unavailable_reason(core: PluginCore, device: str) -> str | None:
    """Why ``device`` cannot run models here (its plugin does not load, or says it cannot:
    the message names e.g. the engine package to install), or None when it can."""
    try:
        return core.get_plugin(device).unavailable_reason()
    except (ImportError, AioinferError) as exc:  # the plugin (or its engine) does not load
        return str(exc)


class AutoPlugin(VirtualPlugin):
    """The ``"AUTO"`` device: compiles on the first device of ``DEVICE_PRIORITIES`` that
    can run the model; the rest of the config goes to that device.

    It declares ``ALLOW_AUTO_BATCHING``: with the THROUGHPUT hint, the Core batches a
    batchable, stateless model on ``BATCH:AUTO`` (whatever device AUTO chooses), as it
    does on ``CPU``.
    """

    device_name = "AUTO"
    handles_state = True  # STATEFUL goes to the chosen device through the Core
    optimization_capabilities = ("EXPORT_IMPORT",)
    """A blob of AUTO holds the chosen device's blob (and imports on that device); the
    Core's model cache then keeps AUTO's choice too."""
    properties = declare(
        DEVICE_PRIORITIES,
        ALLOW_AUTO_BATCHING,
        EXECUTION_DEVICES,
        PASSED_OVER_DEVICES,
        CACHE_DIR,
        LOADED_FROM_CACHE,
        OPTIMIZATION_CAPABILITIES,
        SUPPORTED_PROPERTIES,
        DEVICE_NAME,
        NUM_CORES,
    )

    def parse_config(self, config: Mapping[str, Any] | None) -> dict[str, Any]:
        """AUTO's own properties parsed (with their defaults); any other name is kept as
        given for the chosen device, which checks its value.

        Raises:
            UnknownPropertyError: a name no device of the list declares.
            InvalidPropertyValueError: a bad ``DEVICE_PRIORITIES``.
        """
        own, rest = self._split(config or {})
        plugins = [
            self.core.get_plugin(device)
            for device in own["DEVICE_PRIORITIES"]
            if unavailable_reason(self.core, device) is None
        ]
        declared = {name: p for plugin in (self, *plugins) for name, p in plugin.properties.items()}
        unknown = sorted(set(rest) - set(declared))
        if unknown:
            configurable = sorted(name for name, p in declared.items() if p.configurable)
            raise UnknownPropertyError(
                f"unknown property {unknown[0]!r}: no device of AUTO's list "
                f"({', '.join(own['DEVICE_PRIORITIES'])}) declares it; supported: "
                f"{', '.join(configurable)}"
            )
        return {**own, **rest}

    def _split(self, config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """AUTO's own properties, parsed with their defaults, and the rest as given."""
        own: dict[str, Any] = {}
        rest: dict[str, Any] = {}
        for raw_name, value in config.items():
            name = property_name(raw_name)
            (own if name in self.properties else rest)[name] = value
        return parse_config(own, self.properties), rest

    def compile_model(self, model: Model, config: Mapping[str, Any]) -> AutoCompiledModel:
        """Compile ``model`` on the first device of ``DEVICE_PRIORITIES`` that can.

        Raises:
            UnknownPropertyError: a property no device of the list declares.
            The error of the first device that loaded but could not run the model (its
                class; UnknownDeviceError when none loads), its message listing why each
                device was passed over, when none can run the model.
        """
        parsed = self.parse_config(config)
        # CACHE_DIR is AUTO's own: the Core caches AUTO's blob, which holds the choice.
        own = {n: parsed[n] for n in ("DEVICE_PRIORITIES", "ALLOW_AUTO_BATCHING", "CACHE_DIR")}
        rest = {name: value for name, value in parsed.items() if name not in own}
        failures: list[tuple[str, AioinferError, str]] = []  # device, error, reason
        for device in own["DEVICE_PRIORITIES"]:
            failure = self._cannot_run(model, device)
            if failure is None:
                try:
                    target = self.core.compile_model(model, device, rest, auto_batching=False)
                except _PASSED_OVER as exc:
                    failure = (exc, f"compile failed: {type(exc).__name__}: {exc}")
                else:
                    passed_over = tuple((d, reason) for d, _, reason in failures)
                    _log_choice(model.name, device, failures)
                    return AutoCompiledModel(self, target, device, own, passed_over)
            failures.append((device, *failure))
        # The class of the first device that could load but not run the model: the
        # error a caller who named that device would have had.
        errors = [e for _, e, _ in failures if not isinstance(e, UnknownDeviceError)]
        first = errors[0] if errors else failures[0][1]
        raise type(first)(
            f"AUTO found no device for model {model.name!r}: "
            + "; ".join(f"{device}: {reason}" for device, _, reason in failures)
        ) from first

    def _cannot_run(self, model: Model, device: str) -> tuple[AioinferError, str] | None:
        """Why ``device`` cannot run ``model`` before compiling it (the error a compile
        would raise, and the reason given for passing it over), or None: it is not
        available here, or its ``query_model`` leaves nodes out.

        A model with local functions is left to the compile (a device that inlines
        functions runs nodes its query does not know)."""
        reason = unavailable_reason(self.core, device)
        if reason is not None:
            return UnknownDeviceError(reason), f"not available: {reason}"
        if model.ir.functions:
            return None
        supported = self.core.query_model(model, device)
        nodes = [
            (node.name or f"{node.op_type}_{index}", node.op_type)
            for index, node in enumerate(model.ir.graph)
        ]
        missing = [(name, op_type) for name, op_type in nodes if name not in supported]
        if not missing:
            return None
        operators = ", ".join(sorted({op_type for _, op_type in missing}))
        return UnsupportedOperatorError(f"no kernel for {operators}"), unsupported_nodes(
            missing, len(nodes)
        )

    def import_payload(self, exported: ExportedModel, config: dict[str, Any]) -> CompiledModel:
        """The chosen device's blob inside AUTO's, imported on that device (``config``'s
        names that are not AUTO's go to it).

        Raises:
            InvalidBlobError, BlobVersionError: the inner blob, as :func:`load` says.
        """
        own, rest = self._split(config)
        own.pop("CACHE_DIR", None)
        target = self.core.import_model(bytes(exported.payload), None, rest)  # on its device
        return AutoCompiledModel(self, target, str(target.get_property("DEVICE_NAME")), own, ())

    def query_model(self, model: Model, config: Mapping[str, Any] | None = None) -> dict[str, str]:
        """Each node any device of the list can run, mapped to the first such device."""
        own, _ = self._split(config or {})
        nodes: dict[str, str] = {}
        for device in own["DEVICE_PRIORITIES"]:
            if unavailable_reason(self.core, device) is None:
                for node, runs_on in self.core.query_model(model, device).items():
                    nodes.setdefault(node, runs_on)
        return nodes


def _log_choice(
    model: str, device: str, failures: Sequence[tuple[str, AioinferError, str]]
) -> None:
    """One record of AUTO's choice: a warning when a device available here was passed
    over (it could not run the model), else at INFO level."""
    passed = "".join(f"; passed over {d}: {reason}" for d, _, reason in failures)
    available_skipped = any(not isinstance(e, UnknownDeviceError) for _, e, _ in failures)
    level = logging.WARNING if available_skipped else logging.INFO
    _logger.log(level, "AUTO compiled model %r on %s%s", model, device, passed)


class AutoCompiledModel(CompiledModel):
    """The chosen device's compiled model, which does all the work; this adds
    ``DEVICE_PRIORITIES``, ``EXECUTION_DEVICES`` (the chosen device, as a tuple) and
    ``PASSED_OVER_DEVICES`` (why each device before it was not chosen) to its
    properties, and ``DEVICE_NAME`` reads ``"AUTO"``.

    Attributes:
        target: the chosen device's compiled model.
    """

    def __init__(
        self,
        plugin: AutoPlugin,
        target: CompiledModel,
        device: str,
        own: dict[str, Any],
        passed_over: tuple[tuple[str, str], ...],
    ) -> None:
        super().__init__(plugin, target.name, target.inputs, target.outputs, own)
        self.target = target
        self.streams = target.streams
        self.execution_device = device
        """The name of the device chosen (as in ``DEVICE_PRIORITIES``)."""
        self.passed_over = passed_over
        """``(device, reason)`` for each device tried before the chosen one."""

    # Requests and inferences are the chosen device's own: no stage is added.

    def create_sync_infer_request(self) -> SyncInferRequest:
        return self.target.create_sync_infer_request()

    def pipeline(self, request: SyncInferRequest) -> list[tuple[Executor, Any]]:
        return self.target.pipeline(request)

    def create_infer_request(self) -> AsyncInferRequest:
        """A new infer request of the chosen device."""
        return self.target.create_infer_request()

    async def infer_timed(
        self, inputs: Inputs, *, share_inputs: bool = False
    ) -> tuple[InferResults, float]:
        """The chosen device's :meth:`CompiledModel.infer_timed`."""
        return await self.target.infer_timed(inputs, share_inputs=share_inputs)

    def ready(self) -> bool:
        return self.target.ready()

    def release_memory(self) -> None:
        self.target.release_memory()

    def batch_statistics(self) -> dict[int, int] | None:
        return self.target.batch_statistics()

    def max_batch_size(self) -> int | None:
        return self.target.max_batch_size()

    async def close(self) -> None:
        """Close the chosen device's compiled model (and its requests)."""
        self._closed = True
        await self.target.close()
        for executor in self._executors:
            executor.close()

    def export_payload(self) -> bytes:
        """The chosen device's blob (AUTO's import imports it on that device).

        Raises:
            ExportError: the chosen device does not export.
        """
        return self.target.export_model()

    def source_ports(self) -> tuple[list[Port], list[Port]]:
        return self.target.source_ports()

    # -- properties -----------------------------------------------------------------------

    def supported_properties(self) -> tuple[str, ...]:
        own = tuple(self.plugin.supported_properties)
        return own + tuple(n for n in self.target.supported_properties() if n not in own)

    def get_property(self, name: str) -> Any:
        """``DEVICE_PRIORITIES``, ``EXECUTION_DEVICES``, ``PASSED_OVER_DEVICES``,
        ``DEVICE_NAME`` (``"AUTO"``) and ``SUPPORTED_PROPERTIES`` here; any other, the
        chosen device's.

        Raises:
            UnknownPropertyError: neither here nor on the chosen device.
        """
        name = property_name(name)
        if name in self.config:
            return self.config[name]
        if name == "EXECUTION_DEVICES":
            return (self.execution_device,)
        if name == "PASSED_OVER_DEVICES":
            return self.passed_over
        if name == "LOADED_FROM_CACHE":
            return self._loaded_from_cache
        if name == "OPTIMIZATION_CAPABILITIES":
            return self.plugin.optimization_capabilities
        if name == "SUPPORTED_PROPERTIES":
            return self.supported_properties()
        if name == "DEVICE_NAME":
            return self.plugin.device_name
        if name == "NUM_CORES":
            return self.plugin.get_property(name)
        return self.target.get_property(name)

    def __repr__(self) -> str:
        return f"<CompiledModel {self.name!r} on AUTO ({self.execution_device})>"
