"""CompiledModel: what all requests of one compiled model share."""

from __future__ import annotations

import itertools
import weakref
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

import onnx_ir as ir

from aioinfer.errors import ExportError, RequestClosedError
from aioinfer.model import HasPorts, Port
from aioinfer.plugin.async_request import AsyncInferRequest
from aioinfer.plugin.executors import Executor, LoopExecutor, ThreadExecutor
from aioinfer.properties import PROPERTIES, check_readable

if TYPE_CHECKING:
    from aioinfer.plugin.plugin import Plugin
    from aioinfer.plugin.sync_request import Inputs, SyncInferRequest
    from aioinfer.results import InferResults


class CompiledModel(HasPorts, ABC):
    """A model compiled for one device.

    Holds the transformed graph, the config it was compiled with, the port index, a
    request counter, and the executors shared by its requests: the *task executor*
    (compute, ``streams`` worker threads) and the *callback executor* (user callbacks).
    A device subclasses it, compiles in ``__init__`` and implements
    :meth:`create_sync_infer_request`.
    """

    def __init__(
        self,
        plugin: Plugin,
        graph: ir.Graph,
        inputs: Sequence[Port],
        outputs: Sequence[Port],
        config: Mapping[str, Any],
        streams: int = 1,
    ) -> None:
        self.plugin = plugin
        self.graph = graph
        self.config = dict(config)
        self.streams = streams
        self._inputs = list(inputs)
        self._outputs = list(outputs)
        self._request_ids = itertools.count()
        self._requests: weakref.WeakSet[AsyncInferRequest] = weakref.WeakSet()
        self._closed = False
        self._pool: list[AsyncInferRequest] = []
        """Idle requests of :meth:`infer`."""
        self.loop_executor: Executor = LoopExecutor()
        self.task_executor: Executor = ThreadExecutor(f"{plugin.device_name}-task", streams)
        self.callback_executor: Executor = ThreadExecutor(f"{plugin.device_name}-callback", 1)

    # -- requests -------------------------------------------------------------------------

    @abstractmethod
    def create_sync_infer_request(self) -> SyncInferRequest:
        """A new device request (the stages); wrapped by :meth:`create_infer_request`."""

    def pipeline(self, request: SyncInferRequest) -> list[tuple[Executor, Any]]:
        """The (executor, stage) pairs one inference runs through, in order.

        The default runs preprocessing on the loop, the compute on the task executor,
        and waiting and postprocessing on the loop. A device with more stages (upload,
        compute, download) returns more pairs, on several executors.
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

    async def infer(self, inputs: Inputs) -> InferResults:
        """Run one inference on a pooled infer request and return its results: for
        callers that do not keep requests of their own (a web handler). Concurrent calls
        run on separate requests; cancelling the awaiting task cancels the inference.
        Each call starts from a stateful model's initial state (state lives in the
        requests you keep).

        Raises:
            UnknownInputError, InputTypeError, InputShapeError, MissingInputError: bad
                input (nothing runs; an input left out is missing even if an earlier
                call gave it).
            InferenceError: a kernel failed (the message names the node).
            InferCancelledError: the compiled model was closed meanwhile.
            RequestClosedError: the compiled model is closed.
        """
        results, _ = await self.infer_timed(inputs)
        return results

    async def infer_timed(self, inputs: Inputs) -> tuple[InferResults, float]:
        """:meth:`infer`, and the seconds the inference waited in the device's queue
        before it computed (``queued_seconds``: the wait for a thread of the task
        executor, for the batch on BATCH, for a stream of the PROCESS worker).

        Raises:
            The errors of :meth:`infer`.
        """
        request = self._pool.pop() if self._pool else self.create_infer_request()
        try:
            request.reset_state()
            results = await request.infer(inputs)
            return results, request.queued_seconds
        finally:
            # The next caller must not run on this one's inputs (one it leaves out must
            # fail as on a new request), and the pool must not keep them alive.
            request.clear_inputs()
            if not self._closed:
                self._pool.append(request)

    async def close(self) -> None:
        """Close every request (cancelling what runs), then release the executors."""
        self._closed = True
        self._pool.clear()  # infer() now says that the model is closed, not a request
        for request in list(self._requests):
            await request.close()
        self.task_executor.close()
        self.callback_executor.close()

    async def __aenter__(self) -> CompiledModel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def batch_statistics(self) -> dict[int, int] | None:
        """How many batches ran so far by number of rows (``{rows: count}``), for a
        compiled model that batches concurrent inferences itself (BATCH); None for one
        that runs each inference as it comes."""
        return None

    def next_request_id(self) -> int:
        """A number for the next request (used in profiling names)."""
        return next(self._request_ids)

    # -- export ---------------------------------------------------------------------------

    def export_model(self, stream: BinaryIO | None = None) -> bytes:
        """The compiled model as a versioned, checksummed blob that
        ``Core.import_model(blob, device)`` turns back into an equivalent compiled model
        without running the passes again; also written to ``stream`` when one is given.

        Raises:
            ExportError: the device does not support export.
        """
        raise ExportError(f"device {self.plugin.device_name!r} does not export compiled models")

    # -- properties -----------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The compiled model's name (``NETWORK_NAME``)."""
        return self.graph.name or "model"

    def get_property(self, name: str) -> Any:
        """Read a property: the compile config or a read-only one.

        Raises:
            UnknownPropertyError: not supported here (the message lists what is).
        """
        name = str(getattr(name, "value", name))
        check_readable(name, self.supported_properties())
        if name in self.config and not PROPERTIES[name].is_auto(self.config[name]):
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
        return self.plugin.get_property(name)

    def __repr__(self) -> str:
        return f"<CompiledModel {self.name!r} on {self.plugin.device_name}>"
