"""Activation kernels and Clip against onnx.reference."""

from __future__ import annotations

import warnings

import numpy as np
import onnx.helper as oh
import pytest

import aioinfer.devices.cpu.kernels.activations  # noqa: F401  (registers the kernels)
from tests.kernels._check import check_node, run_aioinfer
from tests.kernels.test_elementwise import FLOATS, random, run_with_consts, tol

# op, attributes, opsets (an old one and the newest)
ACTIVATIONS = [
    ("Relu", {}, [6, 14]),
    ("LeakyRelu", {}, [6, 16]),
    ("LeakyRelu", {"alpha": 0.2}, [6, 16]),
    ("LeakyRelu", {"alpha": 1.5}, [16]),
    ("LeakyRelu", {"alpha": -0.5}, [16]),
    ("Elu", {}, [6, 22]),
    ("Elu", {"alpha": 0.5}, [6, 22]),
    ("Selu", {}, [6, 22]),
    ("Selu", {"alpha": 2.0, "gamma": 0.5}, [6, 22]),
    ("Celu", {}, [12]),
    ("Celu", {"alpha": 2.0}, [12]),
    ("Sigmoid", {}, [6, 13]),
    ("HardSigmoid", {}, [6, 22]),
    ("HardSigmoid", {"alpha": 0.5, "beta": 0.1}, [6, 22]),
    ("HardSwish", {}, [14, 22]),
    ("Tanh", {}, [6, 13]),
    ("Softplus", {}, [1, 22]),
    ("Softsign", {}, [1, 22]),
    ("ThresholdedRelu", {}, [10, 22]),
    ("ThresholdedRelu", {"alpha": 0.3}, [10, 22]),
    ("Mish", {}, [18, 22]),
    ("Gelu", {}, [20]),
    ("Gelu", {"approximate": "none"}, [20]),
    ("Gelu", {"approximate": "tanh"}, [20]),
    ("Shrink", {}, [9]),
    ("Shrink", {"bias": 0.5, "lambd": 1.0}, [9]),
]
CASES = [(op, attrs, opset) for op, attrs, opsets in ACTIVATIONS for opset in opsets]
SHAPES = [(7,), (2, 3, 4), (2, 3, 1, 4, 5), (0, 4), ()]


@pytest.mark.parametrize(("op", "attrs", "opset"), CASES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_activation(op: str, attrs: dict, opset: int, dtype: type, shape: tuple) -> None:
    rng = np.random.default_rng(30)
    x = random(rng, shape, dtype, -6, 6)
    node = oh.make_node(op, ["x"], ["y"], **attrs)
    if op == "Softsign" and shape == ():
        # onnx.reference's Softsign writes into a 0-d ufunc result and fails.
        (got,) = run_aioinfer(node, [x], opset)
        assert got.dtype == dtype and got.shape == ()
        np.testing.assert_allclose(got, x / (1 + abs(x)), **tol(dtype))
        return
    check_node(node, [x], opset=opset, **tol(dtype))


@pytest.mark.parametrize(("op", "attrs", "opset"), CASES)
def test_activation_extremes_without_warnings(op: str, attrs: dict, opset: int) -> None:
    x = np.float32([-1e4, -100, -88.8, -20, -1e-8, 0, 1e-8, 20, 88.8, 100, 1e4])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (got,) = run_aioinfer(oh.make_node(op, ["x"], ["y"], **attrs), [x], opset)
    assert got.dtype == np.float32
    assert np.isfinite(got).all()


@pytest.mark.parametrize("op", ["Sigmoid", "Softplus"])
def test_stable_at_large_magnitudes(op: str) -> None:
    x = np.float64([-800, -30, 30, 800])
    (got,) = run_aioinfer(oh.make_node(op, ["x"], ["y"]), [x], 13)
    if op == "Sigmoid":
        want = [0.0, np.exp(-30) / (1 + np.exp(-30)), 1 / (1 + np.exp(-30)), 1.0]
    else:
        want = [0.0, np.log1p(np.exp(-30)), 30 + np.log1p(np.exp(-30)), 800.0]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def test_nan_propagates() -> None:
    x = np.float32([np.nan, 1.0])
    for op in ["Relu", "LeakyRelu", "Elu", "Sigmoid", "Softplus", "Tanh", "Gelu"]:
        (got,) = run_aioinfer(oh.make_node(op, ["x"], ["y"]), [x], 20)
        assert np.isnan(got[0]), op


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_relu_integers(dtype: type) -> None:
    x = np.array([-3, 0, 5, -128 if dtype == np.int8 else -1000], dtype)
    check_node(oh.make_node("Relu", ["x"], ["y"]), [x], opset=14)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_shrink_integers(dtype: type) -> None:
    x = np.array([0, 1, 2, 5, 9] + ([-4, -1] if np.dtype(dtype).kind == "i" else []), dtype)
    node = oh.make_node("Shrink", ["x"], ["y"], bias=1.5, lambd=1.5)
    check_node(node, [x], opset=9)


# -- PRelu ------------------------------------------------------------------------------------

PRELU_SHAPES = [
    ((2, 3, 4, 5), (1,)),
    ((2, 3, 4, 5), (3, 1, 1)),
    ((2, 3, 4, 5), (5,)),
    ((2, 3, 4, 5), (2, 3, 4, 5)),
    ((2, 3), (3,)),
    ((2, 3, 4, 5, 6), (3, 1, 1, 1)),
    ((7,), (7,)),
    ((0, 3), (3,)),
]


@pytest.mark.parametrize(("x_shape", "slope_shape"), PRELU_SHAPES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("opset", [7, 9, 16])
def test_prelu(x_shape: tuple, slope_shape: tuple, dtype: type, opset: int) -> None:
    rng = np.random.default_rng(31)
    x, slope = random(rng, x_shape, dtype), random(rng, slope_shape, dtype, 0, 1)
    check_node(oh.make_node("PRelu", ["x", "s"], ["y"]), [x, slope], opset=opset, **tol(dtype))


@pytest.mark.parametrize("opset", [6, 7, 16])
def test_prelu_channel_slope_as_from_pytorch(opset: int) -> None:
    # slope [C] against NCHW data: numpy would pair it with W; it belongs to C.
    rng = np.random.default_rng(32)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    slope = np.float32([0.1, 0.2, 0.3])
    (got,) = check_node(oh.make_node("PRelu", ["x", "s"], ["y"]), [x, slope], opset=opset)
    np.testing.assert_allclose(got, np.where(x > 0, x, x * slope[:, None, None]), rtol=1e-6)


def test_prelu_channel_slope_prefers_axis_one_when_ambiguous() -> None:
    # C equals H too; the reference gives up here, PyTorch's convention is axis 1.
    x = np.random.default_rng(33).standard_normal((2, 3, 3, 5)).astype(np.float32)
    slope = np.float32([0.1, 0.2, 0.3])
    (got,) = run_aioinfer(oh.make_node("PRelu", ["x", "s"], ["y"]), [x, slope], 9)
    np.testing.assert_allclose(got, np.where(x > 0, x, x * slope[:, None, None]), rtol=1e-6)


def test_prelu_slope_on_a_later_axis() -> None:
    x = np.random.default_rng(34).standard_normal((2, 3, 6, 5)).astype(np.float32)
    slope = np.linspace(0.1, 0.6, 6, dtype=np.float32)
    (got,) = check_node(oh.make_node("PRelu", ["x", "s"], ["y"]), [x, slope], opset=9)
    np.testing.assert_allclose(got, np.where(x > 0, x, x * slope[:, None]), rtol=1e-6)


def test_prelu_rejects_slope_that_fits_nowhere() -> None:
    x = np.zeros((2, 3, 4, 5), np.float32)
    with pytest.raises(ValueError, match="does not broadcast"):
        run_aioinfer(oh.make_node("PRelu", ["x", "s"], ["y"]), [x, np.zeros(7, np.float32)], 9)


# -- Clip -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "attrs", [{}, {"min": -1.0}, {"max": 0.5}, {"min": -1.0, "max": 0.5}, {"min": 1.0, "max": 0.0}]
)
@pytest.mark.parametrize("opset", [1, 6])
@pytest.mark.parametrize("dtype", FLOATS)
def test_clip_attributes(attrs: dict, opset: int, dtype: type) -> None:
    x = random(np.random.default_rng(35), (3, 4), dtype, -3, 3)
    node = oh.make_node("Clip", ["x"], ["y"], **attrs)
    if opset == 6:
        check_node(node, [x], opset=opset)
    (got,) = run_aioinfer(node, [x], opset)  # onnx.reference has no Clip-1
    want = np.minimum(np.maximum(x, attrs.get("min", -np.inf)), attrs.get("max", np.inf))
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)


CLIP_BOUNDS = [(None, None), (-1, None), (None, 2), (-1, 2), (2, -1)]


@pytest.mark.parametrize(("low", "high"), CLIP_BOUNDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("opset", [11, 12, 13])
def test_clip_inputs(low, high, dtype: type, opset: int) -> None:
    if np.dtype(dtype).kind != "f" and opset < 12:
        dtype = np.float64  # integer types arrived with opset 12
    if np.dtype(dtype).kind == "u":
        low, high = (None if v is None else abs(v) for v in (low, high))
    x = random(np.random.default_rng(36), (2, 3, 4), dtype, -3 if dtype != np.uint8 else 0, 3)
    names = ["x", "" if low is None else "lo", "" if high is None else "hi"]
    while names[-1] == "":
        names.pop()
    inputs = [x, None if low is None else np.array(low, dtype)]
    inputs += [None if high is None else np.array(high, dtype)]
    node = oh.make_node("Clip", names, ["y"])
    check_node(node, inputs[: len(names)], opset=opset)
    (got,) = run_with_consts(node, inputs[: len(names)], [None, *inputs[1:]], opset)
    (want,) = run_aioinfer(node, inputs[: len(names)], opset)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == dtype


def test_clip_bound_of_shape_one() -> None:
    x = np.float32([[-2, 0, 2]])
    node = oh.make_node("Clip", ["x", "lo", "hi"], ["y"])
    (got,) = run_aioinfer(node, [x, np.float32([-1]), np.float32([1])], 13)
    assert got.shape == (1, 3)
    np.testing.assert_array_equal(got, [[-1, 0, 1]])
    with pytest.raises(ValueError, match="scalars"):
        run_aioinfer(node, [x, np.float32([-1, 0]), np.float32([1])], 13)


def test_clip_keeps_nan_and_does_not_write_input() -> None:
    x = np.float32([np.nan, -5, 5])
    x.flags.writeable = False
    node = oh.make_node("Clip", ["x", "lo", "hi"], ["y"])
    (got,) = run_aioinfer(node, [x, np.float32(-1), np.float32(1)], 13)
    assert np.isnan(got[0])
    np.testing.assert_array_equal(got[1:], [-1, 1])


def test_gelu_rejects_unknown_approximation() -> None:
    with pytest.raises(ValueError, match="approximate"):
        run_aioinfer(oh.make_node("Gelu", ["x"], ["y"], approximate="fast"), [np.float32([1])], 20)


@pytest.mark.parametrize(("op", "attrs", "opset"), CASES)
def test_zero_d_input_gives_array(op: str, attrs: dict, opset: int) -> None:
    (got,) = run_aioinfer(oh.make_node(op, ["x"], ["y"], **attrs), [np.float32(-0.5)], opset)
    assert type(got) is np.ndarray and got.shape == () and got.dtype == np.float32


@pytest.mark.parametrize("opset", [6, 13])
def test_clip_zero_d_gives_array(opset: int) -> None:
    names, inputs = (
        (["x"], [np.float32(3)])
        if opset < 11
        else (["x", "", "hi"], [np.float32(3), None, np.float32(1)])
    )
    attrs = {"max": 1.0} if opset < 11 else {}
    (got,) = run_aioinfer(oh.make_node("Clip", names, ["y"], **attrs), inputs, opset)
    assert type(got) is np.ndarray and got.shape == () and got == 1


FLOAT16_EXACT = {
    "Sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "Softplus": lambda x: np.log1p(np.exp(x)),
    "Mish": lambda x: x * np.tanh(np.log1p(np.exp(x))),
    "Elu": lambda x: np.where(x > 0, x, np.expm1(x)),
    "HardSwish": lambda x: x * np.clip(x / 6 + 0.5, 0, 1),
}


@pytest.mark.parametrize("op", sorted(FLOAT16_EXACT))
def test_float16_rounds_once(op: str) -> None:
    # Computed in float32 and rounded once, float16 results are within one ulp.
    x = np.linspace(-8, 8, 4001).astype(np.float16)
    (got,) = run_aioinfer(oh.make_node(op, ["x"], ["y"]), [x], 22)
    want = FLOAT16_EXACT[op](x.astype(np.float64))
    ulp = np.spacing(np.abs(want).astype(np.float16)).astype(np.float64)
    assert got.dtype == np.float16
    assert (np.abs(got - want) <= ulp).all()


@pytest.mark.parametrize(
    ("op", "attrs"), [("Relu", {}), ("LeakyRelu", {"alpha": 0.2}), ("LeakyRelu", {"alpha": 1.5})]
)
def test_relu_family_keeps_nan_and_infinities(op: str, attrs: dict) -> None:
    """The clip-based kernels treat NaN and infinities as np.maximum / np.where do."""
    x = np.float32([np.nan, -np.inf, -2, -0.0, 0, 3, np.inf])
    (got,) = run_aioinfer(oh.make_node(op, ["x"], ["y"], **attrs), [x], 16)
    alpha = np.float32(attrs.get("alpha", 0.0))
    want = np.float32([np.nan, -np.inf if alpha else 0, -2 * alpha, 0, 0, 3, np.inf])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_relu_on_both_sides_of_the_small_size(dtype: type) -> None:
    """Up to SMALL_RELU elements np.maximum, above it a two-bounded clip: the same values
    (NaN, infinities and signed zeros included) as a float64 reference either way."""
    from aioinfer.devices.cpu.kernels.activations import SMALL_RELU

    special = np.array([np.nan, -np.inf, -2, -0.0, 0, 3, np.inf], dtype)
    for size in (SMALL_RELU, SMALL_RELU + 1, 4 * SMALL_RELU):
        x = np.resize(special, size) * np.linspace(0.5, 2, size).astype(dtype)
        (got,) = run_aioinfer(oh.make_node("Relu", ["x"], ["y"]), [x], 14)
        want = np.where(np.isnan(x), np.nan, np.where(x > 0, x.astype(np.float64), 0.0))
        assert got.dtype == dtype
        np.testing.assert_array_equal(got.astype(np.float64), want)


def test_relu_of_integers() -> None:
    x = np.int32([-5, 0, 7])
    (got,) = run_aioinfer(oh.make_node("Relu", ["x"], ["y"]), [x], 14)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [0, 0, 7])
