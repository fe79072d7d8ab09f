"""The CPU device: numpy kernels behind the plugin API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from threadpoolctl import threadpool_limits

from aioinfer.devices.cpu import kernels  # noqa: F401  (registers every kernel)
from aioinfer.devices.cpu.compiler import evaluate_node, lower
from aioinfer.devices.cpu.kernels.registry import find_kernel
from aioinfer.devices.cpu.request import CPUInferRequest
from aioinfer.errors import UnsupportedOperatorError
from aioinfer.model import Model
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.plugin.plugin import Plugin
from aioinfer.properties import num_cores, parse_config
from aioinfer.transforms.pipelines import compile_passes


class CPUPlugin(Plugin):
    """The built-in ``"CPU"`` device."""

    device_name = "CPU"
    supported_properties = (
        "PERFORMANCE_HINT",
        "NUM_STREAMS",
        "INFERENCE_NUM_THREADS",
        "NETWORK_NAME",
        "OPTIMAL_NUMBER_OF_INFER_REQUESTS",
        "SUPPORTED_PROPERTIES",
        "DEVICE_NAME",
        "NUM_CORES",
    )

    def compile_model(self, model: Model, config: Mapping[str, Any]) -> CPUCompiledModel:
        return CPUCompiledModel(self, model, parse_config(config, self.supported_properties))

    def query_model(self, model: Model) -> dict[str, str]:
        opsets = model.ir.opset_imports
        supported = {}
        for index, node in enumerate(model.ir.graph):
            try:
                find_kernel(node.domain, node.op_type, opsets.get(node.domain, 1))
            except UnsupportedOperatorError:
                continue
            supported[node.name or f"{node.op_type}_{index}"] = self.device_name
        return supported


class CPUCompiledModel(CompiledModel):
    """A model lowered to a plan of numpy kernels; weights are shared by all requests."""

    def __init__(self, plugin: CPUPlugin, model: Model, config: dict[str, Any]) -> None:
        ir_model = model.ir.clone()
        compile_passes(evaluate_node)(ir_model)
        self.plan = lower(ir_model.graph, ir_model.opset_imports)
        streams = _streams(config)
        self.threads_per_stream = _configure_blas(config, streams)
        super().__init__(plugin, ir_model.graph, model.inputs, model.outputs, config, streams)

    def create_sync_infer_request(self) -> CPUInferRequest:
        return CPUInferRequest(self)

    def read_only_property(self, name: str) -> Any:
        if name == "INFERENCE_NUM_THREADS":
            return self.threads_per_stream * self.streams
        return super().read_only_property(name)


def _configure_blas(config: Mapping[str, Any], streams: int) -> int:
    """Split the compute threads between the streams; return the BLAS threads per stream.

    BLAS thread pools are process-wide, so the most recently compiled model sets them.
    """
    total = int(config["INFERENCE_NUM_THREADS"]) or num_cores()
    per_stream = max(1, total // streams)
    threadpool_limits(limits=per_stream, user_api="blas")
    return per_stream


def _streams(config: Mapping[str, Any]) -> int:
    if config["NUM_STREAMS"] != "AUTO":
        return int(config["NUM_STREAMS"])
    if config["PERFORMANCE_HINT"] == "THROUGHPUT":
        return max(1, num_cores())
    return 1
