"""CompiledModel: what all requests of one compiled model share."""

from __future__ import annotations

import itertools
import weakref
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, TypeVar

from aioinfer.errors import ExportError, RequestClosedError
from aioinfer.model import HasPorts, Port
from aioinfer.plugin.async_request import AsyncInferRequest, RequestState
from aioinfer.plugin.blob import ExportedModel, dump
from aioinfer.plugin.executors import Executor, LoopExecutor, ThreadExecutor
from aioinfer.properties import check_readable, property_name

if TYPE_CHECKING:
    from aioinfer.model import Inputs
    from aioinfer.plugin.queue_engine import QueueEngine
    from aioinfer.plugin.sync_request import SyncInferRequest
    from aioinfer.properties import Property
    from aioinfer.results import InferResults

E = TypeVar("E", bound=Executor)


class CompilingPlugin(Protocol):
    """What a compiled model asks of the plugin that compiled it (a
    :class:`~aioinfer.plugin.plugin.Plugin`): its name and its properties. A device's
    compiled model names its own plugin class instead."""

    @property
    def device_name(self) -> str:
        """The device's name (``DEVICE_NAME``)."""

    @property
    def properties(self) -> Mapping[str, Property]:
        """The properties the device declares, by name."""

    @property
    def supported_properties(self) -> tuple[str, ...]:
        """The names of :attr:`properties`."""

    @property
    def optimization_capabilities(self) -> tuple[str, ...]:
        """The device-level ``OPTIMIZATION_CAPABILITIES``."""

    def get_property(self, name: str) -> Any:
        """A device-level property."""


class CompiledModel(HasPorts, ABC):
    """A model compiled for one device.

    Holds the name, the port index, the config it was compiled with, a request counter
    and the executors shared by its requests: the *loop executor* (stages inline on the
    event loop) and the *callback executor* (user callbacks, one thread started on first
    use). A device subclasses it, compiles in ``__init__``, creates the executors its
    pipeline needs (:meth:`add_executor`: a ``task_executor`` of ``streams`` threads for
    a device that computes on threads of its own; none for a device that awaits an engine
    or another process) and implements :meth:`create_sync_infer_request`.
    """

    streams: int = 1
    """How many inferences this model computes at once (``NUM_STREAMS``); a device that
    runs several sets it in its constructor."""
    task_executor: Executor
    """Where the default :meth:`pipeline` runs ``start_pipeline``: a device that keeps
    that pipeline creates it (``ThreadExecutor(name, streams)``, with :meth:`add_executor`)."""

    def __init__(
        self,
        plugin: CompilingPlugin,
        name: str,
        inputs: Sequence[Port],
        outputs: Sequence[Port],
        config: Mapping[str, Any],
    ) -> None:
        self.plugin = plugin
        self._name = name
        self.config = dict(config)
        self._inputs = list(inputs)
        self._outputs = list(outputs)
        self._request_ids = itertools.count()
        self._requests: weakref.WeakSet[AsyncInferRequest] = weakref.WeakSet()
        self._closed = False
        self._pool: list[AsyncInferRequest] = []
        """Idle requests of :meth:`infer`."""
        self._loaded_from_cache = False
        self._executors: list[Executor] = []
        """What :meth:`close` releases after the requests."""
        self.loop_executor: Executor = LoopExecutor()
        self.callback_executor: Executor = self.add_executor(
            ThreadExecutor(f"{plugin.device_name}-callback", 1)
        )

    def add_executor(self, executor: E) -> E:
        """Keep ``executor`` for this model's stages and return it; :meth:`close` releases
        it once every request is closed (no stage runs on it any more)."""
        self._executors.append(executor)
        return executor

    # -- requests -------------------------------------------------------------------------

    @abstractmethod
    def create_sync_infer_request(self) -> SyncInferRequest:
        """A new device request (the stages); wrapped by :meth:`create_infer_request`."""

    def pipeline(self, request: SyncInferRequest) -> list[tuple[Executor, Any]]:
        """The (executor, stage) pairs one inference runs through, in order.

        The default runs preprocessing on the loop, the compute on the task executor
        (which the device creates), and waiting and postprocessing on the loop. A device
        with more stages (upload, compute, download) returns more pairs, on several
        executors.
        """
        return [
            (self.loop_executor, request.infer_preprocess),
            (self.task_executor, request.start_pipeline),
            (self.loop_executor, request.wait_pipeline),
            (self.loop_executor, request.infer_postprocess),
        ]

    def create_infer_request(self) -> AsyncInferRequest:
        """A new infer request; each owns its tensors (and its variable state)."""
        if self._closed:
            raise RequestClosedError("this compiled model is closed")
        request = self.create_sync_infer_request()
        wrapper = AsyncInferRequest(request, self.pipeline(request), self.callback_executor)
        self._requests.add(wrapper)
        return wrapper

    def create_queue_engine(self, jobs: int) -> QueueEngine | None:
        """An engine of the device's own for an ``AsyncInferQueue`` of ``jobs`` requests
        (see :class:`aioinfer.plugin.queue_engine.QueueEngine`), or None: the queue then
        runs requests of :meth:`create_infer_request`."""
        return None

    async def infer(self, inputs: Inputs, *, share_inputs: bool = False) -> InferResults:
        """Run one inference on a pooled infer request and return its results: for
        callers that do not keep requests of their own (a web handler). Concurrent calls
        run on separate requests; cancelling the awaiting task cancels the inference.
        Each call starts from a stateful model's initial state (state lives in the
        requests you keep). The inputs are copied, unless ``share_inputs=True`` (for
        arrays nothing else modifies until this returns, such as freshly decoded ones).

        Raises:
            UnknownInputError, InputTypeError, InputShapeError, MissingInputError: bad
                input (nothing runs; an input left out is missing even if an earlier
                call gave it).
            InferenceError: a kernel failed (the message names the node).
            InferCancelledError: the compiled model was closed meanwhile.
            RequestClosedError: the compiled model is closed.
        """
        results, _ = await self.infer_timed(inputs, share_inputs=share_inputs)
        return results

    async def __call__(self, inputs: Inputs, **options: Any) -> InferResults:
        """``await compiled(inputs)``: the same as ``await compiled.infer(inputs)``
        (keyword options go to :meth:`infer` too)."""
        return await self.infer(inputs, **options)

    async def infer_timed(
        self, inputs: Inputs, *, share_inputs: bool = False
    ) -> tuple[InferResults, float]:
        """:meth:`infer`, and the seconds the inference waited in the device's queue
        before it computed (``queued_seconds``: the wait for a thread of the task
        executor, for the batch on BATCH, for a stream of the PROCESS worker).

        Raises:
            The errors of :meth:`infer`.
        """
        request = self._pool.pop() if self._pool else self.create_infer_request()
        try:
            request.reset_state()
            results = await request.infer(inputs, share_inputs=share_inputs)
            return results, request.queued_seconds
        finally:
            # The next caller must not run on this one's inputs (one it leaves out must
            # fail as on a new request), and the pool must not keep them alive.
            request.clear_inputs()
            if not self._closed:
                self._pool.append(request)

    def ready(self) -> bool:
        """Whether inferences can run now: False once closed, and while a device recovers
        (a PROCESS worker being replaced); a server reports it as the model's readiness."""
        return not self._closed

    def release_memory(self) -> None:
        """Free the memory kept for later inferences that no running inference uses: the
        idle requests pooled by :meth:`infer` are dropped, and every request not running
        an inference frees its buffers (a running one keeps its own). Every request stays
        usable; its next inference allocates again. Call it from the thread that runs the
        requests (the event loop)."""
        for request in list(self._requests):
            if request.state is not RequestState.BUSY:
                request.release_memory()
        self._pool.clear()

    def batch_statistics(self) -> dict[int, int] | None:
        """How many executions so far ran how many rows taken from concurrent inferences
        (``{rows: count}``); None for a device that runs each inference on its own (then
        a caller counts the inferences itself)."""
        return None

    def max_batch_size(self) -> int | None:
        """The most rows one execution takes from concurrent inferences (``MAX_BATCH_SIZE``
        of a batching device); None for a device that runs each inference on its own. To
        keep such a device busy, keep this many times ``streams`` inferences in flight."""
        return None

    async def close(self) -> None:
        """Close every request (cancelling what runs), then release the executors."""
        self._closed = True
        self._pool.clear()  # infer() now says that the model is closed, not a request
        for request in list(self._requests):
            await request.close()
        for executor in self._executors:
            executor.close()

    async def __aenter__(self) -> CompiledModel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def next_request_id(self) -> int:
        """A number for the next request (used in profiling names)."""
        return next(self._request_ids)

    # -- export ---------------------------------------------------------------------------

    def export_model(self, stream: BinaryIO | None = None) -> bytes:
        """The compiled model as a versioned, checksummed blob that
        ``Core.import_model(blob, device)`` turns back into an equivalent compiled model
        without running the passes again; also written to ``stream`` when one is given.

        The blob is the shared framing (:mod:`aioinfer.plugin.blob`: the device, the
        config, the source ports) around the device's :meth:`export_payload`.

        Raises:
            ExportError: the device does not support export.
        """
        inputs, outputs = self.source_ports()
        blob = dump(
            ExportedModel(
                device=self.plugin.device_name,
                config={k: v for k, v in self.config.items() if k != "CACHE_DIR"},
                inputs=inputs,
                outputs=outputs,
                payload=self.export_payload(),
            )
        )
        if stream is not None:
            stream.write(blob)
        return blob

    def export_payload(self) -> bytes:
        """A device that exports overrides this: the bytes its plugin's ``import_payload``
        rebuilds this compiled model from (the engine's own serialisation, the transformed
        graph, ...).

        Raises:
            ExportError: the device does not support export.
        """
        raise ExportError(f"device {self.plugin.device_name!r} does not export compiled models")

    def source_ports(self) -> tuple[list[Port], list[Port]]:
        """The ports of the model this was compiled from, which an export records and the
        model cache compares: this model's own, unless compiling took some of them as
        variable state."""
        return self.inputs, self.outputs

    def mark_loaded_from_cache(self) -> None:
        """Called by the Core when this compiled model came from its model cache
        (``LOADED_FROM_CACHE`` then reads True)."""
        self._loaded_from_cache = True

    # -- properties -----------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The compiled model's name (``NETWORK_NAME``)."""
        return self._name

    def get_property(self, name: str) -> Any:
        """Read a property: the compile config or a read-only one.

        Raises:
            UnknownPropertyError: not supported here (the message lists what is).
        """
        name = property_name(name)
        check_readable(name, self.supported_properties())
        declared = self.plugin.properties.get(name)
        if name in self.config and not (declared and declared.is_auto(self.config[name])):
            return self.config[name]
        return self.read_only_property(name)

    def supported_properties(self) -> tuple[str, ...]:
        """Names ``get_property`` answers."""
        return self.plugin.supported_properties

    def read_only_property(self, name: str) -> Any:
        """The value of a read-only property; devices extend this for their own."""
        if name == "NUM_STREAMS":
            return self.streams
        if name == "NETWORK_NAME":
            return self.name
        if name == "OPTIMAL_NUMBER_OF_INFER_REQUESTS":
            # THROUGHPUT: a second request per stream prepares while the first computes.
            throughput = self.config.get("PERFORMANCE_HINT") == "THROUGHPUT"
            return self.streams * 2 if throughput else self.streams
        if name == "SUPPORTED_PROPERTIES":
            return self.supported_properties()
        if name == "LOADED_FROM_CACHE":
            return self._loaded_from_cache
        return self.plugin.get_property(name)

    def __repr__(self) -> str:
        return f"<CompiledModel {self.name!r} on {self.plugin.device_name}>"
