"""The BATCH virtual device: dynamic batching on top of another device.

``core.compile_model(model, "BATCH:CPU", {"MAX_BATCH_SIZE": 32, "BATCH_TIMEOUT_MS": 1})``
compiles ``model`` for the target device (``CPU``) and wraps it: concurrent inferences of
the wrapped model's requests are validated one by one, joined along the first (batch)
axis, run once on the target and split back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from aioinfer.devices.batch.batcher import Batcher, BatchItem
from aioinfer.devices.batch.request import AwaitExecutor, BatchInferRequest
from aioinfer.errors import NotBatchableError, RequestClosedError, UnknownDeviceError
from aioinfer.model import Model, Port
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.plugin.executors import Executor
from aioinfer.plugin.plugin import Plugin, VirtualPlugin
from aioinfer.properties import PROPERTIES, parse_config
from aioinfer.results import InferResults

if TYPE_CHECKING:
    from aioinfer.plugin.sync_request import Inputs, SyncInferRequest

BATCH_PROPERTIES = ("TARGET_DEVICE", "MAX_BATCH_SIZE", "BATCH_TIMEOUT_MS")
"""The properties the BATCH device itself reads; every other one goes to the target."""


def batch_problem(inputs: Sequence[Port], outputs: Sequence[Port]) -> str | None:
    """Why a model with these ports cannot be batched along its first axis (None: it can).

    Batchable means: every input and output is a tensor whose first dimension is one and
    the same symbolic dimension (``"batch"``), so rows can be joined and split back.
    """
    if not inputs:
        return "the model has no inputs"
    symbols: dict[str, str] = {}
    for kind, ports in (("input", inputs), ("output", outputs)):
        for port in ports:
            if port.kind != "tensor":
                return f"{kind} {port.name!r} is a {port.kind.replace('_', ' ')}, not a tensor"
            if not port.shape:
                rank = "unknown" if port.shape is None else "0"
                return f"{kind} {port.name!r} has rank {rank}; batching needs a first dimension"
            first = port.shape[0]
            if not isinstance(first, str):
                return (
                    f"{kind} {port.name!r} ({port}) has first dimension "
                    f"{'unknown' if first is None else first}, not a symbolic batch dimension"
                )
            symbols.setdefault(first, f"{kind} {port.name!r}")
    if len(symbols) > 1:
        which = ", ".join(f"{where}: {symbol!r}" for symbol, where in symbols.items())
        return f"the first dimensions are different symbols ({which}); batching needs one"
    return None


def auto_batching(plugin: Plugin, model: Model, config: Mapping[str, Any]) -> bool:
    """Whether the Core should batch ``model`` on the BATCH device although ``plugin``'s
    device was asked for: the config has the ``THROUGHPUT`` hint and does not set
    ``ALLOW_AUTO_BATCHING`` to NO, the device opts in (it supports
    ``ALLOW_AUTO_BATCHING``), the model keeps no state and is batchable."""
    if plugin.device_name == BatchPlugin.device_name:
        return False
    if "ALLOW_AUTO_BATCHING" not in plugin.supported_properties:
        return False
    names = {str(getattr(k, "value", k)): v for k, v in config.items()}
    try:
        hint = PROPERTIES["PERFORMANCE_HINT"].parse(names.get("PERFORMANCE_HINT", "LATENCY"))
        allowed = PROPERTIES["ALLOW_AUTO_BATCHING"].parse(names.get("ALLOW_AUTO_BATCHING", True))
    except ValueError:
        return False  # the device itself reports the bad value
    return (
        hint == "THROUGHPUT"
        and allowed
        and not names.get("STATEFUL")
        and batch_problem(model.inputs, model.outputs) is None
    )


class BatchPlugin(VirtualPlugin):
    """The ``"BATCH"`` device; ``"BATCH:CPU"`` names its target device.

    The Core hands it to itself (:meth:`set_core`), since it compiles through other
    devices.
    """

    device_name = "BATCH"
    handles_state = True  # it refuses STATEFUL: each request would keep its own state
    supported_properties = (*BATCH_PROPERTIES, "SUPPORTED_PROPERTIES", "DEVICE_NAME", "NUM_CORES")

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
        names = {str(getattr(k, "value", k)): v for k, v in config.items()}
        own = parse_config(
            {k: v for k, v in names.items() if k in BATCH_PROPERTIES}, BATCH_PROPERTIES
        )
        rest = {k: v for k, v in names.items() if k not in BATCH_PROPERTIES}
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
        if ":" in target_device:
            # A virtual target with a target of its own ("PROCESS:CPU"): the Core compiles
            # it, and never auto-batches a device that names a target.
            target = self.core.compile_model(model, target_device, rest)
        else:
            # Through the target's plugin, not the Core: the Core would batch it again.
            target = self.core.get_plugin(target_device).compile_model(model, rest)
        return BatchCompiledModel(self, target, own)

    def query_model(self, model: Model) -> dict[str, str]:
        """The nodes the default target device (``CPU``) runs, mapped to ``BATCH``."""
        return {name: self.device_name for name in self.core.query_model(model, "CPU")}


class BatchCompiledModel(CompiledModel):
    """A target device's compiled model whose concurrent inferences run in batches.

    Properties: ``MAX_BATCH_SIZE``, ``BATCH_TIMEOUT_MS``, ``TARGET_DEVICE`` are its own;
    every other one is the target's (``NUM_STREAMS``, ``PERFORMANCE_HINT``, and
    ``OPTIMAL_NUMBER_OF_INFER_REQUESTS``, the batches in flight that keep the target busy;
    to fill batches, keep up to ``MAX_BATCH_SIZE`` times that many requests in flight).
    ``DEVICE_NAME`` is ``"BATCH:<target>"``.
    """

    def __init__(self, plugin: BatchPlugin, target: CompiledModel, config: dict[str, Any]) -> None:
        super().__init__(
            plugin, target.graph, target.inputs, target.outputs, config, target.streams
        )
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
        return self.target.get_property(name)

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
