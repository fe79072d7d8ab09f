"""FuseLayerNormPass: the decomposed LayerNorm of older exports becomes one node."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh

from aioinfer.devices.cpu.passes.fuse_layernorm import FuseLayerNormPass
from tests.helpers import make_model, tensor_info
from tests.transforms._util import (
    applied,
    assert_close,
    op_types,
    run_compiled,
    run_ir,
    run_reference,
)

RNG = np.random.default_rng(5)


def _model(square: str, affine: bool) -> object:
    nodes = [
        oh.make_node("ReduceMean", ["x"], ["mean"], axes=[-1]),
        oh.make_node("Sub", ["x", "mean"], ["d"]),
        oh.make_node("Pow", ["d", "two"], ["sq"])
        if square == "Pow"
        else oh.make_node("Mul", ["d", "d"], ["sq"]),
        oh.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
        oh.make_node("Add", ["var", "eps"], ["ve"]),
        oh.make_node("Sqrt", ["ve"], ["std"]),
        oh.make_node("Div", ["d", "std"], ["n" if affine else "y"]),
    ]
    if affine:
        nodes += [oh.make_node("Mul", ["n", "g"], ["s"]), oh.make_node("Add", ["s", "b"], ["y"])]
    weights = {
        "two": np.array(2.0, np.float32),
        "eps": np.array(1e-5, np.float32),
        "g": RNG.uniform(0.5, 1.5, 8).astype(np.float32),
        "b": RNG.standard_normal(8).astype(np.float32),
    }
    return make_model(
        nodes,
        [tensor_info("x", np.float32, [2, 3, 8])],
        [tensor_info("y", np.float32, [2, 3, 8])],
        weights,
        opsets={"": 13},
    )


def test_decomposed_layernorm_becomes_one_node() -> None:
    for square, affine in (("Pow", True), ("Mul", False)):
        model = _model(square, affine)
        assert len(op_types(model)) == (9 if affine else 7)
        after = applied(model, FuseLayerNormPass())
        assert op_types(after) == ["LayerNormalization"]
        node = next(iter(after.graph))
        assert node.domain == "ai.aioinfer"
        np.testing.assert_allclose(node.attributes["epsilon"].as_float(), 1e-5)
        x = RNG.standard_normal((2, 3, 8)).astype(np.float32) * 3 + 1
        want = run_reference(model, {"x": x})
        assert_close(run_ir(after, {"x": x}), want)
        assert_close(run_compiled(model, {"x": x}), want)


def test_mean_over_another_axis_is_not_layernorm() -> None:
    model = _model("Pow", True)
    model.graph.node[0].attribute[0].ints[:] = [1]
    assert "LayerNormalization" not in op_types(applied(model, FuseLayerNormPass()))
