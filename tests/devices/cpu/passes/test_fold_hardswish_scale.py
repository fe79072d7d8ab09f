"""FoldHardSwishScalePass: a fused HardSwish read only by convolutions leaves its 1/6 to
their weights. Checked against onnx.reference (rtol 1e-4: the weights divided by 6 and
the products with six times the activation round differently in float32)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

from aioinfer.devices.cpu.passes.fold_hardswish_scale import FoldHardSwishScalePass
from aioinfer.devices.cpu.passes.fuse_activation import FuseActivationPass
from tests.helpers import make_model, tensor_info
from tests.transforms._util import applied, assert_close, run_compiled, run_ir, run_reference

RNG = np.random.default_rng(11)
SHAPE = [2, 4, 9, 8]


def _weights(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.5).astype(np.float32)


def _model(
    readers: list[onnx.NodeProto], outputs: list[str], **extra: np.ndarray
) -> onnx.ModelProto:
    """``h = HardSwish(Conv(x, w0, b0))`` (exported as Paddle does, with the BN folded)
    read by ``readers``."""
    weights = {"w0": _weights(4, 4, 3, 3), "b0": _weights(4), **extra}
    nodes = [
        oh.make_node("Conv", ["x", "w0", "b0"], ["c"], pads=[1] * 4),
        oh.make_node("HardSwish", ["c"], ["h"]),
        *readers,
    ]
    return make_model(
        nodes,
        [tensor_info("x", np.float32, SHAPE)],
        [tensor_info(name, np.float32, [None] * 4) for name in outputs],
        weights,
    )


def _hard_swishes(model: ir.Model) -> list[ir.Node]:
    fused = [n for n in model.graph if n.op_type == "FusedConv"]
    return [n for n in fused if n.attributes.get_string("activation", "") == "HardSwish"]


def _check(model: onnx.ModelProto, folded: bool) -> ir.Model:
    after = applied(model, FuseActivationPass(), FoldHardSwishScalePass())
    params = [n.attributes.get("activation_params") for n in _hard_swishes(after)]
    assert [p is not None and list(p.as_floats()) == [6.0] for p in params] == [folded]
    feeds = {"x": RNG.standard_normal(SHAPE).astype(np.float32)}
    want = run_reference(model, feeds)
    assert_close(run_ir(after, feeds), want, rtol=1e-4, atol=1e-5)
    assert_close(run_compiled(model, feeds), want, rtol=1e-4, atol=1e-5)
    return after


def test_depthwise_and_pointwise_readers_take_the_sixth() -> None:
    """Two convolutions read the HardSwish (a depthwise 3x3 and a 1x1 with a bias, one
    of them a FusedConv by then): both get their weights divided by 6."""
    readers = [
        oh.make_node("Conv", ["h", "wd"], ["d"], group=4, pads=[1] * 4),
        oh.make_node("Conv", ["h", "wp", "bp"], ["p"]),
        oh.make_node("Relu", ["p"], ["r"]),
    ]
    model = _model(
        readers, ["d", "r"], wd=_weights(4, 1, 3, 3), wp=_weights(6, 4, 1, 1), bp=_weights(6)
    )
    after = _check(model, folded=True)
    initial = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in after.graph:
        if node.op_type in ("Conv", "FusedConv") and node.inputs[0].name == "h":
            original = initial[node.inputs[1].name.removesuffix("_sixth")]
            np.testing.assert_allclose(node.inputs[1].const_value.numpy(), original / 6, rtol=1e-7)


def test_shared_weights_of_another_convolution_stay() -> None:
    """The reader's weights are also another convolution's (of x): that one keeps them."""
    readers = [
        oh.make_node("Conv", ["h", "ws"], ["a"], pads=[1] * 4),
        oh.make_node("Conv", ["x", "ws"], ["b"], pads=[1] * 4),
    ]
    _check(_model(readers, ["a", "b"], ws=_weights(4, 4, 3, 3)), folded=True)


@pytest.mark.parametrize("case", ["other-reader", "graph-output", "weights-computed", "residual"])
def test_not_folded_when_a_reader_is_not_a_convolution_of_it(case: str) -> None:
    """The HardSwish stays as it is when anything but a convolution's input X with
    constant weights reads it: another operator, the graph's output, a convolution whose
    weights are not constant or that also adds it as its residual."""
    conv = oh.make_node("Conv", ["h", "wp"], ["p"])
    extra = {"wp": _weights(4, 4, 1, 1)}
    if case == "other-reader":
        model = _model([conv, oh.make_node("Sigmoid", ["h"], ["s"])], ["p", "s"], **extra)
    elif case == "graph-output":
        model = _model([conv], ["p", "h"], **extra)
    elif case == "weights-computed":
        computed = oh.make_node("Add", ["x", "x"], ["xx"])
        product = oh.make_node("Conv", ["h", "wx"], ["p"], pads=[3, 4, 3, 4])
        readers = [computed, oh.make_node("Slice", ["xx", "s0", "s1", "s2"], ["wx"]), product]
        slices = {
            "s0": np.array([0, 0], np.int64),
            "s1": np.array([1, 4], np.int64),
            "s2": np.array([0, 1], np.int64),
        }
        model = _model(readers, ["p"], **slices)
    else:
        model = _model([conv, oh.make_node("Add", ["p", "h"], ["z"])], ["z"], **extra)
    _check(model, folded=False)
