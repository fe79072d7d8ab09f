"""The PROCESS virtual device: the model runs on its target device in a worker process.

``core.compile_model(model, "PROCESS:CPU")`` spawns a worker process, which compiles the
model on the target device (``CPU``) and runs its inferences; the application's
interpreter only validates inputs and moves arrays, so the compute never competes with
the event loop for the GIL. ``"BATCH:PROCESS:CPU"`` batches in the application and runs
the batches in the worker. A worker that dies or misses its heartbeat for
``WORKER_TIMEOUT_S`` is replaced (:mod:`aioinfer.devices.process.supervisor`).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import onnx_ir as ir

from aioinfer.devices.process.request import ProcessInferRequest
from aioinfer.devices.process.supervisor import WorkerSupervisor
from aioinfer.errors import InvalidPropertyValueError, UnknownDeviceError
from aioinfer.model import Model
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.plugin.executors import AwaitExecutor, Executor
from aioinfer.plugin.plugin import TARGET_DEVICE, VirtualPlugin
from aioinfer.properties import (
    DEVICE_NAME,
    NUM_CORES,
    OPTIMIZATION_CAPABILITIES,
    SUPPORTED_PROPERTIES,
    Property,
    check_readable,
    declare,
    positive_float,
    property_name,
)

if TYPE_CHECKING:
    from aioinfer.plugin.sync_request import SyncInferRequest

WORKER_TIMEOUT_S = Property(
    "WORKER_TIMEOUT_S",
    "PROCESS device: a worker that does not answer its heartbeat for this many "
    "seconds (stopped, deadlocked) is killed and replaced; its inferences fail with "
    "WorkerTimeoutError.",
    default=30.0,
    parse=positive_float,
)


class ProcessPlugin(VirtualPlugin):
    """The ``"PROCESS"`` device; ``"PROCESS:CPU"`` names its target device.

    The Core hands it to itself (:meth:`set_core`): the target device is looked up there.
    """

    device_name = "PROCESS"
    properties = declare(
        TARGET_DEVICE,
        WORKER_TIMEOUT_S,
        SUPPORTED_PROPERTIES,
        DEVICE_NAME,
        NUM_CORES,
        OPTIMIZATION_CAPABILITIES,  # none: its compiled models do not export
    )

    def compile_model(self, model: Model, config: Mapping[str, Any]) -> ProcessCompiledModel:
        """Start a worker process that compiles ``model`` on the target device.

        ``config`` holds ``TARGET_DEVICE`` and ``WORKER_TIMEOUT_S``; every other property
        goes to the target (and is checked against the target's properties here, before a
        process starts). Blocks until the worker has compiled (about a second and a half
        to start Python there).

        Raises:
            UnknownDeviceError: the target is unknown, virtual (``BATCH``, ``PROCESS``) or
                names a target of its own.
            UnknownPropertyError, InvalidPropertyValueError: a bad config value;
                ``STATEFUL`` given here rather than through the Core, which keeps the
                variables in the application (the worker stays stateless).
            CompileError, UnsupportedOperatorError: the compile failed in the worker (the
                worker's class and message), or the worker died while compiling.
        """
        own, rest = self.split_config(config)
        target = own["TARGET_DEVICE"]
        if ":" in target or target in (self.device_name, "BATCH"):
            raise UnknownDeviceError(
                f"the PROCESS device needs a plain target device such as 'CPU', got "
                f"{target!r} (to batch in the application, use 'BATCH:PROCESS:CPU')"
            )
        parsed = self.core.get_plugin(target).parse_config(rest)
        if parsed.get("STATEFUL"):
            raise InvalidPropertyValueError(
                f"invalid value {rest['STATEFUL']!r} for property 'STATEFUL': the PROCESS "
                "worker keeps no state per request; compile through Core.compile_model, "
                "which keeps the variables in the application"
            )
        payload = {
            "model": ir.serde.serialize_model(model.ir).SerializeToString(),
            "base_dir": _external_data_dir(model.ir.graph),
            "target": target,
            "config": rest,
        }
        supervisor = WorkerSupervisor(
            f"{self.device_name}:{target}", payload, own["WORKER_TIMEOUT_S"]
        )
        info = supervisor.start()
        return ProcessCompiledModel(self, supervisor, info, own)


def _external_data_dir(graph: ir.Graph) -> str:
    """The directory external weights are read from ('' when all are in memory)."""
    for value in graph.initializers.values():
        if isinstance(value.const_value, ir.ExternalTensor):
            return str(value.const_value.base_dir)
    return ""


class ProcessCompiledModel(CompiledModel):
    """A model compiled on a target device inside a worker process.

    It has the worker's ports and ``NUM_STREAMS`` (the worker computes that many
    inferences at once; more wait there for a stream). Properties: ``TARGET_DEVICE`` and
    ``WORKER_TIMEOUT_S`` are its own; every other one is the target's, read in the worker
    at compile time (``ACTIVATION_MEMORY_BYTES``, which changes as it runs, as of the
    last inference answered). ``DEVICE_NAME`` is ``"PROCESS:<target>"``.
    ``OPTIMAL_NUMBER_OF_INFER_REQUESTS`` is twice the streams: an inference that waits in
    the worker starts the moment a stream is free, without a round trip through the
    application's event loop.

    A worker that dies, or misses its heartbeat for ``WORKER_TIMEOUT_S`` seconds, is
    replaced by a new one (on a thread): see :attr:`worker_pid`, :attr:`worker_restarts`
    and :meth:`ready`.

    Attributes:
        supervisor: keeps the worker running (see
            :class:`aioinfer.devices.process.supervisor.WorkerSupervisor`).
    """

    def __init__(
        self,
        plugin: ProcessPlugin,
        supervisor: WorkerSupervisor,
        info: dict[str, Any],
        own: dict[str, Any],
    ) -> None:
        config = {**info["config"], **own}
        super().__init__(plugin, info["name"], info["inputs"], info["outputs"], config)
        self.streams = info["streams"]
        self.own_config = dict(own)
        """The PROCESS device's own properties (``TARGET_DEVICE``, ``WORKER_TIMEOUT_S``)."""
        self.supervisor = supervisor
        self.await_executor: Executor = AwaitExecutor()
        self._properties: dict[str, Any] = info["properties"]
        # A model that is dropped without close() still lets its worker go.
        self._finalizer = weakref.finalize(self, supervisor.abandon)

    @property
    def worker_pid(self) -> int | None:
        """The process id of the current worker, for diagnostics (None while a new worker
        starts). It changes when a worker is replaced."""
        return self.supervisor.pid

    @property
    def worker_restarts(self) -> int:
        """How many times a new worker replaced one that died or stopped answering."""
        return self.supervisor.restarts

    def ready(self) -> bool:
        """False while a new worker starts (after the last one died or hung), and once
        closed; inferences started meanwhile wait for the new worker."""
        return not self._closed and self.supervisor.ready()

    def create_sync_infer_request(self) -> ProcessInferRequest:
        """A request that makes a connection of its own to the worker at its first
        inference."""
        return ProcessInferRequest(self)

    def pipeline(self, request: SyncInferRequest) -> list[tuple[Executor, Any]]:
        """Everything on the event loop: validate, send, await the reply, publish. The
        loop watches the request's connection; no thread of the application waits."""
        assert isinstance(request, ProcessInferRequest)
        return [
            (self.loop_executor, request.infer_preprocess),
            (self.await_executor, request.start_async),
            (self.await_executor, request.wait_async),
            (self.loop_executor, request.infer_postprocess),
        ]

    def record_live_properties(self, values: Mapping[str, Any]) -> None:
        """Keep the values of the properties that change as the model runs (each
        inference's reply carries them)."""
        self._properties.update(values)

    def supported_properties(self) -> tuple[str, ...]:
        own = tuple(self.own_config)
        target = self._properties.get("SUPPORTED_PROPERTIES", ())
        return (*own, *(n for n in target if n not in own))

    def get_property(self, name: str) -> Any:
        """Read a property: ``TARGET_DEVICE``, ``WORKER_TIMEOUT_S``, ``DEVICE_NAME``
        (``"PROCESS:CPU"``), or the target's value. Never waits for the worker.

        Raises:
            UnknownPropertyError: not supported by the target either.
        """
        name = property_name(name)
        check_readable(name, self.supported_properties())
        if name in self.own_config:
            return self.own_config[name]
        if name == "SUPPORTED_PROPERTIES":
            return self.supported_properties()
        if name == "DEVICE_NAME":
            return f"{self.plugin.device_name}:{self._properties[name]}"
        if name == "OPTIMAL_NUMBER_OF_INFER_REQUESTS":
            return 2 * self.streams
        return self._properties[name]

    async def close(self) -> None:
        """Close this model's requests (cancelling what runs) while the worker is asked to
        exit (it is killed when it has not within 5 s); no new worker starts."""
        self.supervisor.close()
        async with anyio.create_task_group() as group:
            group.start_soon(anyio.to_thread.run_sync, self.supervisor.stop)
            await super().close()
        self._finalizer.detach()

    def __repr__(self) -> str:
        return f"<CompiledModel {self.name!r} on {self.get_property('DEVICE_NAME')}>"
