"""The OPENVINO device's compiled model: OpenVINO's compiled model and the map from
aioinfer's ports to OpenVINO's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aioinfer.errors import CompileError, PropertyError
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.plugin.executors import AwaitExecutor, Executor
from aioinfer.properties import check_readable, property_name

from .engine import engine_message, plain
from .request import OpenVINOInferRequest

if TYPE_CHECKING:
    from aioinfer.model import Model, Port
    from aioinfer.plugin.sync_request import SyncInferRequest

    from .plugin import OpenVINOPlugin

ENGINE_READ_ONLY = (
    "NUM_STREAMS",
    "INFERENCE_NUM_THREADS",
    "INFERENCE_PRECISION_HINT",
)
"""Properties whose value OpenVINO decided (when the config left them to it)."""


class OpenVINOCompiledModel(CompiledModel):
    """A model compiled by OpenVINO; each infer request owns an OpenVINO request.

    Properties given in the config read back as given; those left to the device
    (``NUM_STREAMS`` 'AUTO', ``INFERENCE_NUM_THREADS`` 0, ``INFERENCE_PRECISION_HINT``
    'AUTO') and ``OPTIMAL_NUMBER_OF_INFER_REQUESTS`` read back what OpenVINO decided
    (OpenVINO caps its streams at the cores: an explicit ``NUM_STREAMS`` above that reads
    back as given, and ``OPTIMAL_NUMBER_OF_INFER_REQUESTS`` is at least that many). The
    OpenVINO device's own properties (``ENABLE_CPU_PINNING``, ...) are readable too.

    Attributes:
        ov_compiled_model: OpenVINO's ``CompiledModel``.
    """

    def __init__(
        self,
        plugin: OpenVINOPlugin,
        model: Model,
        ov_compiled_model: Any,
        config: dict[str, Any],
    ) -> None:
        self.ov_compiled_model = ov_compiled_model
        self.ov_input_indices = _indices(ov_compiled_model.inputs, model.inputs)
        """Per aioinfer input, the index of OpenVINO's input (None: OpenVINO dropped it)."""
        outputs = _indices(ov_compiled_model.outputs, model.outputs)
        missing = [port.name for port, index in zip(model.outputs, outputs) if index is None]
        if missing:
            raise CompileError(
                f"model {model.name!r}: OpenVINO's compiled model has no output(s) {missing}"
            )
        self.ov_output_indices: list[int] = [i for i in outputs if i is not None]
        self.producers = {
            value.name: node.name or node.op_type
            for node in model.ir.graph
            for value in node.outputs
            if value.name
        }
        """Which ONNX node produces each tensor (OpenVINO names nodes by their outputs)."""
        self.profiling = bool(config["PERF_COUNT"])
        ours = plugin.supported_properties
        engine = plain(ov_compiled_model.get_property("SUPPORTED_PROPERTIES"))
        self._is_own_name = plugin.is_own_name
        self._supported = (*ours, *(n for n in engine if not self._is_own_name(n)))
        streams = config["NUM_STREAMS"]
        if streams == "AUTO":
            streams = int(ov_compiled_model.get_property("NUM_STREAMS"))
        self.streams = max(1, streams)
        # The weights live in OpenVINO: the graph is not kept.
        super().__init__(
            plugin, model.ir.graph.name or "model", model.inputs, model.outputs, config
        )
        # OpenVINO runs its own threads: the completion is awaited, no thread of ours waits.
        self.await_executor: Executor = self.add_executor(AwaitExecutor())

    def create_sync_infer_request(self) -> OpenVINOInferRequest:
        return OpenVINOInferRequest(self)

    def pipeline(self, request: SyncInferRequest) -> list[tuple[Executor, Any]]:
        """Everything on the event loop: check and set the inputs, start OpenVINO's
        request, await its completion (no thread waits), copy the outputs."""
        assert isinstance(request, OpenVINOInferRequest)
        return [
            (self.loop_executor, request.infer_preprocess),
            (self.loop_executor, request.start_on_loop),
            (self.await_executor, request.wait_async),
            (self.loop_executor, request.infer_postprocess),
        ]

    def supported_properties(self) -> tuple[str, ...]:
        """aioinfer's properties of this device, then OpenVINO's other ones."""
        return self._supported

    def get_property(self, name: str) -> Any:
        """Read a property: aioinfer's (see the class), or one of OpenVINO's compiled
        model.

        Raises:
            UnknownPropertyError: neither aioinfer's device nor OpenVINO has it.
            PropertyError: OpenVINO could not read it.
        """
        name = property_name(name)
        if self._is_own_name(name):
            return super().get_property(name)
        check_readable(name, self.supported_properties())
        return self._engine_property(name)

    def read_only_property(self, name: str) -> Any:
        if name == "OPTIMAL_NUMBER_OF_INFER_REQUESTS":
            # OpenVINO caps its streams at the cores; an explicit NUM_STREAMS above that
            # still gets a request per stream (the extra ones wait inside OpenVINO).
            return max(self.streams, self._engine_property(name))
        if name in ENGINE_READ_ONLY:
            return self._engine_property(name)
        return super().read_only_property(name)

    def _engine_property(self, name: str) -> Any:
        try:
            return plain(self.ov_compiled_model.get_property(name))
        except RuntimeError as exc:
            raise PropertyError(f"OpenVINO cannot read {name!r}: {engine_message(exc)}") from None


def _indices(ov_ports: Any, ports: list[Port]) -> list[int | None]:
    """For each of ``ports``, the index of the OpenVINO port of that name (or None)."""
    by_name: dict[str, int] = {}
    for index, ov_port in enumerate(ov_ports):
        for name in ov_port.get_names():
            by_name.setdefault(name, index)
    return [by_name.get(port.name) for port in ports]
