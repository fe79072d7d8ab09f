"""The small ONNX models the conformance suite runs, their inputs, and the outputs they
must give (computed by onnx's reference implementation, independent of every device).

aioinfer's own tests build on the same models (``tests/helpers.py`` re-exports them), so
one builder serves the suite and the tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
from onnx.reference import ReferenceEvaluator

Dims = Sequence[int | str | None] | None
"""A shape for a value info: ints static, strings symbolic, None unknown; None for any rank."""

OPSET = 18
SIZE = 384
"""The width of :func:`chain_model` by default: a MatMul of a few rows at this width
takes well under 10 ms, so that a long chain is cancelled between kernels."""


def tensor_info(name: str, dtype: type | np.dtype, shape: Dims) -> onnx.ValueInfoProto:
    """A graph input/output declaration with a numpy element type."""
    return oh.make_tensor_value_info(name, oh.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Mapping[str, np.ndarray] | None = None,
    *,
    name: str = "test_model",
    opsets: Mapping[str, int] | None = None,
) -> onnx.ModelProto:
    """A checked model of ``nodes``; ``opsets`` maps domain to version (default ai.onnx 18)."""
    graph = oh.make_graph(
        list(nodes),
        name,
        list(inputs),
        list(outputs),
        initializer=[onh.from_array(a, n) for n, a in (initializers or {}).items()],
    )
    imports = [oh.make_opsetid(d, v) for d, v in (opsets or {"": OPSET}).items()]
    model = oh.make_model(graph, opset_imports=imports)
    onnx.checker.check_model(model)
    return model


def mlp_model(in_features: int = 4, out_features: int = 3, seed: int = 0) -> onnx.ModelProto:
    """``y = relu(x @ w + b)`` and ``z = sum(y, axis=1, keepdims)`` for x of shape [batch, in].

    Graph name ``"mlp"``; input ``x`` float32 ``["batch", in_features]``.
    """
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {
        "w": rng.standard_normal((in_features, out_features)).astype(np.float32),
        "b": rng.standard_normal(out_features).astype(np.float32),
        "axes": np.array([1], np.int64),
    }
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["xw"], name="matmul"),
        oh.make_node("Add", ["xw", "b"], ["pre"], name="add"),
        oh.make_node("Relu", ["pre"], ["y"], name="relu"),
        oh.make_node("ReduceSum", ["y", "axes"], ["z"], name="sum", keepdims=1),
    ]
    return make_model(
        nodes,
        [tensor_info("x", np.float32, ["batch", in_features])],
        [
            tensor_info("y", np.float32, ["batch", out_features]),
            tensor_info("z", np.float32, ["batch", 1]),
        ],
        weights,
        name="mlp",
    )


def two_input_model() -> onnx.ModelProto:
    """``out = (a + b) * cast(scale)``: a, b float32 ``["N", 3]`` share the symbolic N;
    ``scale`` is int64 ``[3]``."""
    nodes = [
        oh.make_node("Add", ["a", "b"], ["ab"], name="add"),
        oh.make_node("Cast", ["scale"], ["scale_f"], name="cast", to=onnx.TensorProto.FLOAT),
        oh.make_node("Mul", ["ab", "scale_f"], ["out"], name="mul"),
    ]
    return make_model(
        nodes,
        [
            tensor_info("a", np.float32, ["N", 3]),
            tensor_info("b", np.float32, ["N", 3]),
            tensor_info("scale", np.int64, [3]),
        ],
        [tensor_info("out", np.float32, ["N", 3])],
        name="two_inputs",
    )


def reshape_model() -> onnx.ModelProto:
    """``y = reshape(x, shape)`` with ``shape`` a run-time input: a bad shape fails in the
    kernel (node ``"reshape_node"``), not in input validation."""
    return make_model(
        [oh.make_node("Reshape", ["x", "shape"], ["y"], name="reshape_node")],
        [tensor_info("x", np.float32, ["n"]), tensor_info("shape", np.int64, [2])],
        [tensor_info("y", np.float32, [None, None])],
        name="reshape",
    )


def scaled_model() -> onnx.ModelProto:
    """``y = x * scale + offset``: ``x`` float32 ``["n", 2]``, ``scale`` a float32 scalar
    (shape ``[]``), ``offset`` float32 ``[2]``: scalars beside arrays."""
    return make_model(
        [
            oh.make_node("Mul", ["x", "scale"], ["scaled"], name="scale_node"),
            oh.make_node("Add", ["scaled", "offset"], ["y"], name="offset_node"),
        ],
        [
            tensor_info("x", np.float32, ["n", 2]),
            tensor_info("scale", np.float32, []),
            tensor_info("offset", np.float32, [2]),
        ],
        [tensor_info("y", np.float32, ["n", 2])],
        name="scaled",
    )


def chain_model(steps: int, width: int = SIZE, seed: int = 0) -> onnx.ModelProto:
    """x -> (MatMul W, Tanh) * steps over ``["n", width]``: a plan of 2*steps small
    kernels, slow enough to cancel or disconnect half-way through."""
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    nodes, last = [], "x"
    for i in range(steps):
        nodes.append(oh.make_node("MatMul", [last, "w"], [f"m{i}"], name=f"matmul{i}"))
        nodes.append(oh.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"tanh{i}"))
        last = f"t{i}"
    nodes.append(oh.make_node("Identity", [last], ["y"]))
    return make_model(
        nodes,
        [tensor_info("x", np.float32, ["n", width])],
        [tensor_info("y", np.float32, ["n", width])],
        {"w": weight},
        name="chain",
    )


def accumulator_model(width: int = 4, rounds: int = 10) -> onnx.ModelProto:
    """``present = past + x`` (int64 ``["n", width]``, exact), reached through ``rounds``
    pairs of adding and subtracting a constant so that the compute is a plan of several
    kernels; ``y`` is ``present`` too. Compiled with ``STATEFUL = {"past": "present"}``
    it is an accumulator: each step adds ``x`` to the request's state."""
    nodes, last = [oh.make_node("Add", ["past", "x"], ["sum0"], name="accumulate")], "sum0"
    for i in range(rounds):
        nodes.append(oh.make_node("Add", [last, "c"], [f"up{i}"], name=f"up{i}"))
        nodes.append(oh.make_node("Sub", [f"up{i}", "c"], [f"sum{i + 1}"], name=f"down{i}"))
        last = f"sum{i + 1}"
    nodes.append(oh.make_node("Identity", [last], ["present"], name="present"))
    nodes.append(oh.make_node("Identity", [last], ["y"], name="y"))
    shape: list[int | str | None] = ["n", width]
    return make_model(
        nodes,
        [tensor_info("x", np.int64, shape), tensor_info("past", np.int64, shape)],
        [tensor_info("y", np.int64, shape), tensor_info("present", np.int64, shape)],
        {"c": np.array(7, np.int64)},
        name="accumulator",
    )


def inputs(seed: int, rows: int = 4, width: int = SIZE) -> np.ndarray:
    """A float32 ``[rows, width]`` input for :func:`chain_model`, random by ``seed``."""
    return np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32)


def expected_outputs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of ``model`` on ``feeds``, in order, by onnx's reference implementation."""
    return list(ReferenceEvaluator(model).run(None, dict(feeds)))


def reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The first output of ``model`` on input ``x`` (:func:`chain_model`'s ``y``) by
    onnx's reference implementation."""
    return expected_outputs(model, {"x": x})[0]


def kv_decoder_model(layers: int = 4, width: int = 64, seed: int = 0) -> onnx.ModelProto:
    """A decoder step with a KV cache of ``2 * layers`` variables: for each layer,
    ``present_key{i} = Concat(past_key{i}, x Wk{i})`` and likewise for the values, along
    the sequence (``x`` float32 ``["batch", 1, width]``, each ``past_*``
    ``["batch", "past_sequence", width]``); the query ``x Wq{i}`` attends over the layer's
    keys and values, and ``y`` (``["batch", 1, width]``) sums the layers.

    ``STATEFUL: auto`` pairs every ``past_*`` with its ``present_*``. A step reads and
    writes the whole cache, so with a long one (a few thousand positions) it lasts long
    enough to be cancelled in the middle on any device."""
    rng = np.random.default_rng(seed)
    node = oh.make_node
    weights: dict[str, np.ndarray] = {}
    nodes: list[onnx.NodeProto] = []
    inputs = [tensor_info("x", np.float32, ["batch", 1, width])]
    outputs = [tensor_info("y", np.float32, ["batch", 1, width])]
    cache: list[int | str | None] = ["batch", "past_sequence", width]
    grown: list[int | str | None] = ["batch", "total_sequence", width]
    contexts = []
    for i in range(layers):
        for name in (f"Wq{i}", f"Wk{i}", f"Wv{i}"):
            weights[name] = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(
                np.float32
            )
        for kind in ("key", "value"):
            new = f"{kind[0]}{i}"
            nodes += [
                node("MatMul", ["x", f"W{kind[0]}{i}"], [new]),
                node("Concat", [f"past_{kind}{i}", new], [f"present_{kind}{i}"], axis=1),
            ]
            inputs.append(tensor_info(f"past_{kind}{i}", np.float32, cache))
            outputs.append(tensor_info(f"present_{kind}{i}", np.float32, grown))
        nodes += [
            node("MatMul", ["x", f"Wq{i}"], [f"q{i}"]),
            node("Transpose", [f"present_key{i}"], [f"kt{i}"], perm=[0, 2, 1]),
            node("MatMul", [f"q{i}", f"kt{i}"], [f"scores{i}"]),
            node("Softmax", [f"scores{i}"], [f"attention{i}"], axis=-1),
            node("MatMul", [f"attention{i}", f"present_value{i}"], [f"context{i}"]),
        ]
        contexts.append(f"context{i}")
    nodes.append(node("Sum", contexts, ["y"]))
    return make_model(nodes, inputs, outputs, weights, name="kv_decoder")
