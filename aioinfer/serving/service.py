"""The model service: the served models behind one object that every transport calls.

A transport adapter (the REST app of :mod:`aioinfer.serving.rest`, the gRPC server of
:mod:`aioinfer.serving.grpc`, Ray Serve's ingress and replicas of :mod:`aioinfer.ray`)
decodes its wire format into an :class:`~aioinfer.serving.messages.InferenceRequest`,
calls the service, encodes the answer, and maps the kind of each
:class:`~aioinfer.errors.ServiceError` to its own codes. It holds no policy: which model
and version serve a request, admission (at most ``max_concurrency`` inferences in flight
and ``max_queue`` waiting per model, none while draining), sequences and their limits,
the request size limit, the statistics and the drain at shutdown are decided here, once
for every transport.

Every request goes through one context, :meth:`InferenceService.call`, which admits it
before the transport reads the body (a full model parses no bodies) and counts its
outcome however the block ends::

    async with service.call(name, version) as call:  # NOT_FOUND; UNAVAILABLE: at
        request = ...                                 # capacity or shutting down
        response = await call.infer(request)          # the transport decodes the body,
        ...                                           # and encodes the response

:meth:`InferenceService.infer` does all of it for a caller that holds the arrays.

Triton's extensions are methods too, so that every transport answers them alike:
:meth:`~InferenceService.statistics`, :meth:`~InferenceService.model_config`,
:meth:`~InferenceService.repository_index`, :meth:`~InferenceService.load_model` and
:meth:`~InferenceService.unload_model` (under the model control mode), and the
shared-memory registry (``register_system_shared_memory`` and the others). A transport
decodes an input or output that names a shared-memory region into a
:class:`~aioinfer.serving.messages.SharedInput` or a ``RequestedOutput`` with its
``shared_memory``; :meth:`InferCall.infer` reads and writes the regions.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import numpy as np

import aioinfer
from aioinfer.core import Core
from aioinfer.devices.auto.plugin import unavailable_reason
from aioinfer.errors import (
    AioinferError,
    ErrorKind,
    ModelControlError,
    ModelMemoryError,
    ServiceError,
    ServingConfigError,
    SharedMemoryError,
)
from aioinfer.offline import is_blob_file, load_model_file
from aioinfer.serving.control import ModelControlMode, startup_models
from aioinfer.serving.decoder_folder import served_decoder
from aioinfer.serving.generation import (
    GeneratedToken,
    GenerateRequest,
    ModelGeneration,
    generate_tokens,
)
from aioinfer.serving.manager import ModelManager
from aioinfer.serving.messages import (
    InferenceRequest,
    InferenceResponse,
    ModelMetadata,
    ServerMetadata,
    SharedMemoryRef,
    TensorMetadata,
)
from aioinfer.serving.metrics import ModelMetrics, ServerMetrics, failure_reason
from aioinfer.serving.model_config import apply_override, triton_model_config
from aioinfer.serving.models import DEFAULT_MAX_SEQUENCES, SequenceFlags, ServedModel
from aioinfer.serving.repository import ModelEntry, ModelRepository, parse_bytes
from aioinfer.serving.shared_memory import SystemSharedMemory
from aioinfer.serving.statistics import model_statistics
from aioinfer.serving.text_models import ServedTextModel, load_text_model

_logger = logging.getLogger(__name__)

EXTENSIONS = (
    "sequence",
    "statistics",
    "model_configuration",
    "model_repository",
    "system_shared_memory",
)
"""The protocol extensions the service implements on every transport (Triton's names)."""


class InferCall:
    """One infer request to a model, from its arrival to its answer: counted in the
    model's statistics, and in flight (the drain waits for it) until :meth:`end`.

    :meth:`InferenceService.call` makes one once it admitted the request, gives it to
    the transport, which calls :meth:`infer` once it has decoded the request, and counts
    the outcome (:meth:`succeed` or :meth:`fail`, then :meth:`end`).
    """

    __slots__ = ("_metrics", "_service", "computed", "computed_until", "model", "started", "waited")

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
        self.computed = self.computed_until = self.started
        """When the inference began and ended (set by :meth:`infer`)."""
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
        inputs = request.inputs
        shared_memory = self._service.shared_memory
        if request.shared_inputs:
            shared = request.shared_inputs.items()
            inputs = {**inputs, **{name: shared_memory.read(name, s) for name, s in shared}}
        self.computed = time.perf_counter()
        input_bytes = sum(getattr(value, "nbytes", 0) for value in inputs.values())
        try:
            async with self._service.manager.inference_memory(model.name, input_bytes):
                results, self.waited = await model.infer(inputs, sequence)
        except ServiceError:
            raise
        except AioinferError as exc:
            raise ServiceError(str(exc), ErrorKind.of(exc)) from exc
        except Exception as exc:
            _logger.exception("infer request to model %r version %s", model.name, model.version)
            raise ServiceError(
                f"internal server error: {type(exc).__name__}: {exc}", ErrorKind.INTERNAL
            ) from exc
        self.computed_until = time.perf_counter()
        outputs = [(name, results[name], binary) for name, binary, _ in wanted]
        response = InferenceResponse(model.name, model.version, request.id, outputs, self.waited)
        for name, _, region in wanted:
            if region is not None:
                shared_memory.write(name, region, results[name])
                response.shared_outputs[name] = region
        return response

    def succeed(self) -> None:
        """Count the request as answered: its latency (from arrival until now) and the
        time its inference waited."""
        metrics = self._metrics
        now = time.perf_counter()
        metrics.latency.observe(now - self.started)
        metrics.queue_time.observe(self.waited)
        metrics.compute_input += self.computed - self.started
        metrics.compute_infer += self.computed_until - self.computed - self.waited
        metrics.compute_output += now - self.computed_until
        metrics.last_inference = now

    def fail(self, kind: ErrorKind, error: BaseException | None = None) -> None:
        """Count the request as failed, for the reason that ``kind`` stands for; with the
        ``error`` that stopped it, a device that recovers (UNAVAILABLE caused by a
        :class:`~aioinfer.errors.DeviceUnavailableError`) counts as ``unavailable``, not
        ``busy``."""
        metrics = self._metrics
        metrics.fail(failure_reason(kind, error))
        now = time.perf_counter()
        metrics.failed_seconds += now - self.started
        metrics.last_inference = now

    def end(self) -> None:
        """The request is no longer in flight (the drain may end)."""
        metrics = self._metrics
        metrics.in_flight -= 1
        service = self._service
        if service._retiring and metrics.in_flight == 0:  # an unload waits for it
            retiring = service._retiring.get(self.model)
            if retiring is not None:
                retiring.set()
        service._in_flight -= 1
        if service._in_flight == 0 and service._drained is not None:
            service._drained.set()
            service._drained = None


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
        model_control_mode: ``"none"``: every model of the repository is loaded at the
            start and stays (loading and unloading are refused); ``"explicit"``: the
            ``load_models`` are loaded at the start (``"*"``: all), others are loaded
            and unloaded at run time (:meth:`load_model`, :meth:`unload_model`).
        load_models: the models to load at the start in ``explicit`` mode.
        memory_budget: the memory the loaded models may hold together (bytes, or a size
            such as ``"6GiB"``; None: no budget). With a budget, models load when a
            request needs them (at the start, those that fit) and the least recently used
            idle ones are unloaded to make room (see :mod:`aioinfer.serving.manager`),
            in either control mode.
        load_wait: the longest a request waits for its model's load (seconds).

    Raises:
        ServingConfigError: ``max_sequences`` below 1, an unknown model control mode,
            ``load_models`` outside ``explicit`` mode or naming no model of the
            repository, or a memory budget that is not a size.
    """

    def __init__(
        self,
        repository: ModelRepository,
        *,
        core: Core | None = None,
        max_request_bytes: int = 64 * 2**20,
        drain_timeout: float = 30.0,
        max_sequences: int = DEFAULT_MAX_SEQUENCES,
        model_control_mode: str = "none",
        load_models: Sequence[str] = (),
        memory_budget: int | str | None = None,
        load_wait: float = 60.0,
    ) -> None:
        self.repository = repository
        self.model_control_mode = ModelControlMode.parse(model_control_mode)
        self._startup = startup_models(self.model_control_mode, load_models, repository)
        self.core = core or Core()
        self.max_request_bytes = max_request_bytes
        self.drain_timeout = drain_timeout
        if max_sequences < 1:
            raise ServingConfigError(f"max_sequences must be at least 1, got {max_sequences}")
        self.max_sequences = max_sequences
        self.generations: dict[ServedModel, ModelGeneration] = {}
        """The generation of each served model whose config has ``generate``."""
        self.metrics = ServerMetrics(self.served_models)
        """The statistics of every model version (Prometheus families at scrape time)."""
        budget = None if memory_budget is None else parse_bytes(memory_budget)
        self.manager = ModelManager(
            repository,
            self.metrics,
            compile=self._compile,
            retire=self._retire,
            idle_since=self._idle_since,
            warm_up=self._warm_up,
            budget=budget,
            on_demand=budget is not None or self.model_control_mode is ModelControlMode.NONE,
            load_wait=load_wait,
            drain_timeout=drain_timeout,
        )
        """Which models are loaded, under the memory budget."""
        self.models: dict[str, dict[str, ServedModel]] = self.manager.models
        """Model name -> version -> the served model, for the loaded models (the
        manager's)."""
        self.closing = False
        """Set by :meth:`drain`: new inferences are refused and the service is not ready."""
        self.shared_memory = SystemSharedMemory()
        """The system shared-memory regions registered by clients."""
        self.started = False
        """Set once :meth:`load` loaded the models to serve from the start."""
        self._in_flight = 0
        self._drained: anyio.Event | None = None
        self._retiring: dict[ServedModel, anyio.Event] = {}
        self._unloaded_versions: dict[str, set[str]] = {}
        """Model name -> its versions a reload stopped serving (its version policy no
        longer selects them), which the repository index lists as unloaded."""
        self._control = anyio.Lock()

    def served_models(self) -> Iterator[ServedModel]:
        """Every served model version."""
        for versions in self.models.values():
            yield from versions.values()

    # -- lifetime -------------------------------------------------------------------------

    async def load(self) -> None:
        """Compile every version of the models served from the start (off the event
        loop): every model, or in ``explicit`` mode the ``load_models`` (under a memory
        budget, those that fit, in the repository's order); once.

        Raises:
            AioinferError: a model cannot be read or compiled (the message names it).
        """
        await self.manager.load_at_start(
            name for name in self.repository.models if name in self._startup
        )
        self.started = True

    async def _compile(self, entry: ModelEntry) -> dict[str, ServedModel]:
        # An exporter's decoder folder generates with nothing added (STATEFUL, its own
        # end-of-sequence tokens and defaults): see aioinfer.serving.decoder_folder.
        entry = await served_decoder(entry)
        versions: dict[str, ServedModel] = {}
        to_serve = entry.served_versions()
        left_out = sorted(set(entry.versions) - set(to_serve), key=int)
        if left_out:
            _logger.info(
                "model %r: version(s) %s not served under its version policy %s",
                entry.name,
                ", ".join(left_out),
                json.dumps(entry.config.version_policy.to_mapping()),
            )
        try:
            for version, path in to_serve.items():
                if entry.folder is not None:  # an embedding or reranking folder?
                    text_model = await self._compile_text_model(entry, version, path)
                    if text_model is not None:
                        versions[version] = text_model
                        _logger.info("%s", text_model.describe())
                        continue
                decided: tuple[str, ...] = ()
                try:
                    if is_blob_file(path):  # compiled ahead, for the device it names
                        hint = {"PERFORMANCE_HINT": entry.config.hint} if entry.config.hint else {}
                        run_time = {**entry.config.properties, **hint}
                        compiled = await load_model_file(self.core, path, None, run_time)
                    else:
                        model = await self.core.read_model_async(str(path))
                        plan = entry.config.compile_plan(self.core, model)
                        decided = plan.decided
                        config = {
                            **self._budget_properties(plan.device, plan.config),
                            **plan.config,
                        }
                        compiled = await self.core.compile_model_async(model, plan.device, config)
                except AioinferError as exc:
                    raise type(exc)(f"model {entry.name!r} version {version}: {exc}") from exc
                served = versions[version] = ServedModel(
                    entry.name, version, compiled, entry.config, self.max_sequences
                )
                _logger.info("%s", served.describe(decided))
                if entry.config.generate is not None:
                    self.generations[served] = ModelGeneration.beside(served, path)
        except BaseException:
            with anyio.CancelScope(shield=True):
                for done in versions.values():
                    self.generations.pop(done, None)
                    await done.close()
            raise
        return versions

    async def _compile_text_model(
        self, entry: ModelEntry, version: str, path: Path
    ) -> ServedTextModel | None:
        """``entry`` served through its text pipeline, or None when its folder is not
        an embedder's or a reranker's (see :mod:`aioinfer.serving.text_models`)."""
        try:
            return await load_text_model(self.core, entry, version, path, self.max_sequences)
        except AioinferError as exc:
            raise type(exc)(f"model {entry.name!r} version {version}: {exc}") from exc

    def _budget_properties(self, device: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """Under a memory budget, the properties that make the device that computes for
        ``device`` (``BATCH:``, ``PROCESS:`` wrap it; ``AUTO`` compiles on the first
        available device of its priorities) give its runs' memory back to the system:
        onnxruntime's CPU arena off. The model's own ``properties`` override them."""
        if self.manager.budget is None:
            return {}
        computing = device.rsplit(":", 1)[-1]
        if computing == "AUTO":
            priorities = config.get("DEVICE_PRIORITIES") or self.core.get_property(
                "AUTO", "DEVICE_PRIORITIES"
            )
            if isinstance(priorities, str):
                priorities = priorities.split(",")
            usable = [d for d in priorities if unavailable_reason(self.core, d) is None]
            computing = usable[0] if usable else ""
        return {"ORT_CPU_MEM_ARENA": False} if computing == "ORT" else {}

    async def _warm_up(self, versions: dict[str, ServedModel]) -> int:
        """Run one inference on each of ``versions`` (just loaded) on its
        :func:`example_inputs`; not for a model that keeps state or generates. The
        bytes of the inputs given to the inferences that ran (0: none ran); a model
        that refuses its example inputs is left alone."""
        given = 0
        for served in versions.values():
            config = served.config
            if config.stateful is not None or config.generate is not None:
                continue
            inputs = example_inputs(served.inputs)
            if inputs is None:
                continue
            try:
                await served.compiled.infer(inputs, share_inputs=True)
            except AioinferError as exc:
                _logger.info(
                    "model %r version %s: no warm-up inference (%s)",
                    served.name,
                    served.version,
                    exc,
                )
                continue
            given += sum(value.nbytes for value in inputs.values())
        return given

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """Load the models and drop idle sequences meanwhile; at the end, refuse new
        inferences, let the in-flight ones finish (up to ``drain_timeout``), then close
        the models."""
        self.closing = False
        await self.load()
        async with self.manager.running(), anyio.create_task_group() as group:
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
        self.manager.clear()  # a later lifespan compiles them again
        self._unloaded_versions.clear()
        self.generations.clear()
        self.shared_memory.close()
        self.started = False

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
            await self._drop_idle_sequences_once()

    async def _drop_idle_sequences_once(self) -> None:
        # A pass of its own: the loop's variable must not keep an unloaded model alive
        # while the loop above sleeps.
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
            # Triton's wording, which clients match ("Request for unknown model").
            known = ", ".join(map(repr, sorted(self.models))) or "none"
            unloaded = ""
            if name in self.repository.models:
                state, reason = self.manager.state(name)
                unloaded = f" (it is in the repository, not loaded: {state.value}"
                unloaded += f", {reason})" if reason else ")"
            raise ServiceError(
                f"Request for unknown model: {name!r} is not found{unloaded}; "
                f"served models: {known}",
                ErrorKind.NOT_FOUND,
            )
        if version is None:
            return versions[max(versions, key=int)]
        model = versions.get(version)
        if model is None:
            known = ", ".join(sorted(versions, key=int))
            entry = self.repository.models.get(name)
            unserved = ""
            if entry is not None and version in entry.versions:
                served = next(iter(versions.values()))
                policy = json.dumps(served.config.version_policy.to_mapping())
                unserved = f" (in the repository, not served under the version policy {policy})"
            raise ServiceError(
                f"Request for unknown model: {name!r} version {version} is not found"
                f"{unserved}; served versions: {known}",
                ErrorKind.NOT_FOUND,
            )
        return model

    def live(self) -> bool:
        """Whether the service runs (it answers, so it does)."""
        return True

    def ready(self) -> bool:
        """Whether the service takes inferences: the models served from the start are
        loaded and it is not draining."""
        return self.started and not self.closing

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

    # -- Triton's extensions: configuration, statistics, repository, shared memory --------

    def model_config(self, model: ServedModel) -> dict[str, Any]:
        """Triton's model configuration of ``model``, derived from the compiled model (see
        :mod:`aioinfer.serving.model_config`)."""
        return triton_model_config(model)

    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        """``{"model_stats": [...]}`` in the shape of Triton's statistics extension: of
        every version of every model (``name`` None), of every version of model ``name``
        (``version`` None), or of one version.

        Raises:
            ServiceError: NOT_FOUND, an unknown model or version (as :meth:`find`).
        """
        if name is None:
            models = list(self.served_models())
        elif version is None:
            models = list(self.models[self.find(name, None).name].values())
        else:
            models = [self.find(name, version)]
        figures = dict(self.metrics.figures())
        stats = [
            model_statistics(model, figures.get((model.name, model.version)) or ModelMetrics())
            for model in models
        ]
        return {"model_stats": stats}

    def repository_index(self, ready: bool = False) -> list[dict[str, str]]:
        """The models of the repository: ``{"name", "version", "state", "reason"}`` per
        served version (state ``READY``, or ``UNAVAILABLE`` while its device recovers)
        and per version a reload stopped serving (``UNAVAILABLE``, reason
        ``unloaded``), ``{"name", "state", "reason"}`` per model not loaded (state
        ``LOADING``, ``UNLOADING``, or ``UNAVAILABLE`` with the reason: ``unloaded``,
        evicted, idle, its load failed); with ``ready``, only the versions ready now. As
        in Triton, a version its model's version policy never served is not listed."""
        entries = []
        for name in self.repository.model_names():
            versions = self.models.get(name)
            if versions is None:
                if not ready:
                    managed, reason = self.manager.state(name)
                    entries.append({"name": name, "state": managed.value, "reason": reason})
                continue
            states = {
                version: ("READY" if self.model_ready(model) else "UNAVAILABLE", "")
                for version, model in versions.items()
            }
            for version in self._unloaded_versions.get(name, ()):
                states[version] = ("UNAVAILABLE", "unloaded")
            for version in sorted(states, key=int):
                state, reason = states[version]
                if state == "READY" or not ready:
                    entries.append(
                        {"name": name, "version": version, "state": state, "reason": reason}
                    )
        return entries

    async def load_model(self, name: str, config: str | None = None) -> None:
        """Load model ``name`` (its versions and config file read again from the
        repository), compiling off the event loop; a loaded model is replaced once the
        new one compiled (its in-flight inferences finish first, as at unload).
        ``config`` is a config override (JSON: see :mod:`aioinfer.serving.model_config`)
        for this load.

        Raises:
            ModelControlError: UNAVAILABLE outside ``explicit`` mode or while shutting
                down; INVALID_ARGUMENT ("failed to load 'name': ...") for a model that is
                not in the repository, an invalid override, or a compile that failed.
        """
        self.model_control_mode.check_allowed()
        if self.closing:
            raise ModelControlError("the server is shutting down", ErrorKind.UNAVAILABLE)
        async with self._control:
            # The versions' names only: the manager closes the replaced models, and a
            # reference here would keep their memory.
            replaced = set(self.models.get(name, ()))
            try:
                entry = self.repository.refresh(name)
                if config is not None:
                    override = apply_override(entry.config, config, f"model {name!r}")
                    entry = dataclasses.replace(entry, config=override)
                await self.manager.load(name, entry)
            except ModelMemoryError as exc:
                raise ModelMemoryError(f"failed to load {name!r}: {exc}", exc.kind) from exc
            except AioinferError as exc:
                raise ModelControlError(f"failed to load {name!r}: {exc}") from exc
            versions = self.models[name]
            if replaced:
                dropped = self._unloaded_versions.get(name, set()) | replaced
                self._unloaded_versions[name] = dropped - set(versions)
            _logger.info("loaded model %r (versions %s)", name, ", ".join(versions))

    async def unload_model(self, name: str) -> None:
        """Unload model ``name``: new requests to it are refused (NOT_FOUND) at once; its
        in-flight inferences may finish (up to ``drain_timeout``), then it is closed. A
        model of the repository that is not loaded is no error.

        Raises:
            ModelControlError: UNAVAILABLE outside ``explicit`` mode; INVALID_ARGUMENT for
                a model that is not in the repository.
        """
        self.model_control_mode.check_allowed()
        async with self._control:
            self._unloaded_versions.pop(name, None)
            if name not in self.models and name not in self.repository.model_names():
                raise ModelControlError(
                    f"failed to unload {name!r}: no model {name!r} in the repository"
                )
            await self.manager.unload(name, "unloaded", held_back=True)

    def _idle_since(self, name: str) -> float | None:
        """None while model ``name`` has requests in flight or open sequences; else
        when its last request ended (``time.perf_counter()``; 0: none yet)."""
        ended = 0.0
        figures = self.metrics.figures_of
        for model in self.models.get(name, {}).values():
            metrics = figures(model)
            if metrics is not None:
                if metrics.in_flight > 0:
                    return None
                ended = max(ended, metrics.last_inference)
            if model.sequences:
                return None
        return ended

    async def _retire(self, models: list[ServedModel], timeout: float | None) -> None:
        """Wait (up to ``timeout`` seconds; None: as long as they run) for the in-flight
        inferences of ``models`` (no longer served), then close them."""
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(timeout):
                for model in models:
                    figures = dict(self.metrics.figures()).get((model.name, model.version))
                    while figures is not None and figures.in_flight > 0:
                        event = self._retiring[model] = anyio.Event()
                        await event.wait()
            for model in models:
                self._retiring.pop(model, None)
                self.generations.pop(model, None)
                await model.close()

    def register_system_shared_memory(
        self, name: str, key: str, offset: object, byte_size: object
    ) -> None:
        """Register ``byte_size`` bytes from ``offset`` of the POSIX shared-memory object
        ``key`` as region ``name`` (see :class:`SystemSharedMemory`).

        Raises:
            SharedMemoryError: as :meth:`SystemSharedMemory.register`.
        """
        self.shared_memory.register(name, key, offset, byte_size)

    def unregister_system_shared_memory(self, name: str | None = None) -> None:
        """Unregister region ``name`` (None: every region)."""
        self.shared_memory.unregister(name)

    def system_shared_memory_status(self, name: str | None = None) -> list[dict[str, Any]]:
        """The registered regions (``name``: that one).

        Raises:
            SharedMemoryError: no region ``name``.
        """
        return self.shared_memory.status(name)

    def cuda_shared_memory_status(self, name: str | None = None) -> list[dict[str, Any]]:
        """No CUDA shared-memory region is ever registered: an empty list.

        Raises:
            SharedMemoryError: for a region ``name`` (there is none).
        """
        if name is not None:
            raise SharedMemoryError(f"Unable to find cuda shared memory region: {name!r}")
        return []

    def register_cuda_shared_memory(self, name: str) -> None:
        """Refuse: aioinfer has no CUDA device.

        Raises:
            SharedMemoryError: always (INVALID_ARGUMENT, "not supported").
        """
        raise SharedMemoryError(
            f"cannot register CUDA shared memory region {name!r}: CUDA shared memory is not "
            "supported (aioinfer serves no CUDA device); use system shared memory"
        )

    def unregister_cuda_shared_memory(self, name: str | None = None) -> None:
        """Nothing to do: no CUDA region is ever registered (unregistering is
        idempotent, as in Triton)."""

    # -- inference ----------------------------------------------------------------------------

    call_type: type[InferCall] = InferCall
    """What :meth:`start` makes of an admitted request (Ray's ingress forwards it)."""

    def start(self, name: str, version: str | None) -> InferCall:
        """Begin an infer request to model ``name`` at ``version`` (None: the latest):
        count it and admit it, before its body is read. The first step of
        :meth:`call`, which transports use: a call from here must end with
        :meth:`InferCall.end` after :meth:`InferCall.succeed` or :meth:`InferCall.fail`.

        Raises:
            ServiceError: NOT_FOUND, an unknown model or version; UNAVAILABLE (counted as
                failed), the service is draining or the model has neither a free slot
                nor room in its queue.
        """
        call = self.call_type(self, self.find(name, version))
        try:
            if self.closing:
                raise ServiceError("the server is shutting down", ErrorKind.UNAVAILABLE)
            call.model.check_admission()
        except ServiceError as exc:
            call.fail(exc.kind)
            call.end()
            raise
        return call

    @asynccontextmanager
    async def call(self, name: str, version: str | None) -> AsyncIterator[InferCall]:
        """One request to model ``name`` at ``version`` (None: the latest), from its
        admission to its outcome: the way in for every transport.

        The request is admitted on entry (before the transport reads its body) and in
        flight until the block is left (the drain waits for it). The block's end counts
        it: as answered when the block completes (its latency: from admission until
        then, the response encoded); as failed for its kind when a
        :class:`~aioinfer.errors.ServiceError` leaves it; as INTERNAL when any other
        exception does (logged, and raised as a ServiceError); as CANCELLED when the
        block is cancelled or, in an async generator, closed (the client went away).

        Raises:
            ServiceError: the errors of :meth:`start` on entry; those raised in the
                block; INTERNAL in place of any other exception.
        """
        if name in self.models:
            self.manager.touch(name)
        else:  # not loaded: wait for its load (NOT_FOUND below for a model not loadable)
            await self.manager.acquire(name)
        call = self.start(name, version)
        try:
            yield call
        except ServiceError as exc:
            call.fail(exc.kind, exc)
            raise
        except Exception as exc:  # a fault of the server's, not of the request
            model = call.model
            _logger.exception("request to model %r version %s", model.name, model.version)
            call.fail(ErrorKind.INTERNAL)
            raise ServiceError(
                f"internal server error: {type(exc).__name__}: {exc}", ErrorKind.INTERNAL
            ) from exc
        except BaseException:  # cancelled, or the generator around the block closed
            call.fail(ErrorKind.CANCELLED)
            raise
        else:
            call.succeed()
        finally:
            call.end()

    async def infer(
        self, name: str, version: str | None, request: InferenceRequest
    ) -> InferenceResponse:
        """Run ``request`` on model ``name`` at ``version`` (None: the latest), with its
        admission, sequence and statistics, as a transport would.

        Raises:
            ServiceError: the errors of :meth:`call` and :meth:`InferCall.infer`.
        """
        async with self.call(name, version) as call:
            return await call.infer(request)

    def generate(
        self, name: str, version: str | None, request: GenerateRequest
    ) -> AsyncGenerator[GeneratedToken, None]:
        """The tokens that model ``name`` at ``version`` (None: the latest) generates for
        ``request``, one per step, the last with its ``finish_reason`` (see
        :mod:`aioinfer.serving.generation`). Iterate it to its end, or close it to stop
        the generation.

        Raises (from the iteration that meets them; the first one raises those of the
        prompt and of admission):
            ServiceError: the errors of :meth:`start`; INVALID_ARGUMENT, the model does
                not generate (no ``generate`` in its config), a bad prompt or parameter,
                or a kernel that failed on them; UNAVAILABLE when the model's queue is
                full; ABORTED when the model was closed under it; INTERNAL for a fault
                of the server.
        """
        return generate_tokens(self, name, version, request)


EXAMPLE_DIM = 64
"""The size an example input gets in a dimension that is not static, but the first: a
size that the strided convolutions of image models accept, and on which an inference
allocates in proportion to its inputs as on larger ones."""


def example_inputs(ports: Sequence[Any]) -> dict[str, np.ndarray] | None:
    """Zeros for each of the tensor ``ports``: of its static dimensions, 1 for a first
    dimension that is not (the batch), :data:`EXAMPLE_DIM` for any other; None when a
    port's rank is unknown or it is not a tensor."""
    inputs = {}
    for port in ports:
        if port.kind != "tensor" or port.shape is None:
            return None
        shape = tuple(
            dim if isinstance(dim, int) else (1 if axis == 0 else EXAMPLE_DIM)
            for axis, dim in enumerate(port.shape)
        )
        inputs[port.name] = np.zeros(shape, port.dtype)
    return inputs


def _wanted_outputs(
    model: ServedModel, request: InferenceRequest
) -> list[tuple[str, bool, SharedMemoryRef | None]]:
    """(name, binary, shared-memory region or None) of each output ``request`` asks for,
    every output when it names none."""
    names = model.output_names
    if request.outputs is None:
        return [(name, request.binary_output, None) for name in names]
    for output in request.outputs:
        if output.name not in names:
            known = ", ".join(map(repr, names))
            raise ServiceError(
                f"the model has no output named {output.name!r}; its outputs are {known}",
                ErrorKind.INVALID_ARGUMENT,
            )
    return [(output.name, output.binary, output.shared_memory) for output in request.outputs]


ModelServer = InferenceService
"""The service's first name, from when it was the REST app's state (``app.state.server``
of :func:`~aioinfer.serving.create_app`)."""
