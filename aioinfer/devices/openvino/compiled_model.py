"""The OPENVINO device's compiled model: OpenVINO's compiled model, the map from
aioinfer's ports to OpenVINO's, and its export payload.

The payload of an export is what OpenVINO's own ``export_model()`` writes, after a
short JSON part with what aioinfer keeps of the source model that OpenVINO's blob does
not hold (the ONNX nodes' names for error messages, the variables' shapes)::

    JSON length (u32, little endian) | JSON | OpenVINO's blob

OpenVINO 2026.4's export gets recurrent layers wrong: a model with an ONNX ``LSTM``,
``GRU`` or ``RNN`` imports (and loads from OpenVINO's own model cache) with other
results, off by up to 0.8 (measured on an AMD EPYC;
tests/devices/openvino/test_openvino_export.py). For such a model the payload holds the
ONNX model instead (``"format": "onnx"`` in the JSON part, self-contained as the CPU
device's), and importing it compiles it again.
"""

from __future__ import annotations

import dataclasses
import io
import json
import struct
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import onnx_ir as ir

from aioinfer.errors import CompileError, InvalidBlobError, PropertyError
from aioinfer.plugin.compiled_model import CompiledModel, CompilingPlugin
from aioinfer.plugin.executors import AwaitExecutor, Executor
from aioinfer.plugin.onnx_payload import onnx_payload
from aioinfer.plugin.state import split_ports
from aioinfer.properties import check_readable, property_name

from .engine import engine_message, plain
from .inline import InlineRuns
from .queue_engine import OpenVINOQueue
from .request import OpenVINOInferRequest

if TYPE_CHECKING:
    from aioinfer.model import Dim, Model, Port
    from aioinfer.plugin.blob import ExportedModel
    from aioinfer.plugin.sync_request import SyncInferRequest

ENGINE_READ_ONLY = (
    "NUM_STREAMS",
    "INFERENCE_NUM_THREADS",
    "INFERENCE_PRECISION_HINT",
)
"""Properties whose value OpenVINO decided (when the config left them to it)."""

_META_LENGTH = struct.Struct("<I")
RECURRENT = frozenset({"LSTM", "GRU", "RNN"})
"""ONNX operators that OpenVINO's export gets wrong (see the module)."""


class OpenVINOCompiling(CompilingPlugin, Protocol):
    """What the compiled model asks of the plugin that compiled it
    (:class:`~.plugin.OpenVINOPlugin`): a compiled model's questions, and which property
    names are aioinfer's rather than OpenVINO's."""

    def is_own_name(self, name: str) -> bool:
        """Whether ``name`` is aioinfer's property rather than one of OpenVINO's."""


@dataclass(frozen=True)
class SourceModel:
    """What a compiled model keeps of the model it was compiled from."""

    name: str
    inputs: list[Port]
    """The source model's ports, state ports included (what an export records)."""
    outputs: list[Port]
    producers: dict[str, str]
    """Which ONNX node produces each tensor (OpenVINO names nodes by their outputs)."""
    state_shapes: dict[str, list[Dim]]
    """The variables' shapes where the graph sizes a dimension their input leaves
    unknown (see :func:`aioinfer.transforms.make_stateful.state_shapes`)."""
    onnx: ir.Model | None = None
    """The source model itself, kept only when OpenVINO's export cannot be trusted with
    it (see the module): exported as ONNX."""

    @classmethod
    def of(cls, model: Model, state_shapes: dict[str, list[Dim]]) -> SourceModel:
        producers = {
            value.name: node.name or node.op_type
            for node in model.ir.graph
            for value in node.outputs
            if value.name
        }
        recurrent = any(
            node.op_type in RECURRENT and node.domain in ("", "ai.onnx")
            for node in model.ir.graph.all_nodes()
        )
        name = model.ir.graph.name or "model"
        kept = model.ir if recurrent else None
        return cls(name, model.inputs, model.outputs, producers, state_shapes, kept)


def read_payload(exported: ExportedModel) -> tuple[SourceModel, bytes, bool]:
    """The source model, the rest of a payload of
    :meth:`OpenVINOCompiledModel.export_payload`, and whether that is an ONNX model
    (else OpenVINO's blob).

    Raises:
        InvalidBlobError: the JSON part is cut, not JSON, or has fields of other types.
    """
    payload = exported.payload
    if len(payload) < _META_LENGTH.size:
        raise InvalidBlobError(f"truncated OPENVINO payload: {len(payload)} bytes")
    (size,) = _META_LENGTH.unpack_from(payload)
    end = _META_LENGTH.size + size
    if len(payload) < end:
        raise InvalidBlobError(
            f"truncated OPENVINO payload: its JSON part needs {end} bytes, it has {len(payload)}"
        )
    try:
        meta = json.loads(bytes(payload[_META_LENGTH.size : end]))
    except (ValueError, RecursionError) as exc:
        raise InvalidBlobError(f"corrupted OPENVINO payload: its JSON part: {exc}") from None
    fields = {"name": str, "format": str, "producers": dict, "state_shapes": dict}
    if not isinstance(meta, dict) or any(not isinstance(meta.get(k), t) for k, t in fields.items()):
        raise InvalidBlobError(
            f"corrupted OPENVINO payload: expected a JSON object with {sorted(fields)}, got "
            f"{str(meta)[:200]}"
        )
    producers, shapes = meta["producers"], meta["state_shapes"]
    if not all(isinstance(v, str) for v in producers.values()) or not all(
        isinstance(dims, list) and all(d is None or isinstance(d, (int, str)) for d in dims)
        for dims in shapes.values()
    ):
        raise InvalidBlobError("corrupted OPENVINO payload: producers or state shapes malformed")
    if meta["format"] not in ("openvino", "onnx"):
        raise InvalidBlobError(f"OPENVINO payload of unknown format {meta['format']!r}")
    source = SourceModel(meta["name"], exported.inputs, exported.outputs, producers, shapes)
    return source, bytes(payload[end:]), meta["format"] == "onnx"


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
        plugin: OpenVINOCompiling,
        ov_compiled_model: Any,
        config: dict[str, Any],
        source: SourceModel,
    ) -> None:
        """``config``: parsed, ``STATEFUL`` the pairs OpenVINO made variables of."""
        self.ov_compiled_model = ov_compiled_model
        self.source = source
        pairs = config.get("STATEFUL") or {}
        inputs, outputs, variables = split_ports(source.inputs, source.outputs, [*pairs.items()])
        self.variables = [
            dataclasses.replace(v, shape=tuple(source.state_shapes.get(v.name, v.shape)))
            for v in variables
        ]
        """The variables OpenVINO keeps in each request, in pair order."""
        self.ov_input_indices = _indices(ov_compiled_model.inputs, inputs)
        """Per aioinfer input, the index of OpenVINO's input (None: OpenVINO dropped it)."""
        found = _indices(ov_compiled_model.outputs, outputs)
        missing = [port.name for port, index in zip(outputs, found) if index is None]
        if missing:
            raise CompileError(
                f"model {source.name!r}: OpenVINO's compiled model has no output(s) {missing}"
            )
        self.ov_output_indices: list[int] = [i for i in found if i is not None]
        self.producers = source.producers
        self.profiling = bool(config["PERF_COUNT"])
        ours = plugin.supported_properties
        engine = plain(ov_compiled_model.get_property("SUPPORTED_PROPERTIES"))
        self._is_own_name = plugin.is_own_name
        self._supported = (*ours, *(n for n in engine if not self._is_own_name(n)))
        streams = config["NUM_STREAMS"]
        if streams == "AUTO":
            streams = int(ov_compiled_model.get_property("NUM_STREAMS"))
        self.streams = max(1, streams)
        budget = int(config["OPENVINO_INLINE_RUN_US"]) / 1e6 if self.streams == 1 else 0.0
        self.inline_runs = InlineRuns(budget)
        """The last inference times and the inferences in flight (see :mod:`.inline`)."""
        # The weights live in OpenVINO: the graph is not kept.
        super().__init__(plugin, source.name, inputs, outputs, config)
        # OpenVINO runs its own threads: the completion is awaited, no thread of ours waits.
        self.await_executor: Executor = self.add_executor(AwaitExecutor())
        self._queues: weakref.WeakSet[OpenVINOQueue] = weakref.WeakSet()
        """The queue engines of this model, closed with it."""

    def create_sync_infer_request(self) -> OpenVINOInferRequest:
        return OpenVINOInferRequest(self)

    def create_queue_engine(self, jobs: int) -> OpenVINOQueue | None:
        """The OPENVINO queue engine (see :mod:`.queue_engine`); None for a stateful
        model, whose steps commit their state on the loop (the generic queue)."""
        if self.variables:
            return None
        engine = OpenVINOQueue(self, jobs)
        self._queues.add(engine)
        return engine

    async def close(self) -> None:
        """Close the queues run by the OPENVINO engine (cancelling their jobs), then the
        requests, then the executors."""
        for engine in list(self._queues):
            await engine.close()
        await super().close()

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

    def export_payload(self) -> bytes:
        """OpenVINO's own export of the compiled model, after the JSON part (see the
        module)."""
        source = self.source
        text = json.dumps(
            {
                "name": source.name,
                "format": "openvino" if source.onnx is None else "onnx",
                "producers": source.producers,
                "state_shapes": source.state_shapes,
            }
        ).encode()
        if source.onnx is not None:
            return _META_LENGTH.pack(len(text)) + text + onnx_payload(source.onnx.clone())
        stream = io.BytesIO()
        self.ov_compiled_model.export_model(stream)
        return _META_LENGTH.pack(len(text)) + text + stream.getvalue()

    def source_ports(self) -> tuple[list[Port], list[Port]]:
        """The ports of the model before its state ports became variables."""
        return self.source.inputs, self.source.outputs

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
