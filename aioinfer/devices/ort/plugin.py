"""The ``ORT`` device: an onnxruntime session behind aioinfer's request pipeline."""

from __future__ import annotations

import dataclasses
import shutil
import weakref
from collections.abc import Mapping
from typing import Any

import anyio.to_thread
import onnxruntime as ort

from aioinfer.devices.ort.export import ort_payload, read_ort_payload
from aioinfer.devices.ort.profile import SessionProfiler, profile_directory
from aioinfer.devices.ort.properties import (
    ORT_ALLOW_SPINNING,
    ORT_CPU_MEM_ARENA,
    ORT_INLINE_RUN_US,
    ORT_PROVIDERS,
    ORT_THREAD_NICE,
)
from aioinfer.devices.ort.query import supported_nodes
from aioinfer.devices.ort.request import ORTInferRequest
from aioinfer.devices.ort.session import ModelBytes, SessionSpec
from aioinfer.devices.ort.single import (
    MAX_MODEL_BYTES,
    ORT_SINGLE_THREAD_RUN_US,
    SingleThreadRuns,
)
from aioinfer.errors import CompileError, InvalidBlobError
from aioinfer.model import Model, Port
from aioinfer.plugin.blob import ExportedModel
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.plugin.executors import Executor, ThreadExecutor, streams_for
from aioinfer.plugin.inline import RunExecutor, RunTimes
from aioinfer.plugin.plugin import Plugin
from aioinfer.plugin.sync_request import SyncInferRequest
from aioinfer.properties import (
    CACHE_DIR,
    DEVICE_NAME,
    INFERENCE_NUM_THREADS,
    LOADED_FROM_CACHE,
    NETWORK_NAME,
    NUM_CORES,
    NUM_STREAMS,
    OPTIMAL_NUMBER_OF_INFER_REQUESTS,
    OPTIMIZATION_CAPABILITIES,
    PERF_COUNT,
    PERFORMANCE_HINT,
    SUPPORTED_PROPERTIES,
    declare,
    num_cores,
)


class ORTPlugin(Plugin):
    """The ``"ORT"`` device: onnxruntime's CPU execution provider, or the providers
    listed in ``ORT_PROVIDERS``."""

    device_name = "ORT"
    properties = declare(
        PERFORMANCE_HINT,
        NUM_STREAMS,
        INFERENCE_NUM_THREADS,
        PERF_COUNT,
        ORT_PROVIDERS,
        ORT_ALLOW_SPINNING,
        ORT_CPU_MEM_ARENA,
        ORT_INLINE_RUN_US,
        ORT_SINGLE_THREAD_RUN_US,
        ORT_THREAD_NICE,
        CACHE_DIR,
        LOADED_FROM_CACHE,
        NETWORK_NAME,
        OPTIMAL_NUMBER_OF_INFER_REQUESTS,
        SUPPORTED_PROPERTIES,
        DEVICE_NAME,
        NUM_CORES,
        OPTIMIZATION_CAPABILITIES,
    )

    def compile_model(self, model: Model, config: Mapping[str, Any]) -> ORTCompiledModel:
        """Create the onnxruntime session of ``model``.

        Raises:
            UnknownPropertyError: a property the device does not support.
            InvalidPropertyValueError: a bad value, or a provider that is not available.
            UnsupportedOperatorError: onnxruntime has no kernel for a node (named).
            CompileError: onnxruntime refused the model for another reason.
        """
        parsed = self.parse_config(config)
        source = ModelBytes.from_model(model)
        return ORTCompiledModel(self, source, model.inputs, model.outputs, parsed)

    def import_payload(self, exported: ExportedModel, config: dict[str, Any]) -> ORTCompiledModel:
        """A session created from the optimized graph of the payload (see
        :mod:`.export`), with the blob's config and the run-time properties given.

        Raises:
            InvalidBlobError: a malformed payload, a graph that is not self-contained or
                well-formed, one onnxruntime refuses, or inputs that differ from the
                blob's header.
            BlobVersionError: the graph was optimized by another onnxruntime version.
            InvalidPropertyValueError: a provider of the blob's ``ORT_PROVIDERS`` is not
                available here.
        """
        source, inputs = read_ort_payload(exported.payload, "model")
        expected = [port.name for port in exported.inputs]
        if inputs != expected:
            raise InvalidBlobError(
                f"the blob's model has inputs {inputs}, its header says {expected}"
            )
        try:
            return ORTCompiledModel(self, source, exported.inputs, exported.outputs, config)
        except CompileError as exc:
            raise InvalidBlobError(f"the blob's model does not load: {exc}") from None

    def get_property(self, name: str) -> Any:
        """The device-level properties; ``OPTIMIZATION_CAPABILITIES`` says
        ``EXPORT_IMPORT``: compiled models export, and the model cache works."""
        if name == "OPTIMIZATION_CAPABILITIES":
            return ("EXPORT_IMPORT",)
        return super().get_property(name)

    def query_model(self, model: Model, config: Mapping[str, Any] | None = None) -> dict[str, str]:
        """The nodes onnxruntime runs: its operator, at the model's opset, has a kernel,
        or onnxruntime folds it at load (``Constant``) or inlines its ONNX function body
        (see :mod:`aioinfer.devices.ort.query`)."""
        return supported_nodes(model, self.device_name)


MULTI_STREAM_INLINE_S = 50e-6
"""With several streams, a run inline takes the loop's thread while the other streams'
threads could compute: worth it only for runs shorter than the hop to a thread and back
(tens of microseconds here), which the loop then saves."""


RUN_TIME_WEIGHT = 0.25
"""Weight of the latest run in the running average that decides whether the next runs go
inline: a run that the machine's load stretched past the budget (onnxruntime's threads
preempted) does not send the next ones to a thread, which on a busy 2-core machine sent
up to a third of a 0.3 ms model's awaited runs through the hop."""


class ORTCompiledModel(CompiledModel):
    """One onnxruntime session shared by all requests; up to ``NUM_STREAMS`` of them run
    at once, each on a thread of the task executor with ``intra_op_num_threads``
    threads of the session's pool.

    Attributes:
        session: the ``onnxruntime.InferenceSession`` (with ``PERF_COUNT``, the
            profiling session runs currently start on).
    """

    def __init__(
        self,
        plugin: ORTPlugin,
        source: ModelBytes,
        inputs: list[Port],
        outputs: list[Port],
        config: dict[str, Any],
    ) -> None:
        streams = streams_for(config, num_cores())
        total = int(config["INFERENCE_NUM_THREADS"]) or num_cores()
        self.threads_per_stream = max(1, total // streams)
        prefix = ""
        directory = ""
        if config["PERF_COUNT"]:
            directory = profile_directory()
            prefix = f"{directory}/profile"
        spec = SessionSpec.from_config(source, config, self.threads_per_stream, prefix)
        self.spec = spec
        """How the session was made; :meth:`export_payload` optimizes its model again."""
        self.profiler: SessionProfiler | None = None
        self.plain_session: ort.InferenceSession | None = None
        """The session when profiling is off."""
        try:
            if directory:
                self.profiler = SessionProfiler(spec.create, directory)
            else:
                self.plain_session = spec.create()
        except BaseException:
            if directory:
                shutil.rmtree(directory, ignore_errors=True)
            raise
        if self.profiler is not None:
            weakref.finalize(self, self.profiler.close)
        self.single_thread: SingleThreadRuns | None = None
        """The one-thread session for short runs (see :mod:`.single`), when it may pay."""
        limit = int(config["ORT_SINGLE_THREAD_RUN_US"]) / 1e6
        if (
            limit
            and self.plain_session is not None
            and streams == 1
            and self.threads_per_stream > 1
            and len(source.model) <= MAX_MODEL_BYTES
        ):
            narrow = dataclasses.replace(spec, intra_op_threads=1)
            self.single_thread = SingleThreadRuns(limit, narrow.create)
        config = {**config, "ORT_PROVIDERS": tuple(self.session.get_providers())}
        budget = int(config["ORT_INLINE_RUN_US"]) / 1e6
        if streams > 1:  # inline runs are one at a time: only those shorter than the hop
            budget = min(budget, MULTI_STREAM_INLINE_S)
        self.run_times = RunTimes(budget, weight=RUN_TIME_WEIGHT, exclusive=True)
        """The last run times that decide where a run goes (see :mod:`aioinfer.plugin.inline`)."""
        # The session holds the weights: the IR graph (and its weights) is not kept, only
        # the serialized model (to export it).
        self.streams = streams
        super().__init__(plugin, source.name, inputs, outputs, config)
        # One compute thread per stream; a short run may skip it (see pipeline).
        self.task_executor = self.add_executor(
            ThreadExecutor(f"{plugin.device_name}-task", streams, int(config["ORT_THREAD_NICE"]))
        )

    @property
    def session(self) -> ort.InferenceSession:
        """The onnxruntime session requests run on."""
        if self.profiler is not None:
            return self.profiler.session
        assert self.plain_session is not None
        return self.plain_session

    def create_sync_infer_request(self) -> ORTInferRequest:
        return ORTInferRequest(self)

    def pipeline(self, request: SyncInferRequest) -> list[tuple[Executor, Any]]:
        """The default pipeline, but with an inline budget (one stream) the run goes
        through a :class:`RunExecutor`: inline on the loop when it is short and the stream
        idle, else on the task executor."""
        assert isinstance(request, ORTInferRequest)
        run: Executor = self.task_executor
        if self.run_times.budget:  # else every run goes to the task executor
            run = RunExecutor(self.task_executor, self.run_times, request.input_shapes)
        return [
            (self.loop_executor, request.infer_preprocess),
            (run, request.start_pipeline),
            (self.loop_executor, request.wait_pipeline),
            (self.loop_executor, request.infer_postprocess),
        ]

    def export_payload(self) -> bytes:
        """onnxruntime's optimized graph of the model with its weights (see
        :mod:`.export`; made by a session of its own, so exporting costs about a compile)."""
        return ort_payload(self.spec.optimized_model())

    def read_only_property(self, name: str) -> Any:
        if name == "INFERENCE_NUM_THREADS":
            return self.threads_per_stream * self.streams
        return super().read_only_property(name)

    async def close(self) -> None:
        """Close the requests and executors, let a one-thread session being made
        finish, then end profiling (PERF_COUNT)."""
        await super().close()
        if self.single_thread is not None:
            await anyio.to_thread.run_sync(self.single_thread.join)
        if self.profiler is not None:
            self.profiler.close()
