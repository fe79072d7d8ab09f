"""The model service: the served models behind one object that every transport calls.

A transport adapter (the REST app of ``serving/rest.py``; gRPC and a Ray Serve ingress
to come) decodes its wire format into an
:class:`~aioinfer.serving.messages.InferenceRequest`, calls the service, encodes the
answer, and maps the kind of each :class:`~aioinfer.errors.ServiceError` to its own
codes. It holds no policy: which model and version serve a request, admission (at most
``max_concurrency`` inferences in flight and ``max_queue`` waiting per model, none while
draining), sequences and their limits, the request size limit, the statistics and the
drain at shutdown are decided here, once for every transport.

An inference goes through the service in steps, so that a transport can refuse a request
before it reads the body (a full model parses no bodies)::

    call = service.start(name, version)      # NOT_FOUND; UNAVAILABLE: at capacity or
                                             # shutting down; else counted and in flight
    try:
        request = ...                        # the transport decodes the body
        response = await call.infer(request)
        ...                                  # the transport encodes the response
    except ServiceError as exc:
        call.fail(exc.kind, exc)
    else:
        call.succeed()
    finally:
        call.end()

:meth:`InferenceService.infer` does all of it for a caller that holds the arrays.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import anyio

import aioinfer
from aioinfer.core import Core
from aioinfer.errors import (
    AioinferError,
    DeviceUnavailableError,
    ErrorKind,
    InferCancelledError,
    InferenceError,
    InputError,
    RequestClosedError,
    ServiceError,
    ServingConfigError,
)
from aioinfer.serving.messages import (
    InferenceRequest,
    InferenceResponse,
    ModelMetadata,
    ServerMetadata,
    TensorMetadata,
)
from aioinfer.serving.metrics import ServerMetrics, failure_reason
from aioinfer.serving.models import DEFAULT_MAX_SEQUENCES, SequenceFlags, ServedModel
from aioinfer.serving.repository import ModelRepository

_logger = logging.getLogger(__name__)

EXTENSIONS = ("sequence",)
"""The protocol extensions the service implements on every transport."""

RUNTIME_ERROR_KINDS: tuple[tuple[type[AioinferError], ErrorKind], ...] = (
    (DeviceUnavailableError, ErrorKind.UNAVAILABLE),  # the device recovers: retryable
    (InputError, ErrorKind.INVALID_ARGUMENT),
    (InferenceError, ErrorKind.INVALID_ARGUMENT),  # a kernel failed on these inputs
    (RequestClosedError, ErrorKind.ABORTED),  # the model closed (shutdown)
    (InferCancelledError, ErrorKind.ABORTED),
)
"""The kind of each runtime error an inference may raise (the first class that matches);
any other one is INTERNAL."""


class InferenceService:
    """The served models of a repository, their policy and their statistics.

    Args:
        repository: the models to serve.
        core: the Core that compiles them (a new one by default).
        max_request_bytes: the largest request the transports accept (bytes; larger
            ones are refused with TOO_LARGE).
        drain_timeout: at shutdown, how long in-flight inferences may still finish
            (seconds) before the models are closed and what still runs is cancelled.
        max_sequences: open sequences per model, for models whose config sets none.

    Raises:
        ServingConfigError: ``max_sequences`` below 1.
    """

    def __init__(
        self,
        repository: ModelRepository,
        *,
        core: Core | None = None,
        max_request_bytes: int = 64 * 2**20,
        drain_timeout: float = 30.0,
        max_sequences: int = DEFAULT_MAX_SEQUENCES,
    ) -> None:
        self.repository = repository
        self.core = core or Core()
        self.max_request_bytes = max_request_bytes
        self.drain_timeout = drain_timeout
        if max_sequences < 1:
            raise ServingConfigError(f"max_sequences must be at least 1, got {max_sequences}")
        self.max_sequences = max_sequences
        self.models: dict[str, dict[str, ServedModel]] = {}
        """Model name -> version -> the served model (filled by :meth:`load`)."""
        self.metrics = ServerMetrics(self.served_models)
        """The statistics of every model version (Prometheus families at scrape time)."""
        self.closing = False
        """Set by :meth:`drain`: new inferences are refused and the service is not ready."""
        self._in_flight = 0
        self._drained: anyio.Event | None = None

    def served_models(self) -> Iterator[ServedModel]:
        """Every served model version."""
        for versions in self.models.values():
            yield from versions.values()

    # -- lifetime -------------------------------------------------------------------------

    async def load(self) -> None:
        """Compile every version of every model (off the event loop); once.

        Raises:
            AioinferError: a model cannot be read or compiled (the message names it).
        """
        for entry in self.repository.models.values():
            if entry.name in self.models:
                continue
            versions = {}
            for version, path in sorted(entry.versions.items(), key=lambda item: int(item[0])):
                try:
                    model = await self.core.read_model_async(str(path))
                    plan = entry.config.compile_plan(self.core, model)
                    compiled = await self.core.compile_model_async(model, plan.device, plan.config)
                except AioinferError as exc:
                    raise type(exc)(f"model {entry.name!r} version {version}: {exc}") from exc
                versions[version] = ServedModel(
                    entry.name, version, compiled, entry.config, self.max_sequences
                )
                _logger.info("%s", versions[version].describe(plan.decided))
            self.models[entry.name] = versions

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """Load the models and drop idle sequences meanwhile; at the end, refuse new
        inferences, let the in-flight ones finish (up to ``drain_timeout``), then close
        the models."""
        self.closing = False
        await self.load()
        async with anyio.create_task_group() as group:
            group.start_soon(self._drop_idle_sequences)
            try:
                yield
            finally:
                with anyio.CancelScope(shield=True):
                    await self.drain()
                    group.cancel_scope.cancel()
        with anyio.CancelScope(shield=True):
            for model in self.served_models():
                await model.close()
        self.models.clear()  # a later lifespan compiles them again

    async def drain(self) -> None:
        """Refuse new inferences and wait (up to ``drain_timeout``) for in-flight ones."""
        self.closing = True
        with anyio.move_on_after(self.drain_timeout):
            while self._in_flight:
                self._drained = self._drained or anyio.Event()
                await self._drained.wait()

    async def _drop_idle_sequences(self) -> None:
        while True:
            timeouts = [m.config.sequence_idle_timeout_s for m in self.served_models()]
            await anyio.sleep(max(0.01, min([*timeouts, 2.0]) / 4))
            for model in list(self.served_models()):
                await model.drop_idle_sequences()

    # -- models -----------------------------------------------------------------------------

    def find(self, name: str, version: str | None) -> ServedModel:
        """The served model ``name`` at ``version`` (None: the latest).

        Raises:
            ServiceError: NOT_FOUND, naming the unknown model or version.
        """
        versions = self.models.get(name)
        if versions is None:
            known = ", ".join(map(repr, sorted(self.models))) or "none"
            raise ServiceError(
                f"unknown model {name!r}; served models: {known}", ErrorKind.NOT_FOUND
            )
        if version is None:
            return versions[max(versions, key=int)]
        model = versions.get(version)
        if model is None:
            known = ", ".join(sorted(versions, key=int))
            raise ServiceError(
                f"model {name!r} has no version {version!r}; its versions: {known}",
                ErrorKind.NOT_FOUND,
            )
        return model

    def live(self) -> bool:
        """Whether the service runs (it answers, so it does)."""
        return True

    def ready(self) -> bool:
        """Whether the service takes inferences: its models are loaded and it is not
        draining."""
        return bool(self.models) and not self.closing

    def model_ready(self, model: ServedModel) -> bool:
        """Whether ``model`` takes inferences: the service is not draining and the model's
        device is ready (not while it recovers, e.g. a PROCESS worker being replaced)."""
        return not self.closing and model.ready()

    def server_metadata(self) -> ServerMetadata:
        """The server's name, version and the extensions the service implements."""
        return ServerMetadata("aioinfer", aioinfer.__version__, EXTENSIONS)

    def model_metadata(self, model: ServedModel) -> ModelMetadata:
        """``model``'s name, the versions served of it, its inputs and outputs."""
        return ModelMetadata(
            model.name,
            sorted(self.models[model.name], key=int),
            "onnx",
            [TensorMetadata.of(port) for port in model.inputs],
            [TensorMetadata.of(port) for port in model.outputs],
        )

    # -- inference ----------------------------------------------------------------------------

    def start(self, name: str, version: str | None) -> InferCall:
        """Begin an infer request to model ``name`` at ``version`` (None: the latest):
        count it and admit it, before its body is read (see :class:`InferCall`).

        Raises:
            ServiceError: NOT_FOUND, an unknown model or version; UNAVAILABLE (counted as
                failed), the service is draining or the model has neither a free slot
                nor room in its queue.
        """
        call = InferCall(self, self.find(name, version))
        try:
            if self.closing:
                raise ServiceError("the server is shutting down", ErrorKind.UNAVAILABLE)
            call.model.check_admission()
        except ServiceError as exc:
            call.fail(exc.kind)
            call.end()
            raise
        return call

    async def infer(
        self, name: str, version: str | None, request: InferenceRequest
    ) -> InferenceResponse:
        """Run ``request`` on model ``name`` at ``version`` (None: the latest), with its
        admission, sequence and statistics, as a transport would.

        Raises:
            ServiceError: the errors of :meth:`start` and :meth:`InferCall.infer`.
        """
        call = self.start(name, version)
        try:
            response = await call.infer(request)
        except ServiceError as exc:
            call.fail(exc.kind, exc)
            raise
        finally:
            call.end()
        call.succeed()
        return response


class InferCall:
    """One infer request to a model, from its arrival to its answer: counted in the
    model's statistics, and in flight (the drain waits for it) until :meth:`end`.

    :meth:`InferenceService.start` makes one once it admitted the request. A transport
    then calls :meth:`infer` once it has decoded the request, :meth:`succeed` once the
    answer is ready or :meth:`fail` with the kind of the error that stopped it, and
    :meth:`end` in any case.
    """

    __slots__ = ("_metrics", "_service", "model", "started", "waited")

    def __init__(self, service: InferenceService, model: ServedModel) -> None:
        self._service = service
        self.model = model
        """The model the request goes to."""
        self._metrics = metrics = service.metrics.of(model)
        metrics.requests += 1
        self.started = time.perf_counter()
        """When the request arrived (``time.perf_counter()``)."""
        self.waited = 0.0
        """Seconds the inference waited before it computed (known after :meth:`infer`)."""
        metrics.in_flight += 1
        service._in_flight += 1

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Run the inference: on a pooled request or in the model's batches, or on the
        request of the sequence that ``request.parameters`` names.

        Raises:
            ServiceError: INVALID_ARGUMENT for an output the model does not have, a bad
                sequence id, an inactive sequence, or inputs the model refuses (their
                names, types or shapes; a kernel that failed on them); UNAVAILABLE when
                the model's queue is full; RESOURCE_EXHAUSTED when a new sequence would
                pass ``max_sequences``, or the model's device failed to run it and
                recovers (a PROCESS worker that died or hung: retryable); ABORTED when
                the model was closed under the inference; INTERNAL for a fault of the
                server (logged).
        """
        model = self.model
        wanted = _wanted_outputs(model, request)
        sequence = SequenceFlags.from_parameters(request.parameters)
        try:
            results, self.waited = await model.infer(request.inputs, sequence)
        except ServiceError:
            raise
        except AioinferError as exc:
            raise ServiceError(str(exc), _kind_of(exc)) from exc
        except Exception as exc:
            _logger.exception("infer request to model %r version %s", model.name, model.version)
            raise ServiceError(
                f"internal server error: {type(exc).__name__}: {exc}", ErrorKind.INTERNAL
            ) from exc
        outputs = [(name, results[name], binary) for name, binary in wanted]
        return InferenceResponse(model.name, model.version, request.id, outputs, self.waited)

    def succeed(self) -> None:
        """Count the request as answered: its latency (from arrival until now) and the
        time its inference waited."""
        metrics = self._metrics
        metrics.latency.observe(time.perf_counter() - self.started)
        metrics.queue_time.observe(self.waited)

    def fail(self, kind: ErrorKind, error: BaseException | None = None) -> None:
        """Count the request as failed, for the reason that ``kind`` stands for; with the
        ``error`` that stopped it, a device that recovers (UNAVAILABLE caused by a
        :class:`~aioinfer.errors.DeviceUnavailableError`) counts as ``unavailable``, not
        ``busy``."""
        self._metrics.fail(failure_reason(kind, error))

    def end(self) -> None:
        """The request is no longer in flight (the drain may end)."""
        self._metrics.in_flight -= 1
        service = self._service
        service._in_flight -= 1
        if service._in_flight == 0 and service._drained is not None:
            service._drained.set()
            service._drained = None


def _wanted_outputs(model: ServedModel, request: InferenceRequest) -> list[tuple[str, bool]]:
    """(name, binary) of each output ``request`` asks for, every output when it names
    none."""
    names = model.output_names
    if request.outputs is None:
        return [(name, request.binary_output) for name in names]
    for output in request.outputs:
        if output.name not in names:
            known = ", ".join(map(repr, names))
            raise ServiceError(
                f"the model has no output named {output.name!r}; its outputs are {known}",
                ErrorKind.INVALID_ARGUMENT,
            )
    return [(output.name, output.binary) for output in request.outputs]


def _kind_of(error: AioinferError) -> ErrorKind:
    for error_class, kind in RUNTIME_ERROR_KINDS:
        if isinstance(error, error_class):
            return kind
    return ErrorKind.INTERNAL


ModelServer = InferenceService
"""The service's first name, from when it was the REST app's state (``app.state.server``
of :func:`~aioinfer.serving.create_app`)."""
