"""Benchmark models, built reproducibly with onnx.helper (fixed seeds, no downloads)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
from onnx import TensorProto, numpy_helper

OPSET = 17


def _weight(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    values = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
    return numpy_helper.from_array(values.astype(np.float32), name)


def tiny(width: int = 16) -> onnx.ModelProto:
    """One Gemm and a Relu: the per-request overhead dominates."""
    rng = np.random.default_rng(0)
    nodes = [
        oh.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1),
        oh.make_node("Relu", ["h"], ["y"]),
    ]
    inits = [_weight(rng, "w", (width, width)), _weight(rng, "b", (width,))]
    graph = oh.make_graph(
        nodes,
        "tiny",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", OPSET)])


def mlp(width: int = 1024, layers: int = 4) -> onnx.ModelProto:
    """``layers`` Gemm+Relu layers of ``width`` units, dynamic batch."""
    rng = np.random.default_rng(1)
    nodes, inits, last = [], [], "x"
    for i in range(layers):
        inits += [_weight(rng, f"w{i}", (width, width)), _weight(rng, f"b{i}", (width,))]
        nodes.append(oh.make_node("Gemm", [last, f"w{i}", f"b{i}"], [f"g{i}"], transB=1))
        last = f"r{i}" if i < layers - 1 else "y"
        nodes.append(oh.make_node("Relu", [f"g{i}"], [last]))
    graph = oh.make_graph(
        nodes,
        "mlp",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", OPSET)])


def cnn(size: int = 64, channels: tuple[int, ...] = (32, 64, 128)) -> onnx.ModelProto:
    """A small ResNet-style CNN: conv stem, then stride-2 conv + residual 3x3 per stage."""
    rng = np.random.default_rng(2)
    nodes, inits = [], []
    last, width = "x", 3
    for stage, out in enumerate(channels):
        conv = f"s{stage}"
        inits.append(_weight(rng, f"{conv}w", (out, width, 3, 3)))
        inits.append(numpy_helper.from_array(np.zeros(out, np.float32), f"{conv}b"))
        nodes.append(
            oh.make_node(
                "Conv",
                [last, f"{conv}w", f"{conv}b"],
                [f"{conv}c"],
                pads=[1, 1, 1, 1],
                strides=[2, 2],
            )
        )
        nodes.append(oh.make_node("Relu", [f"{conv}c"], [f"{conv}r"]))
        inits.append(_weight(rng, f"{conv}w2", (out, out, 3, 3)))
        nodes.append(
            oh.make_node("Conv", [f"{conv}r", f"{conv}w2"], [f"{conv}c2"], pads=[1, 1, 1, 1])
        )
        nodes.append(oh.make_node("Add", [f"{conv}c2", f"{conv}r"], [f"{conv}a"]))
        nodes.append(oh.make_node("Relu", [f"{conv}a"], [f"{conv}o"]))
        last, width = f"{conv}o", out
    nodes.append(oh.make_node("GlobalAveragePool", [last], ["pool"]))
    nodes.append(oh.make_node("Flatten", ["pool"], ["flat"]))
    inits += [_weight(rng, "fcw", (10, width)), _weight(rng, "fcb", (10,))]
    nodes.append(oh.make_node("Gemm", ["flat", "fcw", "fcb"], ["y"], transB=1))
    graph = oh.make_graph(
        nodes,
        "cnn",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, size, size])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", OPSET)])
