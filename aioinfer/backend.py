"""The ONNX backend API (``onnx.backend.base.Backend``) on top of aioinfer's public API.

ONNX's backend test runner and tools written against that API drive aioinfer like any
other runtime::

    import aioinfer.backend as backend
    rep = backend.prepare(model_proto, "CPU")     # compiled once
    outputs = rep.run([x, y])                       # outputs by position and by name
    outputs = backend.run_node(node_proto, [x, y])  # one node, types taken from the inputs

Each ``BackendRep`` owns one infer request and runs it with the synchronous path
(``infer_sync``), so it must not be called from a running event loop.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
from onnx.backend.base import Backend, BackendRep, namedtupledict

from aioinfer.core import Core
from aioinfer.errors import InvalidModelError, UnknownDeviceError
from aioinfer.plugin.compiled_model import CompiledModel


@functools.lru_cache(maxsize=1)
def _core() -> Core:
    return Core()


def _device_name(device: str) -> str:
    """``"CPU"`` or ``"CPU:0"`` (the backend API's device syntax) -> ``"CPU"``."""
    return device.partition(":")[0]


class AioinferBackendRep(BackendRep):
    """A model compiled for one device, with one infer request to run it repeatedly."""

    def __init__(self, compiled: CompiledModel) -> None:
        self.compiled = compiled
        self._request = compiled.create_infer_request()

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run the model once.

        Args:
            inputs: a list of values for the model's inputs in order (initializers listed
                as graph inputs are weights, not inputs, as in onnxruntime; omitted
                trailing inputs must be optional), a dict by input name, or a single
                array for a one-input model. A value is an ``np.ndarray``, a list of
                arrays for a sequence input, or None for an empty optional.
            kwargs: ignored (the backend API allows runner-specific options).

        Returns:
            The outputs, as a named tuple addressable by position and by output name.

        Raises:
            InputError: (and its subclasses) an input is unknown, missing or has the
                wrong type or shape; the representation stays usable.
            InferenceError: a kernel failed.
        """
        results = self._request.infer_sync(inputs)
        names = [p.name for p in self.compiled.outputs]
        return namedtupledict("Outputs", names)(*[results[n] for n in names])


class AioinferBackend(Backend):
    """``onnx.backend.base.Backend`` for aioinfer (device names as in ``Core``)."""

    @classmethod
    def prepare(
        cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any
    ) -> AioinferBackendRep:
        """Compile ``model`` for ``device``.

        Args:
            model: the model.
            device: an aioinfer device name (``"CPU"``), optionally with the backend
                API's ``":<id>"`` suffix.
            kwargs: ``config`` (a compile config mapping) is passed to
                ``compile_model``; other keywords are ignored (ONNX's runner passes its
                tolerances here).

        Raises:
            UnknownDeviceError: no such device.
            InvalidModelError: the model fails ONNX's checks.
            UnsupportedOperatorError, CompileError: the device cannot run the model.
        """
        name = _device_name(device)
        if not cls.supports_device(device):
            raise UnknownDeviceError(
                f"unknown device {device!r}; available: {', '.join(_core().available_devices)}"
            )
        compiled = _core().compile_model(model, name, kwargs.get("config"))
        return AioinferBackendRep(compiled)

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[Any, ...]:
        """``prepare(model, device, **kwargs).run(inputs)``."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run one node on ``inputs``.

        Args:
            node: the node; its non-empty input names receive ``inputs`` in order.
            inputs: one array per non-empty input (a list of arrays for a sequence).
            device: as for :meth:`prepare`.
            outputs_info: (dtype, shape) per output, used where ONNX's type inference
                cannot tell an output's element type.
            kwargs: ``opset_version`` (default: the newest the onnx package knows).

        Raises:
            InvalidModelError: the node is invalid, or an output's type cannot be known.
            InputError, UnsupportedOperatorError, InferenceError: as for :meth:`prepare`
                and :meth:`AioinferBackendRep.run`.
        """
        model = node_model(node, inputs, kwargs.get("opset_version"), outputs_info)
        return cls.prepare(model, device).run(list(inputs))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """True when ``device`` (``"CPU"``, ``"CPU:0"``) names an aioinfer device."""
        return _device_name(device) in _core().available_devices


def node_model(
    node: onnx.NodeProto,
    inputs: Sequence[Any],
    opset_version: int | None = None,
    outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None,
) -> onnx.ModelProto:
    """A one-node model whose inputs are typed after ``inputs`` and whose outputs are
    typed by ONNX's type inference (or ``outputs_info``).

    Raises:
        InvalidModelError: too many inputs, or an output whose type cannot be known.
    """
    names = [n for n in node.input if n]
    if len(inputs) > len(names):
        raise InvalidModelError(
            f"{node.op_type} node has {len(names)} inputs, {len(inputs)} values were given"
        )
    graph_inputs = [_value_info(name, value) for name, value in zip(names, inputs)]
    outputs = [oh.make_empty_tensor_value_info(n) for n in node.output if n]
    graph = oh.make_graph([node], f"{node.op_type}_node", graph_inputs, outputs)
    version = opset_version or onnx.defs.onnx_opset_version()
    domain = "" if node.domain == "ai.onnx" else node.domain
    opsets = [oh.make_opsetid("", version)]
    if domain:
        opsets.append(oh.make_opsetid(domain, 1))
    model = oh.make_model(graph, opset_imports=opsets)
    inferred = onnx.shape_inference.infer_shapes(model)
    for index, output in enumerate(inferred.graph.output):
        if output.type.WhichOneof("value") is not None and _has_elem_type(output.type):
            continue
        if outputs_info is None or index >= len(outputs_info):
            raise InvalidModelError(
                f"the element type of output {output.name!r} of the {node.op_type} node "
                "cannot be inferred; pass outputs_info"
            )
        dtype, shape = outputs_info[index]
        output.CopyFrom(
            oh.make_tensor_value_info(
                output.name, oh.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape
            )
        )
    return inferred


def _has_elem_type(type_proto: onnx.TypeProto) -> bool:
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        return type_proto.tensor_type.elem_type != 0
    if kind == "sequence_type":
        return _has_elem_type(type_proto.sequence_type.elem_type)
    if kind == "optional_type":
        return _has_elem_type(type_proto.optional_type.elem_type)
    return False


def _value_info(name: str, value: Any) -> onnx.ValueInfoProto:
    if isinstance(value, (list, tuple)):
        if not value:
            raise InvalidModelError(f"input {name!r}: an empty sequence has no element type")
        elem = oh.np_dtype_to_tensor_dtype(np.asarray(value[0]).dtype)
        return oh.make_tensor_sequence_value_info(name, elem, None)
    array = np.asarray(value)
    return oh.make_tensor_value_info(name, oh.np_dtype_to_tensor_dtype(array.dtype), array.shape)


prepare = AioinferBackend.prepare
run_model = AioinferBackend.run_model
run_node = AioinferBackend.run_node
supports_device = AioinferBackend.supports_device
