"""FuseAttentionPass: MatMul, scale, mask Add, Softmax, MatMul become one Attention node."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh

from aioinfer.devices.cpu.passes.fuse_attention import FuseAttentionPass
from tests.helpers import make_model, tensor_info
from tests.transforms._util import (
    applied,
    assert_close,
    op_types,
    run_compiled,
    run_ir,
    run_reference,
)

RNG = np.random.default_rng(7)
SHAPE = [2, 3, 5, 4]  # batch, heads, sequence, head size


def _model(scale_op: str | None, masked: bool) -> object:
    nodes = [oh.make_node("MatMul", ["q", "kt"], ["scores"])]
    last = "scores"
    if scale_op is not None:
        nodes.append(oh.make_node(scale_op, [last, "c"], ["scaled"]))
        last = "scaled"
    if masked:
        nodes.append(oh.make_node("Add", ["mask", last], ["masked"]))
        last = "masked"
    nodes += [
        oh.make_node("Softmax", [last], ["p"], axis=-1),
        oh.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    inputs = [
        tensor_info("q", np.float32, SHAPE),
        tensor_info("kt", np.float32, [2, 3, 4, 5]),
        tensor_info("v", np.float32, SHAPE),
    ]
    if masked:
        inputs.append(tensor_info("mask", np.float32, [2, 1, 1, 5]))
    return make_model(
        nodes, inputs, [tensor_info("y", np.float32, SHAPE)], {"c": np.array(2.0, np.float32)}
    )


def _feeds(masked: bool) -> dict[str, np.ndarray]:
    feeds = {
        "q": RNG.standard_normal(SHAPE).astype(np.float32),
        "kt": RNG.standard_normal((2, 3, 4, 5)).astype(np.float32),
        "v": RNG.standard_normal(SHAPE).astype(np.float32),
    }
    if masked:
        feeds["mask"] = np.where(RNG.random((2, 1, 1, 5)) < 0.3, -10000.0, 0.0).astype(np.float32)
    return feeds


def test_attention_patterns_become_one_node() -> None:
    for scale_op, masked, scale in (("Div", True, 0.5), ("Mul", False, 2.0), (None, True, 1.0)):
        model = _model(scale_op, masked)
        after = applied(model, FuseAttentionPass())
        assert op_types(after) == ["Attention"]
        node = next(iter(after.graph))
        assert node.attributes["scale"].as_float() == scale
        assert len(node.inputs) == (4 if masked else 3)
        feeds = _feeds(masked)
        want = run_reference(model, feeds)
        assert_close(run_ir(after, feeds), want)
        assert_close(run_compiled(model, feeds), want)


def test_softmax_over_another_axis_is_not_attention() -> None:
    model = _model("Div", True)
    model.graph.node[3].attribute[0].i = 2
    assert "Attention" not in op_types(applied(model, FuseAttentionPass()))
