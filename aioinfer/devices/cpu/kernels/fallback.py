"""Fallback kernels: the long tail of operators runs the onnx package's reference
implementation of that single operator.

:data:`FALLBACK_OPERATORS` lists them; each is registered through the same registry as
the native kernels, with ``execution_type="fallback"`` (the plan's steps keep it, so
profiling shows which nodes took the slow path). Should a native kernel be registered
for one of them, it wins for the versions it covers (see
:func:`~aioinfer.devices.cpu.kernels.registry.kernel`).

At compile time the node is rebuilt as a one-node ONNX model (attributes typed from the
operator's schema); the reference evaluator for it is created on the first run and
cached per pattern of omitted optional inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel

ML = "ai.onnx.ml"
TRAINING = "ai.onnx.preview.training"
PREVIEW = "ai.onnx.preview"

FALLBACK_OPERATORS: tuple[tuple[str, str], ...] = (
    # signal processing
    ("", "MelWeightMatrix"),
    # image and geometry
    ("", "CenterCropPad"),
    ("", "Col2Im"),
    ("", "DeformConv"),
    ("", "ImageDecoder"),
    ("", "MaxRoiPool"),
    ("", "MaxUnpool"),
    ("", "RoiAlign"),
    # linear algebra and attention variants
    ("", "CausalConvWithState"),
    ("", "Det"),
    ("", "LinearAttention"),
    ("", "TensorScatter"),
    (PREVIEW, "FlexAttention"),
    # text
    ("", "RegexFullMatch"),
    ("", "StringConcat"),
    ("", "StringNormalizer"),
    ("", "StringSplit"),
    ("", "TfIdfVectorizer"),
    # traditional ML (ai.onnx.ml)
    (ML, "ArrayFeatureExtractor"),
    (ML, "Binarizer"),
    (ML, "DictVectorizer"),
    (ML, "FeatureVectorizer"),
    (ML, "Imputer"),
    (ML, "LabelEncoder"),
    (ML, "LinearClassifier"),
    (ML, "LinearRegressor"),
    (ML, "Normalizer"),
    (ML, "OneHotEncoder"),
    (ML, "SVMClassifier"),
    (ML, "SVMRegressor"),
    (ML, "Scaler"),
    (ML, "TreeEnsemble"),
    (ML, "TreeEnsembleClassifier"),
    (ML, "TreeEnsembleRegressor"),
    # training
    (TRAINING, "Adagrad"),
    (TRAINING, "Adam"),
    (TRAINING, "Momentum"),
)
"""(domain, operator) pairs that run through the reference implementation."""


def _first_versions() -> dict[tuple[str, str], int]:
    first: dict[tuple[str, str], int] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        key = (schema.domain, schema.name)
        first[key] = min(first.get(key, schema.since_version), schema.since_version)
    return first


def _attribute(name: str, value: Any, kind: Any) -> onnx.AttributeProto:
    """An attribute proto from the value a kernel factory sees, typed by the schema."""
    if isinstance(value, np.ndarray):
        # String tensors come as bytes; numpy_helper wants object arrays of them.
        value = numpy_helper.from_array(value.astype(object) if value.dtype.kind == "S" else value)
    elif isinstance(value, list) and value and isinstance(value[0], np.ndarray):
        value = [numpy_helper.from_array(v) for v in value]
    elif isinstance(value, ir.Graph):
        value = ir.serde.serialize_graph(value)
    return oh.make_attribute(name, value, attr_type=kind)


def _node_proto(spec: NodeSpec, present: Sequence[bool]) -> onnx.NodeProto:
    schema = onnx.defs.get_schema(spec.op_type, spec.opset, spec.domain)
    unknown = sorted(set(spec.attrs) - set(schema.attributes))
    if unknown:
        raise ValueError(
            f"{spec.op_type} version {schema.since_version} has no attribute(s) "
            f"{', '.join(unknown)}; it has {', '.join(sorted(schema.attributes)) or 'none'}"
        )
    attributes = [
        _attribute(name, value, schema.attributes[name].type) for name, value in spec.attrs.items()
    ]
    node = oh.make_node(
        spec.op_type,
        [f"input{i}" if p else "" for i, p in enumerate(present)],
        [f"output{i}" for i in range(spec.num_outputs)],
        domain=spec.domain,
    )
    node.attribute.extend(attributes)
    return node


def _evaluator(spec: NodeSpec, present: tuple[bool, ...]) -> ReferenceEvaluator:
    node = _node_proto(spec, present)
    graph = oh.make_graph(
        [node],
        f"{spec.op_type}_fallback",
        [oh.make_empty_tensor_value_info(n) for n in node.input if n],
        [oh.make_empty_tensor_value_info(n) for n in node.output],
    )
    opsets = [oh.make_opsetid(spec.domain, spec.opset)]
    if spec.domain:
        opsets.append(oh.make_opsetid("", onnx.defs.onnx_opset_version()))
    return ReferenceEvaluator(oh.make_model(graph, opset_imports=opsets))


def _reference_kernel(spec: NodeSpec) -> Kernel:
    # Fails at compile time (not at the first run) on attributes the schema rejects.
    _node_proto(spec, (True,) * spec.num_inputs)
    evaluators: dict[tuple[bool, ...], ReferenceEvaluator] = {}

    def run(*inputs: Any) -> Sequence[Any]:
        present = tuple(x is not None for x in inputs)
        evaluator = evaluators.get(present)
        if evaluator is None:
            evaluator = evaluators[present] = _evaluator(spec, present)
        feeds = {f"input{i}": x for i, x in enumerate(inputs) if x is not None}
        return [_as_array(out) for out in evaluator.run(None, feeds)]

    return run


def _as_array(value: Any) -> Any:
    """Reference outputs as plan values: numpy scalars become 0-d arrays."""
    if value is None or isinstance(value, (list, np.ndarray)):
        return value
    return np.asarray(value)


def _register_fallbacks() -> None:
    first = _first_versions()
    for domain, op_type in FALLBACK_OPERATORS:
        kernel(op_type, since=first[(domain, op_type)], domain=domain, execution_type="fallback")(
            _reference_kernel
        )


_register_fallbacks()
