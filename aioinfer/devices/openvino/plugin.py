"""The OPENVINO device: OpenVINO's runtime behind aioinfer's requests.

``core.compile_model(model, "OPENVINO", config)`` hands the model aioinfer read (and
checked) to OpenVINO's ONNX frontend, compiles it on an OpenVINO device (``CPU`` unless
``OPENVINO_DEVICE`` says otherwise) and wraps the result: each aioinfer request owns one
OpenVINO ``InferRequest``. aioinfer's properties map onto OpenVINO's
(``PERFORMANCE_HINT``, ``NUM_STREAMS``, ``INFERENCE_NUM_THREADS``,
``INFERENCE_PRECISION_HINT``, ``PERF_COUNT``); a config name that aioinfer does not
declare is passed to OpenVINO when it is one of the OpenVINO device's own properties.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import onnx
import onnx_ir as ir

from aioinfer.errors import (
    AioinferError,
    CompileError,
    InvalidBlobError,
    InvalidPropertyValueError,
    ReadOnlyPropertyError,
    UnknownDeviceError,
    UnknownPropertyError,
    UnsupportedOperatorError,
)
from aioinfer.model import Model, takes_strings
from aioinfer.plugin.blob import ExportedModel
from aioinfer.plugin.onnx_payload import read_onnx_payload
from aioinfer.plugin.plugin import Plugin
from aioinfer.plugin.stateful import compile_stateful
from aioinfer.properties import (
    CACHE_DIR,
    COMMON,
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
    STATEFUL,
    SUPPORTED_PROPERTIES,
    Property,
    declare,
    property_name,
)
from aioinfer.transforms.make_stateful import state_shapes, stateful_pairs

from .engine import engine_message, is_property_error, unconverted_operators
from .properties import INFERENCE_PRECISION_HINT, OPENVINO_DEVICE, OPENVINO_INLINE_RUN_US
from .state import make_stateful

if TYPE_CHECKING:
    from aioinfer.plugin.compiled_model import CompiledModel

    from .compiled_model import OpenVINOCompiledModel

MAPPED = (
    "PERFORMANCE_HINT",
    "NUM_STREAMS",
    "INFERENCE_NUM_THREADS",
    "INFERENCE_PRECISION_HINT",
    "PERF_COUNT",
)
"""aioinfer properties that are OpenVINO properties of the same name."""
IMPORTED = MAPPED
"""The mapped properties OpenVINO is given when it imports a compiled model (without
``INFERENCE_PRECISION_HINT`` it would pick its default precision again)."""


class OpenVINOPlugin(Plugin):
    """The ``"OPENVINO"`` device (needs the ``openvino`` package: the ``openvino`` extra)."""

    device_name = "OPENVINO"
    properties = declare(
        PERFORMANCE_HINT,
        NUM_STREAMS,
        INFERENCE_NUM_THREADS,
        INFERENCE_PRECISION_HINT,
        PERF_COUNT,
        OPENVINO_DEVICE,
        OPENVINO_INLINE_RUN_US,
        STATEFUL,
        CACHE_DIR,
        LOADED_FROM_CACHE,
        NETWORK_NAME,
        OPTIMAL_NUMBER_OF_INFER_REQUESTS,
        SUPPORTED_PROPERTIES,
        DEVICE_NAME,
        NUM_CORES,
        OPTIMIZATION_CAPABILITIES,
    )
    handles_state = True  # OpenVINO's own variables (see .state), else the layer above

    def __init__(self) -> None:
        self._ov_core: Any = None
        self._lock = threading.Lock()

    def is_own_name(self, name: str) -> bool:
        """Whether ``name`` is aioinfer's (a shared declaration or one of this device's),
        parsed here, rather than one of OpenVINO's, passed through."""
        return name in COMMON or name in self.properties

    @property
    def ov_core(self) -> Any:
        """The ``openvino.Core`` this plugin compiles with (made on first use).

        Raises:
            CompileError: the ``openvino`` package is not installed.
        """
        with self._lock:
            if self._ov_core is None:
                try:
                    import openvino
                except ImportError:
                    raise CompileError(
                        "the OPENVINO device needs the openvino package: "
                        "pip install 'aioinfer[openvino]'"
                    ) from None
                self._ov_core = openvino.Core()
            return self._ov_core

    def unavailable_reason(self) -> str | None:
        """Why OpenVINO cannot run models here (the package is not installed), or None."""
        try:
            self.ov_core  # noqa: B018 - made on first use
        except CompileError as exc:
            return str(exc)
        return None

    def parse_config(self, config: Mapping[str, Any] | None) -> dict[str, Any]:
        """aioinfer's names parsed (with their defaults), OpenVINO's passed through as
        given once the OpenVINO device (``OPENVINO_DEVICE``) is known to have them.

        Raises:
            UnknownPropertyError: a name neither aioinfer's device nor OpenVINO's knows.
            ReadOnlyPropertyError: a read-only property of either.
            InvalidPropertyValueError: a value aioinfer refuses (OpenVINO checks its own
                when it compiles).
            UnknownDeviceError: ``OPENVINO_DEVICE`` is not a device OpenVINO has here.
        """
        names = {property_name(k): v for k, v in (config or {}).items()}
        parsed = super().parse_config({k: v for k, v in names.items() if self.is_own_name(k)})
        engine = {k: v for k, v in names.items() if not self.is_own_name(k)}
        if engine:
            device = parsed["OPENVINO_DEVICE"]
            ov_properties = self._device_properties(device)
            for name in engine:
                self._check_engine_name(name, device, ov_properties)
        return {**parsed, **engine}

    def compile_model(self, model: Model, config: Mapping[str, Any]) -> CompiledModel:
        """Compile ``model`` with OpenVINO on ``OPENVINO_DEVICE`` (default ``CPU``).

        ``INFERENCE_PRECISION_HINT`` defaults to ``f32``, so that results agree with the
        other devices; ``bf16``/``f16`` are faster where the hardware has them, ``AUTO``
        leaves the choice to OpenVINO. Config names that aioinfer does not declare go to
        OpenVINO when the OpenVINO device has such a property. ``STATEFUL`` pairs become
        OpenVINO's own variables (see :mod:`.state`); where OpenVINO cannot make them,
        the variables are kept above the device (:mod:`aioinfer.plugin.stateful`).

        Raises:
            UnknownPropertyError: a name neither aioinfer's device nor OpenVINO's knows.
            ReadOnlyPropertyError: a read-only property of either.
            InvalidPropertyValueError: a value aioinfer or OpenVINO refuses, a bad
                ``STATEFUL``.
            UnknownDeviceError: ``OPENVINO_DEVICE`` is not a device OpenVINO has here.
            UnsupportedOperatorError: an operator OpenVINO's ONNX frontend cannot convert.
            CompileError: any other reason OpenVINO cannot read or compile the model.
        """
        from .compiled_model import OpenVINOCompiledModel, SourceModel

        parsed = self.parse_config(config)
        strings = [
            p.name for p in (*model.inputs, *model.outputs) if p.element_type == ir.DataType.STRING
        ]
        if strings:
            raise UnsupportedOperatorError(
                f"OPENVINO: the string tensors {', '.join(map(repr, strings))} cannot pass "
                "OpenVINO's Python binding; run the model on CPU"
            )
        pairs = stateful_pairs(model.ir.graph, parsed["STATEFUL"])
        source = SourceModel.of(model, state_shapes(model.ir, list(pairs)) if pairs else {})
        ov_model = self._read(model)
        if pairs:
            try:
                make_stateful(ov_model, pairs, model.name)
                ov_compiled = self._compile(ov_model, model.name, parsed)
            except CompileError:
                # OpenVINO cannot keep these variables: the layer above the device does.
                return compile_stateful(self, model, {**config, "STATEFUL": pairs})
        else:
            ov_compiled = self._compile(ov_model, model.name, parsed)
        return OpenVINOCompiledModel(self, ov_compiled, {**parsed, "STATEFUL": pairs}, source)

    def import_payload(
        self, exported: ExportedModel, config: dict[str, Any]
    ) -> OpenVINOCompiledModel:
        """OpenVINO's ``import_model`` of the payload's blob (what
        :meth:`OpenVINOCompiledModel.export_payload` wrote), on ``OPENVINO_DEVICE``, with
        the run-time properties of ``config`` that OpenVINO takes at import.

        Raises:
            InvalidBlobError: the payload does not parse, OpenVINO refuses its blob, or
                the blob does not fit the header (ports, ``STATEFUL`` pairs).
        """
        from .compiled_model import OpenVINOCompiledModel, read_payload

        source, ov_blob, is_onnx = read_payload(exported)
        pairs = config["STATEFUL"]  # never overridden: it is not mutable
        if not isinstance(pairs, dict):
            raise InvalidBlobError(
                f"the blob's config has STATEFUL {pairs!r}, expected the pairs made when it "
                "was compiled"
            )
        if is_onnx:
            return self._compile_payload(exported, ov_blob, config)
        device = config["OPENVINO_DEVICE"]
        ov_config = {k: v for k, v in self._engine_config(config, device).items() if k in IMPORTED}
        try:
            ov_compiled = self.ov_core.import_model(ov_blob, device, ov_config)
        except RuntimeError as exc:
            raise InvalidBlobError(
                f"OpenVINO cannot import the blob's model on {device}: {engine_message(exc)}"
            ) from None
        try:
            return OpenVINOCompiledModel(self, ov_compiled, config, source)
        except (CompileError, KeyError, ValueError) as exc:
            raise InvalidBlobError(f"the blob's model does not fit its header: {exc}") from None

    def _compile_payload(
        self, exported: ExportedModel, payload: bytes, config: dict[str, Any]
    ) -> OpenVINOCompiledModel:
        """Compile the ONNX model of a payload again (see :mod:`.compiled_model`).

        Raises:
            InvalidBlobError: the model is not self-contained or well-formed, does not
                compile, or its ports or variables differ from the header's.
        """
        from .compiled_model import OpenVINOCompiledModel

        model = Model(read_onnx_payload(payload))
        if (model.inputs, model.outputs) != (exported.inputs, exported.outputs):
            raise InvalidBlobError("the blob's model does not fit its header: its ports differ")
        try:
            compiled = self.compile_model(model, config)
        except AioinferError as exc:
            raise InvalidBlobError(f"the blob's model does not compile: {exc}") from None
        if not isinstance(compiled, OpenVINOCompiledModel):
            raise InvalidBlobError("the blob's model keeps no variables in OpenVINO")
        return compiled

    def get_property(self, name: str) -> Any:
        """The device-level properties; ``OPTIMIZATION_CAPABILITIES`` lists
        ``EXPORT_IMPORT`` (compiled models export, and import without compiling again)."""
        if property_name(name) == "OPTIMIZATION_CAPABILITIES":
            return ("EXPORT_IMPORT",)
        return super().get_property(name)

    def _compile(self, ov_model: Any, model_name: str, parsed: Mapping[str, Any]) -> Any:
        """OpenVINO's compiled model of ``ov_model`` with the parsed config."""
        device = parsed["OPENVINO_DEVICE"]
        ov_config = self._engine_config(parsed, device)
        try:
            return self.ov_core.compile_model(ov_model, device, ov_config)
        except RuntimeError as exc:
            if is_property_error(exc):
                raise InvalidPropertyValueError(
                    f"OpenVINO refused the config {ov_config}: {engine_message(exc)}"
                ) from None
            raise CompileError(
                f"OpenVINO cannot compile model {model_name!r} for {device}: {engine_message(exc)}"
            ) from None

    def _engine_config(self, parsed: Mapping[str, Any], device: str) -> dict[str, Any]:
        """OpenVINO's config: the mapped properties that are not left to OpenVINO, and
        the pass-through ones.

        Raises:
            UnknownPropertyError: a mapped property set to a value of its own that this
                OpenVINO device does not have.
        """
        ov_properties = self._device_properties(device)
        ov_config: dict[str, Any] = {}
        for name in MAPPED:
            value = _engine_value(self.properties[name], parsed[name])
            if value is None:
                continue
            if name in ov_properties:
                ov_config[name] = value
            elif value != self.properties[name].default:
                raise UnknownPropertyError(
                    f"property {name!r} is not supported by OpenVINO's {device} device"
                )
        ov_config.update({k: v for k, v in parsed.items() if not self.is_own_name(k)})
        return ov_config

    def query_model(self, model: Model, config: Mapping[str, Any] | None = None) -> dict[str, str]:
        """The nodes OpenVINO's device (``OPENVINO_DEVICE`` of ``config``, else ``CPU``)
        runs: every node when it runs the whole converted model; else a node whose
        outputs come from operations it runs, or from none (OpenVINO's frontend folded
        or fused the node away); none when OpenVINO's frontend cannot convert the model.
        Nodes that take or give strings are left out (the binding has no string tensors).
        """
        try:
            ov_model = self._read(model)
        except CompileError:
            return {}
        given = {property_name(k): v for k, v in (config or {}).items()}
        device = self.parse_config({"OPENVINO_DEVICE": given.get("OPENVINO_DEVICE", "CPU")})
        supported = self.ov_core.query_model(ov_model, device["OPENVINO_DEVICE"])
        whole = len(supported) >= len(ov_model.get_ops())
        producers = {  # tensor name -> the operation that computes it
            name: op.get_friendly_name()
            for op in ov_model.get_ops()
            if op.get_type_name() != "Result"  # a Result carries its producer's names
            for output in op.outputs()
            for name in output.get_names()
        }
        return {
            node.name or f"{node.op_type}_{index}": self.device_name
            for index, node in enumerate(model.ir.graph)
            if (
                whole
                or all(producers[v.name] in supported for v in node.outputs if v.name in producers)
            )
            and not takes_strings(node)
        }

    # -- helpers --------------------------------------------------------------------------

    def _device_properties(self, device: str) -> dict[str, str]:
        """OpenVINO's properties of ``device``: name -> ``"RW"`` or ``"RO"``."""
        try:
            supported = self.ov_core.get_property(device, "SUPPORTED_PROPERTIES")
        except RuntimeError:
            available = ", ".join(self.ov_core.available_devices)
            raise UnknownDeviceError(
                f"OpenVINO has no device {device!r} here (OPENVINO_DEVICE); available: {available}"
            ) from None
        return {str(k): str(v) for k, v in dict(supported).items()}

    def _check_engine_name(self, name: str, device: str, ov_properties: dict[str, str]) -> None:
        mode = ov_properties.get(name)
        if mode is None:
            ours = ", ".join(sorted(self.supported_properties))
            theirs = ", ".join(sorted(n for n, m in ov_properties.items() if m == "RW"))
            raise UnknownPropertyError(
                f"unknown property {name!r}; supported: {ours}; or one of OpenVINO's "
                f"{device} properties: {theirs}"
            )
        if mode != "RW":
            raise ReadOnlyPropertyError(f"OpenVINO's {device} property {name!r} is read-only")

    def _read(self, model: Model) -> Any:
        """OpenVINO's model of ``model``, read by its ONNX frontend from the ModelProto."""
        proto = ir.serde.serialize_model(model.ir)
        base_dir = _external_data_dir(model.ir.graph)
        if base_dir:
            onnx.external_data_helper.load_external_data_for_model(proto, base_dir)
        try:
            data = proto.SerializeToString()
        except ValueError as exc:  # over protobuf's 2 GiB
            raise CompileError(f"model {model.name!r} is too large for OPENVINO: {exc}") from None
        try:
            return self.ov_core.read_model(data)
        except RuntimeError as exc:
            operators = unconverted_operators(exc)
            if operators is not None:
                raise UnsupportedOperatorError(
                    f"model {model.name!r}: OpenVINO cannot run operator(s) {operators}"
                ) from None
            raise CompileError(
                f"OpenVINO cannot read model {model.name!r}: {engine_message(exc)}"
            ) from None


def _engine_value(declared: Property, value: Any) -> Any:
    """The OpenVINO value of an aioinfer property (None: let OpenVINO decide)."""
    if declared.is_auto(value):
        return None
    if declared.name == "PERF_COUNT":
        return True if value else None
    return value


def _external_data_dir(graph: ir.Graph) -> str:
    """The directory external weights are read from ('' when all are in memory)."""
    for value in graph.initializers.values():
        if isinstance(value.const_value, ir.ExternalTensor):
            return str(value.const_value.base_dir)
    return ""
