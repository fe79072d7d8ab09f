"""The CPU device: numpy kernels behind the plugin API."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import onnx_ir as ir

from aioinfer.devices.cpu import kernels  # noqa: F401  (registers every kernel)
from aioinfer.devices.cpu.compiler import evaluate_node, lower
from aioinfer.devices.cpu.inline import CPU_INLINE_RUN_US, cpu_run_times
from aioinfer.devices.cpu.kernels.parallel import set_intra_op_threads
from aioinfer.devices.cpu.kernels.registry import find_kernel
from aioinfer.devices.cpu.passes.pipeline import compile_passes
from aioinfer.devices.cpu.request import CPUInferRequest
from aioinfer.errors import (
    AioinferError,
    InvalidBlobError,
    UnsupportedOperatorError,
)
from aioinfer.model import Model, Port
from aioinfer.opsets import MAX_ONNX_OPSET, check_onnx_opset, node_opset
from aioinfer.plugin.blob import ExportedModel
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.plugin.executors import Executor, ThreadExecutor, streams_for
from aioinfer.plugin.inline import RunExecutor
from aioinfer.plugin.onnx_payload import onnx_payload, read_onnx_payload
from aioinfer.plugin.plugin import Plugin
from aioinfer.plugin.state import split_ports
from aioinfer.plugin.sync_request import SyncInferRequest
from aioinfer.properties import (
    ALLOW_AUTO_BATCHING,
    CACHE_DIR,
    DEVICE_NAME,
    FULL_DEVICE_NAME,
    INFERENCE_NUM_THREADS,
    LOADED_FROM_CACHE,
    NETWORK_NAME,
    NUM_CORES,
    NUM_STREAMS,
    OPTIMAL_NUMBER_OF_INFER_REQUESTS,
    OPTIMIZATION_CAPABILITIES,
    PERF_COUNT,
    PERFORMANCE_HINT,
    STATEFUL,
    SUPPORTED_PROPERTIES,
    Property,
    cpu_model_name,
    declare,
    num_cores,
)
from aioinfer.transforms.make_stateful import stateful_pairs, variable_shapes

ACTIVATION_MEMORY_BYTES = Property(
    "ACTIVATION_MEMORY_BYTES",
    "Bytes of planned activation buffers one request holds for the input shapes it "
    "ran last (the largest over the requests; 0 before the first inference and after "
    "release_memory).",
    configurable=False,
    mutable=True,
)


class CPUPlugin(Plugin):
    """The built-in ``"CPU"`` device."""

    device_name = "CPU"
    handles_state = True  # variables are inputs and outputs of the plan: see docs/stateful.md
    optimization_capabilities = ("EXPORT_IMPORT",)
    properties = declare(
        PERFORMANCE_HINT,
        NUM_STREAMS,
        INFERENCE_NUM_THREADS,
        ALLOW_AUTO_BATCHING,
        STATEFUL,
        PERF_COUNT,
        CACHE_DIR,
        CPU_INLINE_RUN_US,
        ACTIVATION_MEMORY_BYTES,
        LOADED_FROM_CACHE,
        NETWORK_NAME,
        OPTIMAL_NUMBER_OF_INFER_REQUESTS,
        SUPPORTED_PROPERTIES,
        DEVICE_NAME,
        FULL_DEVICE_NAME,
        NUM_CORES,
        OPTIMIZATION_CAPABILITIES,
    )

    def compile_model(self, model: Model, config: Mapping[str, Any]) -> CPUCompiledModel:
        """Run the passes on a copy of ``model`` and lower it to a plan.

        Raises:
            UnsupportedOpsetError: the model's ``ai.onnx`` opset is newer than
                :data:`~aioinfer.opsets.MAX_ONNX_OPSET`.
            UnsupportedOperatorError: an operator without a kernel (named).
        """
        parsed = self.parse_config(config)
        check_onnx_opset(model.ir.opset_imports, self.device_name, MAX_ONNX_OPSET)
        return CPUCompiledModel.compile(self, model, parsed)

    def import_payload(self, exported: ExportedModel, config: dict[str, Any]) -> CPUCompiledModel:
        """Lower the transformed graph of the payload again (see
        :meth:`CPUCompiledModel.export_payload`), without running the passes.

        Raises:
            InvalidBlobError: the payload is not a self-contained, well-formed ONNX model
                (see :func:`aioinfer.plugin.onnx_payload.read_onnx_payload`), cannot be
                lowered, or does not fit the header (ports, ``STATEFUL`` pairs).
        """
        model = read_onnx_payload(exported.payload)
        stored = config["STATEFUL"]  # never overridden: it is not mutable
        if not isinstance(stored, dict):
            raise InvalidBlobError(
                f"the blob's config has STATEFUL {stored!r}, expected the "
                "pairs made when it was compiled"
            )
        try:
            compiled = CPUCompiledModel(self, model, exported.inputs, exported.outputs, config)
        except (AioinferError, LookupError, ValueError, TypeError, RecursionError) as exc:
            raise InvalidBlobError(f"the blob's model cannot be lowered: {exc}") from exc
        if compiled.config["STATEFUL"] != stored:
            raise InvalidBlobError(
                f"the blob's config has STATEFUL {stored!r}, but its model "
                f"makes the variables {compiled.config['STATEFUL']!r}"
            )
        graph = model.graph
        feeds = [v.name for v in graph.inputs if v.name not in graph.initializers]
        outputs = [v.name for v in graph.outputs]
        if [p.name for p in compiled.inputs] != feeds or [
            p.name for p in compiled.outputs
        ] != outputs:
            raise InvalidBlobError(
                f"the blob's header ports do not match its model: inputs "
                f"{[p.name for p in compiled.inputs]} and outputs "
                f"{[p.name for p in compiled.outputs]}, the model has {feeds} and {outputs}"
            )
        return compiled

    def get_property(self, name: str) -> Any:
        """The device-level properties; ``FULL_DEVICE_NAME`` is the processor's model name."""
        if name == "FULL_DEVICE_NAME":
            return cpu_model_name()
        return super().get_property(name)

    def query_model(self, model: Model, config: Mapping[str, Any] | None = None) -> dict[str, str]:
        """The nodes the CPU has a kernel for (in the model's opset), mapped to ``CPU``."""
        opsets = model.ir.opset_imports
        supported = {}
        for index, node in enumerate(model.ir.graph):
            try:
                find_kernel(node.domain, node.op_type, node_opset(node, opsets))
            except UnsupportedOperatorError:
                continue
            supported[node.name or f"{node.op_type}_{index}"] = self.device_name
        return supported


class CPUCompiledModel(CompiledModel):
    """A model lowered to a plan of numpy kernels; weights are shared by all requests.

    With ``STATEFUL`` pairs, ``variables`` lists the variables each request keeps (their
    inputs and outputs are no longer ports), and the config holds the pairs made.
    """

    def __init__(
        self,
        plugin: CPUPlugin,
        ir_model: ir.Model,
        source_inputs: Sequence[Port],
        source_outputs: Sequence[Port],
        config: dict[str, Any],
    ) -> None:
        """Lower the *transformed* ``ir_model`` (see :meth:`compile`); ``source_inputs``
        and ``source_outputs`` are the ports of the model before make-stateful, and
        ``config["STATEFUL"]`` the pairs it made."""
        self.ir_model = ir_model
        self._source_ports = (list(source_inputs), list(source_outputs))
        self.plan = lower(ir_model.graph, ir_model.opset_imports)
        pairs = config.get("STATEFUL") or {}
        made = [(name, pairs[name]) for name in self.plan.variables]
        inputs, outputs, variables = split_ports(source_inputs, source_outputs, made)
        shapes = variable_shapes(ir_model.graph)  # with the sizes SizeStatesPass found
        self.variables = [
            dataclasses.replace(v, shape=shapes.get(v.name, v.shape)) for v in variables
        ]
        config = {**config, "STATEFUL": dict(made)}
        self.streams = streams_for(config, num_cores())
        self.threads_per_stream = _configure_blas(config, self.streams)
        self.run_times = cpu_run_times(config)
        """The last run times that decide where a plan runs (see :mod:`.inline`)."""
        self._sync_requests: weakref.WeakSet[CPUInferRequest] = weakref.WeakSet()
        super().__init__(plugin, ir_model.graph.name or "model", inputs, outputs, config)
        self.graph = ir_model.graph
        """The transformed graph (what the passes fused and folded)."""
        self.task_executor = self.add_executor(
            ThreadExecutor(f"{plugin.device_name}-task", self.streams)
        )

    @classmethod
    def compile(cls, plugin: CPUPlugin, model: Model, config: dict[str, Any]) -> CPUCompiledModel:
        """Run the pass pipeline on a copy of ``model``, then lower it."""
        ir_model = model.ir.clone()
        pairs = stateful_pairs(ir_model.graph, config.get("STATEFUL"))
        compile_passes(evaluate_node, pairs)(ir_model)
        return cls(plugin, ir_model, model.inputs, model.outputs, {**config, "STATEFUL": pairs})

    def export_payload(self) -> bytes:
        """The transformed graph (fusions, folded weights, state operators) with its
        weights, as an ONNX model: importing lowers it again without the passes."""
        return onnx_payload(self.ir_model)

    def source_ports(self) -> tuple[list[Port], list[Port]]:
        """The ports of the model before make-stateful took some as variables."""
        return self._source_ports

    def create_sync_infer_request(self) -> CPUInferRequest:
        request = CPUInferRequest(self)
        self._sync_requests.add(request)
        return request

    def pipeline(self, request: SyncInferRequest) -> list[tuple[Executor, Any]]:
        """The default pipeline, but the plan runs through a :class:`RunExecutor`:
        inline on the loop when its last run was short, else on the task executor."""
        assert isinstance(request, CPUInferRequest)
        run = RunExecutor(self.task_executor, self.run_times, request.input_shapes)
        return [
            (self.loop_executor, request.infer_preprocess),
            (run, request.start_pipeline),
            (self.loop_executor, request.wait_pipeline),
            (self.loop_executor, request.infer_postprocess),
        ]

    def read_only_property(self, name: str) -> Any:
        if name == "INFERENCE_NUM_THREADS":
            return self.threads_per_stream * self.streams
        if name == "ACTIVATION_MEMORY_BYTES":
            return max((r.memory.nbytes for r in list(self._sync_requests)), default=0)
        return super().read_only_property(name)


def _configure_blas(config: Mapping[str, Any], streams: int) -> int:
    """Split the compute threads between the streams; return the threads per stream.

    Kernels split their work between that many intra-op threads (the request sets them
    for each run of the plan), BLAS runs on one (see
    :mod:`aioinfer.devices.cpu.kernels.parallel`).
    """
    total = int(config["INFERENCE_NUM_THREADS"]) or num_cores()
    per_stream = max(1, total // streams)
    set_intra_op_threads(per_stream)
    return per_stream
