"""The BATCH virtual device: dynamic batching on top of another device.

``core.compile_model(model, "BATCH:CPU", {"MAX_BATCH_SIZE": 32, "BATCH_TIMEOUT_MS": 1})``
compiles ``model`` for the target device (``CPU``) and wraps it: concurrent inferences of
the wrapped model's requests are validated one by one, joined along the first (batch)
axis, run once on the target and split back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

from aioinfer.devices.batch.batcher import Batcher, BatchItem
from aioinfer.devices.batch.properties import BATCH_TIMEOUT_MS, MAX_BATCH_SIZE
from aioinfer.devices.batch.request import BatchAsyncInferRequest, BatchInferRequest
from aioinfer.errors import NotBatchableError, RequestClosedError, UnknownDeviceError
from aioinfer.model import Model, batch_problem
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.plugin.executors import AwaitExecutor, Executor
from aioinfer.plugin.plugin import TARGET_DEVICE, VirtualPlugin
from aioinfer.properties import (
    DEVICE_NAME,
    NUM_CORES,
    OPTIMIZATION_CAPABILITIES,
    SUPPORTED_PROPERTIES,
    declare,
)
from aioinfer.results import InferResults

if TYPE_CHECKING:
    from aioinfer.plugin.sync_request import Inputs, SyncInferRequest

PREFERRED_BATCH_ROWS = 16
"""The rows per batch that ``OPTIMAL_NUMBER_OF_INFER_REQUESTS`` provides for (capped by
``MAX_BATCH_SIZE``): on the numpy CPU device, a row of a 4x1024 MLP in a batch of 16
costs about a third of a row alone, a row of the bundled tiny CNN about three quarters,
and both keep falling up to 32 rows; 16 keeps the requests in flight (and so each one's
wait) at half of what 32 would."""


class BatchPlugin(VirtualPlugin):
    """The ``"BATCH"`` device; ``"BATCH:CPU"`` names its target device.

    The Core hands it to itself (:meth:`set_core`), since it compiles through other
    devices.
    """

    device_name = "BATCH"
    handles_state = True  # it refuses STATEFUL: each request would keep its own state
    properties = declare(
        TARGET_DEVICE,
        MAX_BATCH_SIZE,
        BATCH_TIMEOUT_MS,
        SUPPORTED_PROPERTIES,
        DEVICE_NAME,
        NUM_CORES,
        OPTIMIZATION_CAPABILITIES,  # none: its compiled models do not export
    )

    def compile_model(self, model: Model, config: Mapping[str, Any]) -> BatchCompiledModel:
        """Compile ``model`` for the target device and wrap it for batching.

        ``config`` holds the BATCH properties (``TARGET_DEVICE``, ``MAX_BATCH_SIZE``,
        ``BATCH_TIMEOUT_MS``); every other property goes to the target device.

        Raises:
            NotBatchableError: an input or output has no shared symbolic first dimension,
                or ``STATEFUL`` asks for per-request state (the message names the port).
            UnknownDeviceError: the target is unknown, or is ``BATCH`` itself (a virtual
                target with a target of its own, ``"PROCESS:CPU"``, is accepted).
            UnknownPropertyError, InvalidPropertyValueError: a bad config value (checked by
                this device or by the target).
        """
        own, rest = self.split_config(config)
        target_device = own["TARGET_DEVICE"]
        if target_device.partition(":")[0] == self.device_name:
            raise UnknownDeviceError(
                "the BATCH device needs a plain target device such as 'CPU' or another "
                f"virtual device such as 'PROCESS:CPU', not itself; got {target_device!r}"
            )
        if rest.get("STATEFUL"):
            raise NotBatchableError(
                f"model {model.name!r}: the BATCH device cannot batch a stateful model "
                f"(STATEFUL={rest['STATEFUL']!r}): each request keeps its own state"
            )
        problem = batch_problem(model.inputs, model.outputs)
        if problem is not None:
            raise NotBatchableError(f"model {model.name!r} cannot be batched: {problem}")
        target = self.core.compile_model(model, target_device, rest, auto_batching=False)
        return BatchCompiledModel(self, target, own)


class BatchCompiledModel(CompiledModel):
    """A target device's compiled model whose concurrent inferences run in batches.

    Properties: ``MAX_BATCH_SIZE``, ``BATCH_TIMEOUT_MS``, ``TARGET_DEVICE`` are its own;
    every other one is the target's (``NUM_STREAMS``, ``PERFORMANCE_HINT``, and
    ``OPTIMAL_NUMBER_OF_INFER_REQUESTS``, the batches in flight that keep the target busy;
    to fill batches, keep up to ``MAX_BATCH_SIZE`` times that many requests in flight).
    ``DEVICE_NAME`` is ``"BATCH:<target>"``.
    """

    def __init__(self, plugin: BatchPlugin, target: CompiledModel, config: dict[str, Any]) -> None:
        super().__init__(plugin, target.name, target.inputs, target.outputs, config)
        self.streams = target.streams
        self.target = target
        """The compiled model that runs the batches."""
        self.batcher = Batcher(
            target, int(config["MAX_BATCH_SIZE"]), float(config["BATCH_TIMEOUT_MS"]) / 1000
        )
        self.await_executor: Executor = AwaitExecutor()
        self._validator = BatchInferRequest(self)
        """Checks the inputs of :meth:`infer_timed` (it never runs)."""
        self._direct: set[BatchItem] = set()
        """The items of :meth:`infer_timed` calls in progress."""

    def create_sync_infer_request(self) -> BatchInferRequest:
        return BatchInferRequest(self)

    def create_infer_request(self) -> BatchAsyncInferRequest:
        """A new infer request; until it is closed, the batcher counts it among those
        whose next inference may join a batch (a batch that holds all of them starts at
        once).

        Raises:
            RequestClosedError: the compiled model is closed.
        """
        if self._closed:
            raise RequestClosedError("this compiled model is closed")
        request = self.create_sync_infer_request()
        wrapper = BatchAsyncInferRequest(request, self.pipeline(request), self.callback_executor)
        self._requests.add(wrapper)
        self.batcher.add_member(wrapper)
        return wrapper

    def pipeline(self, request: SyncInferRequest) -> list[tuple[Executor, Any]]:
        """Validate on the loop, join the batch queue, await the batch, take the rows."""
        assert isinstance(request, BatchInferRequest)
        return [
            (self.loop_executor, request.infer_preprocess),
            (self.loop_executor, request.enqueue),
            (self.await_executor, request.wait_batch),
            (self.loop_executor, request.infer_postprocess),
        ]

    async def infer_timed(
        self, inputs: Inputs, *, share_inputs: bool = False
    ) -> tuple[InferResults, float]:
        """Run one inference in a batch, without an infer request of its own (the cheapest
        way in, and what :meth:`infer` runs); return its results and the seconds its rows
        waited for their batch.

        The inputs are checked on their own first; cancelling the awaiting task takes
        the rows out of the queue or out of their running batch, without touching the
        other inferences. The cheapest way into the batcher: no request, no stages.

        Raises:
            UnknownInputError, InputTypeError, InputShapeError, MissingInputError: bad
                input (nothing is queued).
            InferenceError: the target device failed on these inputs.
            InferCancelledError: the compiled model was closed meanwhile.
            RequestClosedError: the compiled model is closed.
        """
        if self._closed:
            raise RequestClosedError("this compiled model is closed")
        item = self.batcher.submit(self._validator.validated(inputs, share_inputs=share_inputs))
        self._direct.add(item)
        try:
            await item.done.wait()
        except anyio.get_cancelled_exc_class():
            self.batcher.withdraw(item)
            raise
        finally:
            self._direct.discard(item)
        if item.error is not None:
            raise item.error
        assert item.outputs is not None
        return InferResults(self.outputs, item.outputs), item.dispatched - item.enqueued

    def ready(self) -> bool:
        """Whether the target is ready, and this model not closed."""
        return not self._closed and self.target.ready()

    def batch_statistics(self) -> dict[int, int]:
        """How many batches ran so far, by number of rows (``{rows: count}``)."""
        return dict(self.batcher.statistics)

    def max_batch_size(self) -> int:
        """``MAX_BATCH_SIZE``: the most rows one batch takes from concurrent inferences."""
        return int(self.config["MAX_BATCH_SIZE"])

    def supported_properties(self) -> tuple[str, ...]:
        own = tuple(self.config)
        return own + tuple(n for n in self.target.supported_properties() if n not in own)

    def get_property(self, name: str) -> Any:
        name = str(getattr(name, "value", name))
        if name in self.config:
            return self.config[name]
        if name == "SUPPORTED_PROPERTIES":
            return self.supported_properties()
        if name == "DEVICE_NAME":
            return f"{self.plugin.device_name}:{self.target.get_property('DEVICE_NAME')}"
        if name == "OPTIMAL_NUMBER_OF_INFER_REQUESTS":
            return self.optimal_number_of_infer_requests()
        return self.target.get_property(name)

    def optimal_number_of_infer_requests(self) -> int:
        """The target's ``OPTIMAL_NUMBER_OF_INFER_REQUESTS`` (the batches in flight that
        keep it busy) times ``min(MAX_BATCH_SIZE, PREFERRED_BATCH_ROWS)``: enough
        single-row requests for each of those batches to hold several rows."""
        rows = min(self.max_batch_size(), PREFERRED_BATCH_ROWS)
        return self.batcher.depth * rows

    def release_memory(self) -> None:
        """Free this model's idle memory, then the target's (the batches in flight keep
        theirs)."""
        super().release_memory()
        self.target.release_memory()

    async def close(self) -> None:
        """Close this model's requests, then the target (and the batches it runs)."""
        for item in list(self._direct):
            self.batcher.cancel(item)
        await super().close()
        await self.target.close()

    def __repr__(self) -> str:
        return f"<CompiledModel {self.name!r} on BATCH:{self.target.plugin.device_name}>"
