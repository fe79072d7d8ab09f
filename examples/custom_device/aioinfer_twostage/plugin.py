"""The ``TWOSTAGE`` plugin and its compiled model.

The device models an accelerator with its own memory: each inference first *stages*
its inputs into the request's device buffers on a host thread, then *computes* on a
compute thread, then copies the outputs back to host memory on the host thread. The
host work and the compute run on two different executors, so while request A computes,
request B stages its inputs: stages of different requests overlap.

The compute reuses the CPU device's compiler (passes and lowering to a plan of numpy
kernels), and exports the transformed graph as an ONNX payload; a real device would
lower to its own executable form and export that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import onnx_ir as ir

from aioinfer.devices.cpu.compiler import evaluate_node, lower
from aioinfer.devices.cpu.kernels.parallel import set_intra_op_threads
from aioinfer.devices.cpu.passes.pipeline import compile_passes
from aioinfer.devices.cpu.plugin import CPUPlugin
from aioinfer.model import Model, Port
from aioinfer.plugin import CompiledModel, Executor, Plugin, SyncInferRequest, ThreadExecutor
from aioinfer.plugin.blob import ExportedModel
from aioinfer.plugin.executors import streams_for
from aioinfer.plugin.onnx_payload import onnx_payload, read_onnx_payload
from aioinfer.properties import (
    CACHE_DIR,
    DEVICE_NAME,
    LOADED_FROM_CACHE,
    NETWORK_NAME,
    NUM_CORES,
    NUM_STREAMS,
    OPTIMAL_NUMBER_OF_INFER_REQUESTS,
    OPTIMIZATION_CAPABILITIES,
    PERFORMANCE_HINT,
    SUPPORTED_PROPERTIES,
    declare,
    num_cores,
)
from aioinfer_twostage.request import TwoStageInferRequest


class TwoStagePlugin(Plugin):
    """The ``"TWOSTAGE"`` device."""

    device_name = "TWOSTAGE"
    # The shared declarations of aioinfer.properties this device supports (a property of
    # its own would be one more Property here); parse_config and get_property derive the
    # parsing, the defaults and the errors from them.
    properties = declare(
        PERFORMANCE_HINT,
        NUM_STREAMS,
        CACHE_DIR,  # its models export: the Core keeps them in CACHE_DIR
        LOADED_FROM_CACHE,
        NETWORK_NAME,
        OPTIMAL_NUMBER_OF_INFER_REQUESTS,
        SUPPORTED_PROPERTIES,
        DEVICE_NAME,
        NUM_CORES,
        OPTIMIZATION_CAPABILITIES,
    )
    # Its compiled models export and import (export_payload, import_payload below): the
    # conformance suite (aioinfer.testing) then runs the export tests on it.
    optimization_capabilities = ("EXPORT_IMPORT",)

    def compile_model(self, model: Model, config: Mapping[str, Any]) -> TwoStageCompiledModel:
        # Unknown names and invalid values raise UnknownPropertyError and
        # InvalidPropertyValueError before any work is done.
        parsed = self.parse_config(config)
        # Transforms run on a copy: the user's Model is not changed.
        ir_model = model.ir.clone()
        compile_passes(evaluate_node)(ir_model)
        return TwoStageCompiledModel(self, ir_model, model.inputs, model.outputs, parsed)

    def import_payload(
        self, exported: ExportedModel, config: dict[str, Any]
    ) -> TwoStageCompiledModel:
        # The base class checked the framing (magic, checksum, versions, device: else
        # InvalidBlobError, BlobVersionError or BlobDeviceError) and merged the config.
        # read_onnx_payload refuses a malformed or not self-contained graph. The passes do
        # not run again: the payload holds the transformed graph.
        ir_model = read_onnx_payload(exported.payload)
        return TwoStageCompiledModel(self, ir_model, exported.inputs, exported.outputs, config)

    def query_model(self, model: Model, config: Mapping[str, Any] | None = None) -> dict[str, str]:
        # The compute runs the CPU device's kernels, so the supported nodes are the same.
        return {node: self.device_name for node in CPUPlugin().query_model(model)}


class TwoStageCompiledModel(CompiledModel):
    """A model compiled for ``TWOSTAGE``: the plan, a compute (task) executor and a host
    executor."""

    def __init__(
        self,
        plugin: TwoStagePlugin,
        ir_model: ir.Model,
        inputs: Sequence[Port],
        outputs: Sequence[Port],
        config: dict[str, Any],
    ) -> None:
        # Lowering binds a kernel to every node of the transformed model; the weights are
        # read once here and shared (read-only) by every request.
        self.ir_model = ir_model
        self.plan = lower(ir_model.graph, ir_model.opset_imports)
        self.streams = streams_for(config, num_cores())
        # The CPU kernels split their work between the cores of a stream on threads of
        # their own, with BLAS on one thread: BLAS's own threads busy-wait, and on a
        # loaded machine made the plan many times slower (a process-wide setting, as
        # the CPU device makes it).
        set_intra_op_threads(max(1, num_cores() // self.streams))
        super().__init__(plugin, ir_model.graph.name or "model", inputs, outputs, config)
        # The executors are the device's choice: one compute thread per stream, and one
        # host thread that stages inputs and outputs for all requests of this model.
        # close() releases what add_executor keeps, once no request runs.
        self.task_executor = self.add_executor(
            ThreadExecutor(f"{plugin.device_name}-task", self.streams)
        )
        self.host_executor = self.add_executor(ThreadExecutor(f"{plugin.device_name}-host", 1))

    def create_sync_infer_request(self) -> TwoStageInferRequest:
        return TwoStageInferRequest(self)

    def pipeline(self, request: SyncInferRequest) -> list[tuple[Executor, Any]]:
        """Host staging, compute, then the download back on the host thread."""
        return [
            (self.host_executor, request.infer_preprocess),  # request B stages ...
            (self.task_executor, request.start_pipeline),  # ... while request A computes
            (self.loop_executor, request.wait_pipeline),
            (self.host_executor, request.infer_postprocess),
        ]

    def export_payload(self) -> bytes:
        # The transformed graph, weights included; the base class frames it with the
        # device name, the config and the ports.
        return onnx_payload(self.ir_model)

    def read_only_property(self, name: str) -> Any:
        if name == "OPTIMAL_NUMBER_OF_INFER_REQUESTS":
            # One request per stream computing, plus one on the host stage.
            return self.streams + 1
        return super().read_only_property(name)
