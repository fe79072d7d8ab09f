"""Elementwise kernels against onnx.reference: arithmetic, math, logic, casts, constants."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

from aioinfer.devices.cpu.kernels.elementwise import erf
from aioinfer.devices.cpu.kernels.registry import find_kernel, make_spec
from tests.kernels._check import check_node, run_aioinfer, run_reference

TP = onnx.TensorProto
FLOATS = [np.float32, np.float64, np.float16]


def tol(dtype: type) -> dict[str, float]:
    """Tolerances: float16 results differ by rounding order, others are tight."""
    if dtype == np.float16:
        return {"rtol": 1e-3, "atol": 1e-3}
    return {"rtol": 1e-5, "atol": 1e-6}


def random(rng: np.random.Generator, shape: Sequence[int], dtype: type, low=-5, high=5):
    if np.dtype(dtype).kind == "b":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.dtype(dtype).kind in "iu":
        lo = max(low, np.iinfo(dtype).min)
        return rng.integers(lo, high, size=shape, endpoint=True).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(dtype)


def check_strings(node: onnx.NodeProto, inputs: list, opset: int) -> np.ndarray:
    """Like check_node for a string result, which assert_allclose cannot compare."""
    (got,) = run_aioinfer(node, inputs, opset)
    (want,) = run_reference(node, inputs, opset)
    assert got.dtype.kind == "U", got.dtype
    np.testing.assert_array_equal(got, want.astype(np.str_))
    return got


def run_with_consts(node: onnx.NodeProto, inputs: list, consts: list, opset: int) -> list:
    """Run ``node`` through our kernel with some inputs known at compile time."""
    ir_node = ir.from_proto(node)
    entry = find_kernel("", node.op_type, opset)
    return list(entry.factory(make_spec(ir_node, opset, consts))(*inputs))


# Pairs of shapes under numpy broadcasting: equal, suffix, both sides, scalar, empty, rank 5.
BROADCAST_SHAPES = [
    ((3, 4), (3, 4)),
    ((2, 3, 4), (4,)),
    ((2, 1, 4), (3, 1)),
    ((), (3,)),
    ((0, 3), (1, 3)),
    ((2, 3, 1, 4, 5), (3, 2, 1, 1)),
    ((5,), (1,)),
]


# -- binary arithmetic ----------------------------------------------------------------------


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64])
@pytest.mark.parametrize("shapes", BROADCAST_SHAPES)
def test_arithmetic(op: str, dtype: type, shapes: tuple) -> None:
    rng = np.random.default_rng(1)
    a = random(rng, shapes[0], dtype, -50, 50)
    b = random(rng, shapes[1], dtype, 1, 9)
    b = np.where(rng.integers(0, 2, b.shape) == 1, -b, b).astype(dtype)  # no zero divisor
    check_node(oh.make_node(op, ["a", "b"], ["y"]), [a, b], opset=14, **tol(dtype))


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("opset", [1, 6, 7, 13])
def test_arithmetic_old_opsets_same_shape(op: str, opset: int) -> None:
    rng = np.random.default_rng(2)
    a, b = rng.uniform(1, 2, (2, 3)).astype(np.float32), rng.uniform(1, 2, (2, 3))
    check_node(oh.make_node(op, ["a", "b"], ["y"]), [a, b.astype(np.float32)], opset=opset)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32])
def test_integer_division_truncates_toward_zero(dtype: type) -> None:
    signed = np.dtype(dtype).kind == "i"
    a = np.array([-7, 7, -7, 7, -6, 0, 5] if signed else [7, 6, 0, 5, 255 % 128], dtype)
    b = np.array([2, 2, -2, -2, 3, -3, 7] if signed else [2, 3, 4, 7, 5], dtype)
    want = [-3, 3, 3, -3, -2, 0, 0] if signed else [3, 2, 0, 0, 25]
    (got,) = check_node(oh.make_node("Div", ["a", "b"], ["y"]), [a, b], opset=14)
    np.testing.assert_array_equal(got, np.array(want, dtype))


@pytest.mark.parametrize(
    ("op", "fn"),
    [
        ("Add", np.add),
        ("Sub", np.subtract),
        ("Mul", np.multiply),
        ("Div", np.divide),
        ("Pow", np.power),
        ("Greater", np.greater),
        ("Less", np.less),
    ],
)
@pytest.mark.parametrize(("axis", "b_shape"), [(1, (3, 4)), (0, (2,)), (-3, (3, 4)), (3, (5,))])
def test_legacy_broadcast_axis(op: str, fn, axis: int, b_shape: tuple) -> None:
    rng = np.random.default_rng(3)
    a = rng.uniform(0.5, 2, (2, 3, 4, 5)).astype(np.float32)
    b = rng.uniform(0.5, 2, b_shape).astype(np.float32)
    node = oh.make_node(op, ["a", "b"], ["y"], broadcast=1, axis=axis)
    (got,) = run_aioinfer(node, [a, b], opset=6)
    start = axis % 4
    want = fn(a, b.reshape(b.shape + (1,) * (4 - start - b.ndim)))
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize(("op", "fn"), [("And", np.logical_and), ("Equal", np.equal)])
def test_legacy_broadcast_axis_logic(op: str, fn) -> None:
    rng = np.random.default_rng(4)
    dtype = np.bool_ if op == "And" else np.int32
    a, b = random(rng, (2, 3, 4), dtype, 0, 1), random(rng, (3,), dtype, 0, 1)
    node = oh.make_node(op, ["a", "b"], ["y"], broadcast=1, axis=1)
    (got,) = run_aioinfer(node, [a, b], opset=1)
    np.testing.assert_array_equal(got, fn(a, b[:, None]))


def test_legacy_broadcast_without_axis_is_suffix() -> None:
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((2, 3, 4)).astype(np.float32), np.float32([1, 2, 3, 4])
    check_node(oh.make_node("Add", ["a", "b"], ["y"], broadcast=1), [a, b], opset=6)


def test_legacy_broadcast_rejects_misfit() -> None:
    node = oh.make_node("Add", ["a", "b"], ["y"], broadcast=1, axis=2)
    with pytest.raises(ValueError, match="cannot broadcast"):
        run_aioinfer(node, [np.zeros((2, 3, 4), np.float32), np.zeros((4, 5), np.float32)], 6)


POW_TYPES = [
    (np.float32, np.float32, 7),
    (np.float64, np.float64, 7),
    (np.float16, np.float16, 7),
    (np.float32, np.float32, 15),
    (np.float32, np.int64, 12),
    (np.float32, np.int64, 15),
    (np.float64, np.float32, 15),
    (np.float16, np.float32, 15),
    (np.int32, np.int32, 12),
    (np.int64, np.float32, 15),
]


@pytest.mark.parametrize(("base", "exponent", "opset"), POW_TYPES)
def test_pow_keeps_base_dtype(base: type, exponent: type, opset: int) -> None:
    rng = np.random.default_rng(6)
    a = random(rng, (3, 4), base, 1, 4)
    b = random(rng, (4,), exponent, 0, 3)
    check_node(oh.make_node("Pow", ["a", "b"], ["y"]), [a, b], opset=opset, **tol(base))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
@pytest.mark.parametrize(
    "exponent", [np.float32(2), np.float32(3), np.float32(0.5), np.array([[2]], np.float32)]
)
def test_pow_constant_exponent(dtype: type, exponent: np.ndarray) -> None:
    a = np.array([0.5, 1.5, 2.0, 3.0], dtype) if dtype != np.int64 else np.arange(4, dtype=dtype)
    exponent = np.asarray(exponent)
    node = oh.make_node("Pow", ["a", "b"], ["y"])
    (got,) = run_with_consts(node, [a, exponent], [None, exponent], 15)
    (want,) = run_reference(node, [a, exponent], 15)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, **tol(dtype))


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64])
def test_mod(fmod: int, dtype: type) -> None:
    rng = np.random.default_rng(7)
    a = random(rng, (4, 5), dtype, -20, 20)
    b = random(rng, (5,), dtype, 1, 6) * np.array([1, -1, 1, -1, 1], dtype)
    check_node(oh.make_node("Mod", ["a", "b"], ["y"], fmod=fmod), [a, b], opset=13)


# -- unary math ------------------------------------------------------------------------------

# op, first opset, input range
UNARY = [
    ("Neg", 1, (-5, 5)),
    ("Abs", 1, (-5, 5)),
    ("Reciprocal", 1, (0.5, 5)),
    ("Floor", 1, (-5, 5)),
    ("Ceil", 1, (-5, 5)),
    ("Sqrt", 1, (0, 9)),
    ("Exp", 1, (-5, 5)),
    ("Log", 1, (0.1, 9)),
    ("Sin", 7, (-5, 5)),
    ("Cos", 7, (-5, 5)),
    ("Tan", 7, (-1.4, 1.4)),
    ("Asin", 7, (-1, 1)),
    ("Acos", 7, (-1, 1)),
    ("Atan", 7, (-5, 5)),
    ("Sign", 9, (-5, 5)),
    ("Sinh", 9, (-3, 3)),
    ("Cosh", 9, (-3, 3)),
    ("Asinh", 9, (-5, 5)),
    ("Acosh", 9, (1, 5)),
    ("Atanh", 9, (-0.99, 0.99)),
    ("Erf", 9, (-4, 4)),
]


@pytest.mark.parametrize(("op", "since", "bounds"), UNARY)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("newest", [False, True])
def test_unary_math(op: str, since: int, bounds: tuple, dtype: type, newest: bool) -> None:
    rng = np.random.default_rng(8)
    x = random(rng, (2, 3, 1, 4, 5) if newest else (7,), dtype, *bounds)
    opset = 22 if newest else max(since, 6)
    check_node(oh.make_node(op, ["x"], ["y"]), [x], opset=opset, **tol(dtype))


@pytest.mark.parametrize("op", ["Neg", "Abs", "Sign"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_unary_integers(op: str, dtype: type) -> None:
    x = np.array([-3, 0, 2, -1, 7], dtype)
    check_node(oh.make_node(op, ["x"], ["y"]), [x], opset=13)


def test_unary_empty_and_scalar() -> None:
    check_node(oh.make_node("Exp", ["x"], ["y"]), [np.zeros((0, 3), np.float32)], opset=13)
    check_node(oh.make_node("Sqrt", ["x"], ["y"]), [np.float32(4.0).reshape(())], opset=13)


def test_round_half_to_even() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, 2.6, -2.6], np.float32)
    (got,) = check_node(oh.make_node("Round", ["x"], ["y"]), [x], opset=22)
    np.testing.assert_array_equal(got, np.float32([0, 2, 2, -0, -2, 2, 3, -3]))


def test_erf_is_accurate() -> None:
    grid = np.concatenate(
        [np.linspace(-7, 7, 40001), np.geomspace(1e-30, 7, 2000), -np.geomspace(1e-30, 7, 200)]
    )
    want = np.array([math.erf(v) for v in grid])
    assert np.abs(erf(grid) - want).max() < 1e-13
    single = grid.astype(np.float32)
    want32 = np.array([math.erf(v) for v in single.astype(np.float64)])
    got32 = erf(single)
    assert got32.dtype == np.float32
    assert np.abs(got32 - want32).max() < 1e-7
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e300], np.float64)
    np.testing.assert_array_equal(erf(specials), [0.0, -0.0, 1.0, -1.0, np.nan, 1.0])


def test_erf_large_tensor_crosses_chunks() -> None:
    x = np.random.default_rng(9).standard_normal((3, 40000)).astype(np.float32) * 3
    check_node(oh.make_node("Erf", ["x"], ["y"]), [x], opset=13, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("negative", "positive"), [(None, None), (1, 0), (0, 1), (0, 0), (1, 1)])
@pytest.mark.parametrize("opset", [10, 20])
def test_is_inf(dtype: type, negative, positive, opset: int) -> None:
    attrs = {
        k: v
        for k, v in {"detect_negative": negative, "detect_positive": positive}.items()
        if v is not None
    }
    x = np.array([[1.0, np.inf, -np.inf], [np.nan, 0.0, -2.0]], dtype)
    check_node(oh.make_node("IsInf", ["x"], ["y"], **attrs), [x], opset=opset)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("opset", [9, 13, 20])
def test_is_nan(dtype: type, opset: int) -> None:
    x = np.array([1.0, np.nan, -np.inf, 0.0], dtype)
    check_node(oh.make_node("IsNaN", ["x"], ["y"]), [x], opset=opset)


# -- comparison and logic ---------------------------------------------------------------------


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.float16])
@pytest.mark.parametrize("shapes", BROADCAST_SHAPES)
def test_comparison(op: str, dtype: type, shapes: tuple) -> None:
    rng = np.random.default_rng(10)
    a = np.round(random(rng, shapes[0], dtype, 0, 3)).astype(dtype)  # plenty of ties
    b = np.round(random(rng, shapes[1], dtype, 0, 3)).astype(dtype)
    check_node(oh.make_node(op, ["a", "b"], ["y"]), [a, b], opset=16)


@pytest.mark.parametrize(("op", "opset"), [("Equal", 7), ("Greater", 7), ("Less", 9)])
def test_comparison_old_opsets(op: str, opset: int) -> None:
    a = np.float32([[1, 2, 3], [3, 2, 1]])
    check_node(oh.make_node(op, ["a", "b"], ["y"]), [a, np.float32([2, 2, 2])], opset=opset)


def test_equal_strings() -> None:
    a, b = np.array(["ab", "cd", "ef"]), np.array(["ab", "cx", "ef"])
    (got,) = check_node(oh.make_node("Equal", ["a", "b"], ["y"]), [a, b], opset=19)
    np.testing.assert_array_equal(got, [True, False, True])


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
@pytest.mark.parametrize("shapes", BROADCAST_SHAPES)
def test_logic(op: str, shapes: tuple) -> None:
    rng = np.random.default_rng(11)
    a, b = random(rng, shapes[0], np.bool_), random(rng, shapes[1], np.bool_)
    check_node(oh.make_node(op, ["a", "b"], ["y"]), [a, b], opset=7)


def test_not() -> None:
    x = np.array([[True, False], [False, False]])
    (got,) = check_node(oh.make_node("Not", ["x"], ["y"]), [x], opset=1)
    np.testing.assert_array_equal(got, ~x)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_bit_shift(direction: str, dtype: type) -> None:
    bits = np.iinfo(dtype).bits
    x = np.array([1, 3, 200, np.iinfo(dtype).max, 16, 5], dtype)
    shift = np.array([0, 1, 3, 2, bits - 1, bits], dtype)  # includes a full-width shift
    node = oh.make_node("BitShift", ["x", "s"], ["y"], direction=direction)
    (got,) = check_node(node, [x, shift], opset=11)
    assert got[-1] == 0


def test_bit_shift_rejects_unknown_direction() -> None:
    node = oh.make_node("BitShift", ["x", "s"], ["y"], direction="UP")
    with pytest.raises(ValueError, match="direction"):
        run_aioinfer(node, [np.uint8([1]), np.uint8([1])], 11)


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.uint16, np.uint64])
def test_bitwise_binary(op: str, dtype: type) -> None:
    rng = np.random.default_rng(12)
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, (3, 4), dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, (4,), dtype=dtype, endpoint=True)
    check_node(oh.make_node(op, ["a", "b"], ["y"]), [a, b], opset=18)


@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.uint8, np.uint32])
def test_bitwise_not(dtype: type) -> None:
    x = np.array([0, 1, 5, np.iinfo(dtype).max], dtype)
    check_node(oh.make_node("BitwiseNot", ["x"], ["y"]), [x], opset=18)


# -- variadic and Where -----------------------------------------------------------------------


VARIADIC_SHAPES = [
    [(3, 4)],
    [(3, 4), (3, 4)],
    [(2, 1, 4), (3, 1), (4,)],
    [(4,), (2, 3, 4)],  # the first input is smaller than the result
    [(1, 3), (2, 1), (2, 3), (1,)],
    [(0, 3), (1, 3)],
]


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
@pytest.mark.parametrize("shapes", VARIADIC_SHAPES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_variadic(op: str, shapes: list, dtype: type) -> None:
    rng = np.random.default_rng(13)
    inputs = [random(rng, s, dtype) for s in shapes]
    node = oh.make_node(op, [f"x{i}" for i in range(len(inputs))], ["y"])
    if op == "Mean" and np.broadcast_shapes(*shapes) != shapes[0]:
        # onnx.reference accumulates in place into the first input and fails here.
        (got,) = run_aioinfer(node, inputs, 13)
        want = sum(x.astype(np.float64) for x in inputs) / len(inputs)
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, **tol(dtype))
        return
    check_node(node, inputs, opset=13, **tol(dtype))


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
def test_variadic_opset6_same_shapes(op: str) -> None:
    rng = np.random.default_rng(14)
    inputs = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(3)]
    check_node(oh.make_node(op, ["a", "b", "c"], ["y"]), inputs, opset=6)


@pytest.mark.parametrize("op", ["Max", "Min", "Sum"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_variadic_integers(op: str, dtype: type) -> None:
    rng = np.random.default_rng(15)
    inputs = [random(rng, (2, 3), dtype, 0, 50), random(rng, (3,), dtype, 0, 50)]
    check_node(oh.make_node(op, ["a", "b"], ["y"]), inputs, opset=13)


@pytest.mark.parametrize("op", ["Max", "Min"])
@pytest.mark.parametrize("bound_shape", [(), (1,), (1, 1, 1, 1)])
@pytest.mark.parametrize("bound_first", [False, True])
@pytest.mark.parametrize("dtype", FLOATS)
def test_max_min_with_one_element_bound(
    op: str, bound_shape: tuple[int, ...], bound_first: bool, dtype: type
) -> None:
    """Max/Min of a large float array and a one-element bound (the clip path), NaN in
    the data and in the bound propagating, against onnx.reference (exact)."""
    rng = np.random.default_rng(17)
    x = random(rng, (1, 3, 40, 50), dtype)  # 6000 elements: above CLIP_BOUND_ELEMENTS
    x.reshape(-1)[::97] = np.nan
    for value in (0.5, np.nan):
        bound = np.full(bound_shape, value, dtype)
        inputs = [bound, x] if bound_first else [x, bound]
        (got,) = check_node(oh.make_node(op, ["a", "b"], ["y"]), inputs, opset=13, rtol=0, atol=0)
        assert got.shape == x.shape and got.dtype == dtype
        want = (np.maximum if op == "Max" else np.minimum)(x, bound)
        np.testing.assert_array_equal(got, want)


def test_max_propagates_nan() -> None:
    a, b = np.float32([1, np.nan, 3]), np.float32([np.nan, 2, 1])
    (got,) = check_node(oh.make_node("Max", ["a", "b"], ["y"]), [a, b], opset=13)
    assert np.isnan(got[:2]).all() and got[2] == 3


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16])
@pytest.mark.parametrize("opset", [9, 16])
def test_where(dtype: type, opset: int) -> None:
    rng = np.random.default_rng(16)
    condition = random(rng, (2, 1, 4), np.bool_)
    x, y = random(rng, (3, 4), dtype), random(rng, (1, 3, 1), dtype)
    check_node(oh.make_node("Where", ["c", "x", "y"], ["z"]), [condition, x, y], opset=opset)


# -- Cast and CastLike -----------------------------------------------------------------------

CASTS = [
    (np.float32, TP.INT32),
    (np.float32, TP.INT64),
    (np.float32, TP.FLOAT16),
    (np.float32, TP.DOUBLE),
    (np.float32, TP.BOOL),
    (np.float32, TP.UINT8),
    (np.float64, TP.FLOAT),
    (np.float16, TP.FLOAT),
    (np.int64, TP.FLOAT),
    (np.int64, TP.INT32),
    (np.int32, TP.INT8),
    (np.int8, TP.UINT16),
    (np.bool_, TP.FLOAT),
    (np.bool_, TP.INT64),
    (np.uint32, TP.UINT64),
    (np.float32, TP.FLOAT),
]


@pytest.mark.parametrize(("src", "to"), CASTS)
@pytest.mark.parametrize("opset", [6, 13, 21])
def test_cast(src: type, to: int, opset: int) -> None:
    rng = np.random.default_rng(17)
    x = random(rng, (2, 3, 4), src, 0, 100)
    check_node(oh.make_node("Cast", ["x"], ["y"], to=to), [x], opset=opset)


def test_cast_opset1_type_name() -> None:
    x = np.float32([1.7, -2.2, 3.0])
    (got,) = run_aioinfer(oh.make_node("Cast", ["x"], ["y"], to="INT32"), [x], 1)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [1, -2, 3])


@pytest.mark.parametrize(
    ("x", "to"),
    [
        (np.float32([1.5, -2.0, 0.1]), TP.STRING),
        (np.int64([12, -3]), TP.STRING),
        (np.array(["1.5", "-2", "inf", "-0.25"]), TP.FLOAT),
        (np.array(["12", "-3"]), TP.INT64),
        (np.array(["1e3", "2"]), TP.DOUBLE),
    ],
)
def test_cast_strings(x: np.ndarray, to: int) -> None:
    node = oh.make_node("Cast", ["x"], ["y"], to=to)
    if to == TP.STRING:
        check_strings(node, [x], opset=19)
    else:
        check_node(node, [x], opset=19)


@pytest.mark.parametrize(
    "to",
    [TP.BFLOAT16, TP.FLOAT8E4M3FN, TP.FLOAT8E5M2FNUZ, TP.FLOAT8E8M0, TP.INT4, TP.FLOAT4E2M1],
)
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_to_narrow_types_matches_reference(to: int, saturate: int) -> None:
    """ml_dtypes targets, out-of-range values included (saturated or not): bit-exact."""
    node = oh.make_node("Cast", ["x"], ["y"], to=to, saturate=saturate)
    x = np.float32([1.5, -2.25, 0.1, 1e6, -1e6, np.inf, 3.0])
    (got,) = run_aioinfer(node, [x], 25)
    (want,) = run_reference(node, [x], 25)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


def test_cast_to_an_unknown_type_is_named() -> None:
    node = oh.make_node("Cast", ["x"], ["y"], to=99)
    with pytest.raises(ValueError, match="unknown data type 99"):
        run_aioinfer(node, [np.float32([1])], 21)


def test_cast_same_type_makes_no_copy() -> None:
    x = np.float32([1, 2])
    (got,) = run_aioinfer(oh.make_node("Cast", ["x"], ["y"], to=TP.FLOAT), [x], 13)
    assert np.shares_memory(got, x)


@pytest.mark.parametrize(
    ("src", "like"),
    [(np.float32, np.int64), (np.int32, np.float16), (np.float64, np.bool_), (np.int8, np.uint8)],
)
@pytest.mark.parametrize("opset", [15, 19])
def test_cast_like(src: type, like: type, opset: int) -> None:
    rng = np.random.default_rng(18)
    x, target = random(rng, (3, 4), src, 0, 100), random(rng, (2,), like, 0, 1)
    check_node(oh.make_node("CastLike", ["x", "t"], ["y"]), [x, target], opset=opset)


# -- Identity, Dropout, Constant, Einsum --------------------------------------------------------


@pytest.mark.parametrize("opset", [1, 13, 21])
def test_identity(opset: int) -> None:
    x = np.random.default_rng(19).standard_normal((2, 3)).astype(np.float32)
    check_node(oh.make_node("Identity", ["x"], ["y"]), [x], opset=opset)


@pytest.mark.parametrize("opset", [1, 6, 7, 10, 12, 13, 22])
@pytest.mark.parametrize("with_mask", [False, True])
def test_dropout_inference(opset: int, with_mask: bool) -> None:
    x = np.random.default_rng(20).standard_normal((2, 3, 4)).astype(np.float32)
    outputs = ["y", "mask"] if with_mask else ["y"]
    attrs = {"ratio": 0.3} if opset < 12 else {}
    node = oh.make_node("Dropout", ["x"], outputs, **attrs)
    got = run_aioinfer(node, [x], opset)
    np.testing.assert_array_equal(got[0], x)
    if with_mask:
        # The mask had the data's type before opset 10 (the reference always gives bool).
        assert got[1].dtype == (np.float32 if opset < 10 else np.bool_)
        np.testing.assert_array_equal(got[1], np.ones(x.shape))
    if opset >= 10:
        check_node(node, [x], opset=opset)


def test_dropout_with_ratio_and_training_mode_false() -> None:
    x = np.random.default_rng(21).standard_normal((4, 5)).astype(np.float32)
    node = oh.make_node("Dropout", ["x", "r", "t"], ["y", "mask"])
    check_node(node, [x, np.float32(0.4), np.array(False)], opset=13)


def test_dropout_training_mode_drops_and_scales() -> None:
    x = np.ones((200, 100), np.float32)
    node = oh.make_node("Dropout", ["x", "r", "t"], ["y", "mask"], seed=3)
    y, mask = run_aioinfer(node, [x, np.float32(0.25), np.array(True)], 13)
    assert y.dtype == np.float32 and mask.dtype == np.bool_
    assert 0.72 < mask.mean() < 0.78
    np.testing.assert_allclose(y, np.where(mask, 1 / 0.75, 0), rtol=1e-6)


@pytest.mark.parametrize(
    "attrs",
    [
        {"value": oh.make_tensor("v", TP.FLOAT, [2, 2], [1, 2, 3, 4])},
        {"value": oh.make_tensor("v", TP.INT64, [0], [])},
        {"value": oh.make_tensor("v", TP.FLOAT16, [], [1.5])},
        {"value_float": 2.5},
        {"value_floats": [1.0, -2.0]},
        {"value_int": 7},
        {"value_ints": [3, -4, 5]},
        {"value_string": "hello"},
        {"value_strings": ["a", "bc"]},
    ],
)
def test_constant(attrs: dict) -> None:
    opset = 9 if "value" in attrs else 13
    node = oh.make_node("Constant", [], ["y"], **attrs)
    if "value_string" in attrs or "value_strings" in attrs:
        got = check_strings(node, [], opset)
    else:
        (got,) = check_node(node, [], opset=opset)
    assert not got.flags.writeable


def test_constant_string_tensor_is_str() -> None:
    node = oh.make_node(
        "Constant", [], ["y"], value=oh.make_tensor("v", TP.STRING, [2], [b"ab", b"\xc3\xa9"])
    )
    (got,) = run_aioinfer(node, [], 13)
    np.testing.assert_array_equal(got, np.array(["ab", "é"]))


def test_constant_without_value_is_an_error() -> None:
    ir_node = ir.from_proto(oh.make_node("Constant", [], ["y"]))
    with pytest.raises(ValueError, match="expected one of the attributes"):
        find_kernel("", "Constant", 13).factory(make_spec(ir_node, 13))


EINSUMS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("i,i", [(5,), (5,)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 2)]),
    ("bhqd, bhkd -> bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("i,j->ij", [(3,), (4,)]),
]


@pytest.mark.parametrize(("equation", "shapes"), EINSUMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_einsum(equation: str, shapes: list, dtype: type) -> None:
    rng = np.random.default_rng(22)
    inputs = [random(rng, s, dtype) for s in shapes]
    names = [f"x{i}" for i in range(len(inputs))]
    node = oh.make_node("Einsum", names, ["y"], equation=equation)
    check_node(node, inputs, opset=12, rtol=1e-4, atol=1e-5)


def test_einsum_reuses_plan_across_shapes() -> None:
    node = oh.make_node("Einsum", ["a", "b"], ["y"], equation="ij,jk->ik")
    fn = find_kernel("", "Einsum", 12).factory(make_spec(ir.from_proto(node), 12))
    rng = np.random.default_rng(23)
    for n in (2, 3, 2):
        a, b = rng.standard_normal((n, 4)), rng.standard_normal((4, n + 1))
        np.testing.assert_allclose(fn(a, b)[0], a @ b, rtol=1e-12)


def test_no_spurious_warnings() -> None:
    # Large negative float32 values must not warn anywhere in the float paths.
    x = np.float32([-100, 100, 0, -1e30])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_aioinfer(oh.make_node("Erf", ["x"], ["y"]), [x], 13)


ZERO_D_NODES = [
    ("Add", 2, np.float32, {}),
    ("Div", 2, np.int32, {}),
    ("Pow", 2, np.float32, {}),
    ("Mod", 2, np.int64, {}),
    ("Equal", 2, np.int64, {}),
    ("BitShift", 2, np.uint8, {"direction": "LEFT"}),
    ("Sum", 3, np.float32, {}),
    ("Max", 3, np.int64, {}),
    ("Exp", 1, np.float32, {}),
    ("Erf", 1, np.float16, {}),
    ("IsInf", 1, np.float32, {"detect_negative": 0}),
    ("Where", 3, np.bool_, {}),
    ("Cast", 1, np.float32, {"to": TP.INT64}),
]


@pytest.mark.parametrize(("op", "arity", "dtype", "attrs"), ZERO_D_NODES)
def test_zero_d_inputs_give_arrays(op: str, arity: int, dtype: type, attrs: dict) -> None:
    # numpy ufuncs turn 0-d operands into scalars; kernels must still return arrays.
    inputs = [np.array(2, dtype) for _ in range(arity)]
    node = oh.make_node(op, [f"x{i}" for i in range(arity)], ["y"], **attrs)
    (got,) = run_aioinfer(node, inputs, 18)
    assert type(got) is np.ndarray and got.shape == ()
    check_node(node, inputs, opset=18)
