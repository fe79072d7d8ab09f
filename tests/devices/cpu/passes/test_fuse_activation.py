"""FuseActivationPass: biases, residual sums and activations go into Conv/Gemm/MatMul."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh
import pytest

from aioinfer.devices.cpu.passes.fuse_activation import FuseActivationPass
from tests.helpers import make_model, tensor_info
from tests.transforms._util import (
    applied,
    assert_close,
    op_types,
    run_compiled,
    run_ir,
    run_reference,
)

RNG = np.random.default_rng(3)


def _attr(model: object, name: str) -> object:
    node = next(iter(model.graph))  # type: ignore[attr-defined]
    return node.attributes[name].value


def test_conv_bias_residual_and_relu_become_one_fused_conv() -> None:
    weights = {
        "w": RNG.standard_normal((4, 4, 3, 3)).astype(np.float32),
        "b": RNG.standard_normal((4, 1, 1)).astype(np.float32),
    }
    nodes = [
        oh.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        oh.make_node("Add", ["c", "b"], ["cb"]),
        oh.make_node("Add", ["cb", "x"], ["s"]),
        oh.make_node("Relu", ["s"], ["y"]),
    ]
    model = make_model(
        nodes,
        [tensor_info("x", np.float32, [1, 4, 5, 5])],
        [tensor_info("y", np.float32, [1, 4, 5, 5])],
        weights,
    )
    after = applied(model, FuseActivationPass())
    assert op_types(after) == ["FusedConv"]
    assert _attr(after, "activation") == "Relu"
    assert len(next(iter(after.graph)).inputs) == 4  # x, W, folded bias, residual
    feeds = {"x": RNG.standard_normal((1, 4, 5, 5)).astype(np.float32)}
    want = run_reference(model, feeds)
    assert_close(run_ir(after, feeds), want)
    assert_close(run_compiled(model, feeds), want)


@pytest.mark.parametrize(
    ("op", "attrs", "extra", "params"),
    [
        ("Relu", {}, {}, []),
        ("LeakyRelu", {"alpha": 0.2}, {}, [0.2]),
        ("LeakyRelu", {"alpha": 1.5}, {}, [1.5]),
        ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, {}, [0.3, 0.4]),
        ("HardSwish", {}, {}, []),
        ("Sigmoid", {}, {}, []),
        ("Tanh", {}, {}, []),
        (
            "Clip",
            {},
            {"lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)},
            [-0.5, 0.7],
        ),
    ],
)
def test_gemm_and_matmul_take_the_activation(
    op: str, attrs: dict[str, float], extra: dict[str, np.ndarray], params: list[float]
) -> None:
    act_inputs = ["g", "lo", "hi"] if op == "Clip" else ["g"]
    for producer, fused in (("Gemm", "FusedGemm"), ("MatMul", "FusedMatMul")):
        nodes = [
            oh.make_node(producer, ["x", "w"], ["g"]),
            oh.make_node(op, act_inputs, ["y"], **attrs),
        ]
        weights = {"w": RNG.standard_normal((6, 4)).astype(np.float32), **extra}
        model = make_model(
            nodes,
            [tensor_info("x", np.float32, [3, 6])],
            [tensor_info("y", np.float32, [3, 4])],
            weights,
        )
        after = applied(model, FuseActivationPass())
        assert op_types(after) == [fused]
        assert _attr(after, "activation") == op
        if params:
            np.testing.assert_allclose(_attr(after, "activation_params"), params, rtol=1e-6)
        feeds = {"x": RNG.standard_normal((3, 6)).astype(np.float32)}
        assert_close(run_ir(after, feeds), run_reference(model, feeds))


@pytest.mark.parametrize("producer", ["Conv", "Gemm"])
def test_mul_by_hard_sigmoid_becomes_a_hard_swish_epilogue(producer: str) -> None:
    """HardSwish as exported before opset 14: ``x * HardSigmoid(x, 1/6, 1/2)``."""
    if producer == "Conv":
        shape, weight = [1, 3, 6, 6], RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
        out_shape, attrs = [1, 4, 6, 6], {"pads": [1, 1, 1, 1]}
    else:
        shape, weight = [5, 6], RNG.standard_normal((6, 4)).astype(np.float32)
        out_shape, attrs = [5, 4], {}
    nodes = [
        oh.make_node(producer, ["x", "w"], ["p"], **attrs),
        oh.make_node("HardSigmoid", ["p"], ["g"], alpha=1 / 6, beta=0.5),
        oh.make_node("Mul", ["p", "g"], ["y"]),
    ]
    model = make_model(
        nodes,
        [tensor_info("x", np.float32, shape)],
        [tensor_info("y", np.float32, out_shape)],
        {"w": weight},
    )
    after = applied(model, FuseActivationPass())
    assert op_types(after) == [f"Fused{producer}"]
    assert _attr(after, "activation") == "HardSwish"
    feeds = {"x": 3 * RNG.standard_normal(shape).astype(np.float32)}
    want = run_reference(model, feeds)
    assert_close(run_ir(after, feeds), want)
    assert_close(run_compiled(model, feeds), want)


def test_mul_by_another_hard_sigmoid_stays() -> None:
    """Other HardSigmoid constants, or a product read elsewhere too, are no HardSwish."""
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["p"]),
        oh.make_node("HardSigmoid", ["p"], ["g"], alpha=0.2, beta=0.5),
        oh.make_node("Mul", ["p", "g"], ["y"]),
        oh.make_node("MatMul", ["x", "w"], ["q"]),
        oh.make_node("HardSigmoid", ["q"], ["h"], alpha=1 / 6, beta=0.5),
        oh.make_node("Mul", ["q", "h"], ["z"]),
    ]
    model = make_model(
        nodes,
        [tensor_info("x", np.float32, [3, 6])],
        [
            tensor_info("y", np.float32, [3, 4]),
            tensor_info("z", np.float32, [3, 4]),
            tensor_info("q", np.float32, [3, 4]),
        ],
        {"w": RNG.standard_normal((6, 4)).astype(np.float32)},
    )
    after = applied(model, FuseActivationPass())
    assert "HardSwish" not in [
        n.attributes["activation"].value for n in after.graph if "activation" in n.attributes
    ]
    assert op_types(after).count("Mul") == 2


def test_activation_of_a_value_read_twice_stays() -> None:
    nodes = [oh.make_node("MatMul", ["x", "w"], ["g"]), oh.make_node("Relu", ["g"], ["y"])]
    model = make_model(
        nodes,
        [tensor_info("x", np.float32, [3, 6])],
        [tensor_info("y", np.float32, [3, 4]), tensor_info("g", np.float32, [3, 4])],
        {"w": RNG.standard_normal((6, 4)).astype(np.float32)},
    )
    assert op_types(applied(model, FuseActivationPass())) == ["MatMul", "Relu"]


def test_fused_kernels_handle_broadcasting_terms_and_vectors() -> None:
    """A bias that grows the product, and a 1-D x 1-D product (a 0-d result)."""
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["m"]),
        oh.make_node("Add", ["m", "b"], ["s"]),
        oh.make_node("Relu", ["s"], ["y"]),
        oh.make_node("MatMul", ["v", "v"], ["d"]),
        oh.make_node("Sigmoid", ["d"], ["z"]),
    ]
    model = make_model(
        nodes,
        [tensor_info("x", np.float32, [3, 6]), tensor_info("v", np.float32, [5])],
        [tensor_info("y", np.float32, [2, 3, 4]), tensor_info("z", np.float32, [])],
        {
            "w": RNG.standard_normal((6, 4)).astype(np.float32),
            "b": RNG.standard_normal((2, 1, 4)).astype(np.float32),
        },
    )
    feeds = {
        "x": RNG.standard_normal((3, 6)).astype(np.float32),
        "v": RNG.standard_normal(5).astype(np.float32) / 3,
    }
    got = run_compiled(model, feeds)
    assert_close(got, run_reference(model, feeds))
    assert got[1].shape == ()


def test_gelu_after_a_batched_conv() -> None:
    """The activation runs on channel blocks of a batch of images (non-contiguous)."""
    nodes = [
        oh.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        oh.make_node("Gelu", ["c"], ["y"]),
    ]
    weights = {
        "w": RNG.standard_normal((8, 3, 3, 3)).astype(np.float32),
        "b": RNG.standard_normal(8).astype(np.float32),
    }
    model = make_model(
        nodes,
        [tensor_info("x", np.float32, [4, 3, 32, 32])],
        [tensor_info("y", np.float32, [4, 8, 32, 32])],
        weights,
        opsets={"": 20},
    )
    assert op_types(applied(model, FuseActivationPass())) == ["FusedConv"]
    feeds = {"x": RNG.standard_normal((4, 3, 32, 32)).astype(np.float32)}
    assert_close(run_compiled(model, feeds), run_reference(model, feeds), rtol=1e-4, atol=1e-5)


def test_two_input_sum_is_a_residual_too() -> None:
    weights = {"w": RNG.standard_normal((4, 4, 1, 1)).astype(np.float32)}
    nodes = [
        oh.make_node("Conv", ["x", "w"], ["c"]),
        oh.make_node("Sum", ["x", "c"], ["s"]),
        oh.make_node("Relu", ["s"], ["y"]),
    ]
    model = make_model(
        nodes,
        [tensor_info("x", np.float32, [1, 4, 3, 3])],
        [tensor_info("y", np.float32, [1, 4, 3, 3])],
        weights,
    )
    after = applied(model, FuseActivationPass())
    assert op_types(after) == ["FusedConv"]
    feeds = {"x": RNG.standard_normal((1, 4, 3, 3)).astype(np.float32)}
    assert_close(run_ir(after, feeds), run_reference(model, feeds))


def _conv_then(
    nodes: list, weights: dict[str, np.ndarray] | None = None, bias: bool = True
) -> object:
    """A 3x3 Conv (``c``, with bias when ``bias``) followed by ``nodes`` ending in ``y``."""
    all_weights = {"w": RNG.standard_normal((6, 3, 3, 3)).astype(np.float32) * 0.5}
    if bias:
        all_weights["b"] = RNG.standard_normal(6).astype(np.float32)
    all_weights.update(weights or {})
    conv = oh.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["c"], pads=[1] * 4)
    return make_model(
        [conv, *nodes],
        [tensor_info("x", np.float32, [2, 3, 7, 6])],
        [tensor_info("y", np.float32, [2, 6, 7, 6])],
        all_weights,
    )


def _fused_agrees(model: object, activation: str) -> None:
    """One FusedConv with ``activation``, equal to onnx.reference (float32: rtol 1e-5,
    atol 1e-5) before and after compiling."""
    after = applied(model, FuseActivationPass())  # type: ignore[arg-type]
    assert op_types(after) == ["FusedConv"]
    assert _attr(after, "activation") == activation
    feeds = {"x": (RNG.standard_normal((2, 3, 7, 6)) * 3).astype(np.float32)}
    want = run_reference(model, feeds)  # type: ignore[arg-type]
    assert_close(run_ir(after, feeds), want, rtol=1e-5, atol=1e-5)
    assert_close(run_compiled(model, feeds), want, rtol=1e-5, atol=1e-5)  # type: ignore[arg-type]


SIX = {"three": np.array([3.0], np.float32), "zero": np.array(0.0, np.float32)}


@pytest.mark.parametrize(
    "nodes",
    [
        # Paddle: x * clip(x + 3, 0, 6) / 6
        [
            oh.make_node("Add", ["c", "three"], ["a"]),
            oh.make_node("Clip", ["a", "zero", "six"], ["k"]),
            oh.make_node("Mul", ["c", "k"], ["m"]),
            oh.make_node("Div", ["m", "six"], ["y"]),
        ],
        # operands swapped, and a multiplication by 1/6
        [
            oh.make_node("Add", ["three", "c"], ["a"]),
            oh.make_node("Clip", ["a", "zero", "six"], ["k"]),
            oh.make_node("Mul", ["k", "c"], ["m"]),
            oh.make_node("Mul", ["sixth", "m"], ["y"]),
        ],
    ],
)
def test_clipped_hard_swish_becomes_a_hard_swish_epilogue(nodes: list) -> None:
    weights = {
        **SIX,
        "six": np.array(6.0, np.float32),
        "sixth": np.array(1 / 6, np.float32),
    }
    _fused_agrees(_conv_then(nodes, weights), "HardSwish")


def test_clipped_hard_swish_with_other_constants_stays() -> None:
    nodes = [
        oh.make_node("Add", ["c", "three"], ["a"]),
        oh.make_node("Clip", ["a", "zero", "six"], ["k"]),
        oh.make_node("Mul", ["c", "k"], ["m"]),
        oh.make_node("Div", ["m", "five"], ["y"]),
    ]
    weights = {**SIX, "six": np.array(6.0, np.float32), "five": np.array(5.0, np.float32)}
    after = applied(_conv_then(nodes, weights), FuseActivationPass())  # type: ignore[arg-type]
    assert op_types(after) == ["Conv", "Add", "Clip", "Mul", "Div"]


@pytest.mark.parametrize("order", [("c", "s"), ("s", "c")])
def test_mul_by_sigmoid_becomes_a_swish_epilogue(order: tuple[str, str]) -> None:
    nodes = [oh.make_node("Sigmoid", ["c"], ["s"]), oh.make_node("Mul", list(order), ["y"])]
    _fused_agrees(_conv_then(nodes), "Swish")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference overflows in exp
def test_swish_of_large_negative_and_positive_values_matches_reference() -> None:
    """The Swish epilogue saturates like x * sigmoid(x): -0 far below, x far above."""
    nodes = [oh.make_node("Sigmoid", ["c"], ["s"]), oh.make_node("Mul", ["c", "s"], ["y"])]
    model = _conv_then(nodes, {"w": np.full((6, 3, 3, 3), 40.0, np.float32)}, bias=False)
    feeds = {"x": np.concatenate([np.full((1, 3, 7, 6), -1.0), np.ones((1, 3, 7, 6))])}
    feeds["x"] = feeds["x"].astype(np.float32)
    assert_close(run_compiled(model, feeds), run_reference(model, feeds), rtol=1e-6, atol=0)


@pytest.mark.parametrize("bias", [False, True])
def test_conv_times_a_scalar_plus_a_scalar_folds_into_weights_and_bias(bias: bool) -> None:
    """PP-OCRv4's learnable affine: Conv, * s, + t, then a decomposed HardSwish."""
    nodes = [
        oh.make_node("Mul", ["scale", "c"], ["cs"]),
        oh.make_node("Add", ["cs", "shift"], ["x1"]),
        oh.make_node("Add", ["x1", "three"], ["a"]),
        oh.make_node("Clip", ["a", "zero", "six"], ["k"]),
        oh.make_node("Mul", ["x1", "k"], ["m"]),
        oh.make_node("Div", ["m", "six"], ["y"]),
    ]
    weights = {
        **SIX,
        "six": np.array(6.0, np.float32),
        "scale": np.array([1.384], np.float32),
        "shift": np.array([0.586], np.float32),
    }
    _fused_agrees(_conv_then(nodes, weights, bias=bias), "HardSwish")


def test_conv_times_a_tensor_stays() -> None:
    nodes = [oh.make_node("Mul", ["c", "scale"], ["y"])]
    weights = {"scale": RNG.standard_normal((1, 6, 1, 1)).astype(np.float32)}
    after = applied(_conv_then(nodes, weights), FuseActivationPass())  # type: ignore[arg-type]
    assert op_types(after) == ["Conv", "Mul"]


@pytest.mark.parametrize("order", [("c2", "floor"), ("floor", "c2")])
def test_max_after_a_leaky_relu_becomes_its_floor(order: tuple[str, str]) -> None:
    """TensorFlow's clipped leaky ReLU (openWakeWord): Conv, LeakyRelu(0.2), then Max
    with a constant of shape [1, 1, 1, 1]: one FusedConv whose LeakyRelu has the floor."""
    nodes = [
        oh.make_node("LeakyRelu", ["c"], ["c2"], alpha=0.2),
        oh.make_node("Max", list(order), ["y"]),
    ]
    model = _conv_then(nodes, {"floor": np.full((1, 1, 1, 1), -0.4, np.float32)})
    _fused_agrees(model, "LeakyRelu")
    after = applied(model, FuseActivationPass())  # type: ignore[arg-type]
    assert list(_attr(after, "activation_params")) == pytest.approx([0.2, -0.4])  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("alpha", "floor"),
    [
        (1.5, np.array(-0.4, np.float32)),  # a slope above 1: max(y, alpha*y) is not it
        (0.2, np.full((1, 6, 1, 1), -0.4, np.float32)),  # a floor per channel
        (0.2, np.full((1, 1, 1, 1, 1), -0.4, np.float32)),  # a Max that adds an axis
    ],
)
def test_max_after_other_leaky_relus_stays(alpha: float, floor: np.ndarray) -> None:
    nodes = [
        oh.make_node("LeakyRelu", ["c"], ["c2"], alpha=alpha),
        oh.make_node("Max", ["c2", "floor"], ["y"]),
    ]
    model = _conv_then(nodes, {"floor": floor})
    if floor.ndim > 4:
        model.graph.output[0].type.tensor_type.shape.ClearField("dim")  # type: ignore[attr-defined]
    after = applied(model, FuseActivationPass())  # type: ignore[arg-type]
    assert op_types(after) == ["FusedConv", "Max"]
    feeds = {"x": (RNG.standard_normal((2, 3, 7, 6)) * 3).astype(np.float32)}
    assert_close(run_compiled(model, feeds), run_reference(model, feeds), rtol=1e-5, atol=1e-5)  # type: ignore[arg-type]
