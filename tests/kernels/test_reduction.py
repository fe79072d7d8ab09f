"""Reduction kernels (Reduce*, ArgMax/ArgMin, CumSum, TopK) against onnx.reference."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

from aioinfer.devices.cpu.kernels.registry import find_kernel, make_spec
from tests.kernels._check import check_node, run_reference

REDUCE_OPS = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSum",
    "ReduceLogSumExp",
]
AXES_INPUT_SINCE = {op: 13 if op == "ReduceSum" else 18 for op in REDUCE_OPS}
POSITIVE_ONLY = {"ReduceLogSum"}


def _data(op: str, shape: Sequence[int], dtype: type = np.float32, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if op in POSITIVE_ONLY:
        return rng.uniform(0.5, 2.0, shape).astype(dtype)
    if op == "ReduceProd":
        return rng.uniform(0.8, 1.25, shape).astype(dtype) * rng.choice([-1, 1], shape)
    return rng.standard_normal(shape).astype(dtype)


def _reduce_node(op: str, opset: int, axes: list[int] | None, **attrs: object) -> tuple:
    """The node and its extra inputs for ``axes`` in the form ``opset`` uses."""
    if opset >= AXES_INPUT_SINCE[op]:
        if axes is None:
            return oh.make_node(op, ["x"], ["y"], **attrs), []
        return oh.make_node(op, ["x", "axes"], ["y"], **attrs), [np.array(axes, np.int64)]
    if axes is not None:
        attrs["axes"] = axes
    return oh.make_node(op, ["x"], ["y"], **attrs), []


def _run_with_consts(
    node: onnx.NodeProto, inputs: Sequence[np.ndarray | None], opset: int, const: Sequence[int]
) -> list[np.ndarray]:
    """Run ``node`` with the inputs at positions ``const`` known at compile time."""
    ir_node = ir.from_proto(node)
    consts = [x if i in const else None for i, x in enumerate(inputs)]
    entry = find_kernel(ir_node.domain, ir_node.op_type, opset)
    return list(entry.factory(make_spec(ir_node, opset, consts))(*inputs))


def _assert_same(got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: float) -> None:
    for g, w in zip(got, want, strict=True):
        g = np.asarray(g)
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6)


# --- Reduce* ------------------------------------------------------------------------------


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize(
    ("shape", "axes"),
    [
        ((3, 4, 5), None),
        ((3, 4, 5), [1]),
        ((3, 4, 5), [-1]),
        ((3, 4, 5), [0, 2]),
        ((3, 4, 5), [0, 1, 2]),
        ((7,), [0]),
        ((2, 1, 3, 1, 2), [1, -2]),
        ((2, 1, 3, 1, 2), None),
    ],
)
@pytest.mark.parametrize("form", ["attribute", "input"])
def test_reduce(op: str, keepdims: int, shape: tuple, axes: list[int] | None, form: str) -> None:
    opset = AXES_INPUT_SINCE[op] - 2 if form == "attribute" else AXES_INPUT_SINCE[op]
    node, extra = _reduce_node(op, opset, axes, keepdims=keepdims)
    check_node(node, [_data(op, shape), *extra], opset=opset, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("opset", [1, 11])
def test_reduce_old_opsets(op: str, opset: int) -> None:
    axes = [1] if opset == 1 else [-1, 0]
    node, extra = _reduce_node(op, opset, axes, keepdims=1)
    check_node(node, [_data(op, (2, 3, 4), np.float64), *extra], opset=opset, rtol=1e-12)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_reduce_float_dtypes(op: str, dtype: type) -> None:
    node, extra = _reduce_node(op, 18, [1], keepdims=0)
    rtol = 2e-3 if dtype == np.float16 else 1e-12
    check_node(node, [_data(op, (4, 6, 3), dtype), *extra], opset=18, rtol=rtol, atol=1e-3)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("noop", [0, 1])
def test_reduce_empty_axes_input(op: str, noop: int) -> None:
    # An empty axes tensor reduces everything, or (noop) leaves the data unreduced.
    node = oh.make_node(op, ["x", "axes"], ["y"], noop_with_empty_axes=noop, keepdims=0)
    opset = AXES_INPUT_SINCE[op]
    check_node(node, [_data(op, (3, 4)), np.zeros(0, np.int64)], opset=opset)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_noop_without_axes_input(op: str) -> None:
    node = oh.make_node(op, ["x"], ["y"], noop_with_empty_axes=1)
    check_node(node, [_data(op, (3, 4))], opset=AXES_INPUT_SINCE[op])


@pytest.mark.filterwarnings("ignore:Mean of empty slice", "ignore:invalid value encountered")
@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize(("shape", "axes"), [((2, 0, 4), [1]), ((0, 3), [1]), ((0,), None)])
def test_reduce_empty_tensor(op: str, opset: int, shape: tuple, axes: list[int] | None) -> None:
    # Empty reductions give the identity: 0, 1, -inf (LogSum, Max), +inf (Min), NaN (Mean).
    node, extra = _reduce_node(op, opset, axes, keepdims=1)
    check_node(node, [np.zeros(shape, np.float32), *extra], opset=opset)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reduce_integers_keep_dtype(op: str, dtype: type) -> None:
    # ReduceMean of integers truncates towards zero, like the reference.
    x = np.random.default_rng(3).integers(-9, 10, (3, 5)).astype(dtype)
    node, extra = _reduce_node(op, 18, [1], keepdims=0)
    got = check_node(node, [x, *extra], opset=18, rtol=0, atol=0)
    assert got[0].dtype == dtype


@pytest.mark.parametrize("op", ["ReduceL1", "ReduceL2", "ReduceSumSquare"])
def test_reduce_norms_of_int32_keep_dtype(op: str) -> None:
    x = np.array([[3, -4, 0], [1, 2, -2]], np.int32)
    node, extra = _reduce_node(op, 18, [1], keepdims=0)
    (got,) = _run_with_consts(node, [x, *extra], 18, const=())
    want = {"ReduceL1": [7, 5], "ReduceL2": [5, 3], "ReduceSumSquare": [25, 9]}[op]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_reduce_mean_of_negative_ints_truncates() -> None:
    node = oh.make_node("ReduceMean", ["x"], ["y"], axes=[0], keepdims=0)
    (got,) = _run_with_consts(node, [np.array([[-1, 2], [-2, 1]], np.int32)], 13, const=())
    np.testing.assert_array_equal(got, np.array([-1, 1], np.int32))
    assert got.dtype == np.int32


@pytest.mark.parametrize(
    ("op", "want"), [("ReduceMax", [True, True]), ("ReduceMin", [False, True])]
)
@pytest.mark.parametrize("opset", [20, 23])
def test_reduce_max_min_bool(op: str, want: list[bool], opset: int) -> None:
    x = np.array([[False, True], [True, True]])
    node = oh.make_node(op, ["x", "axes"], ["y"], keepdims=0)
    (got,) = _run_with_consts(node, [x, np.array([1], np.int64)], opset, const=())
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.bool_
    empty = _run_with_consts(node, [np.zeros((2, 0), bool), np.array([1], np.int64)], opset, ())
    # The identity of an empty reduction: False for max, True for min.
    np.testing.assert_array_equal(empty[0], [op == "ReduceMin"] * 2)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("axes", [[0, -1], [], None])
@pytest.mark.parametrize("noop", [0, 1])
def test_reduce_constant_axes(op: str, axes: list[int] | None, noop: int) -> None:
    # Axes known at compile time are resolved in the factory.
    opset = AXES_INPUT_SINCE[op]
    x = _data(op, (2, 3, 4))
    if axes is None:
        node = oh.make_node(op, ["x"], ["y"], noop_with_empty_axes=noop)
        inputs: list[np.ndarray] = [x]
    else:
        node = oh.make_node(op, ["x", "axes"], ["y"], noop_with_empty_axes=noop)
        inputs = [x, np.array(axes, np.int64)]
    got = _run_with_consts(node, inputs, opset, const=(1,))
    _assert_same(got, run_reference(node, inputs, opset), rtol=1e-5)


def test_reduce_log_sum_exp_is_stable_for_large_and_infinite_values() -> None:
    x = np.array([[1000.0, 1000.0], [-np.inf, -np.inf], [np.inf, 1.0], [-1000.0, 0.0]], np.float32)
    node = oh.make_node("ReduceLogSumExp", ["x"], ["y"], axes=[1], keepdims=0)
    (got,) = _run_with_consts(node, [x], 13, const=())
    want = np.array([1000 + np.log(2), -np.inf, np.inf, 0.0], np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got.dtype == np.float32


def test_reduce_full_keepdims_0_returns_an_array() -> None:
    node = oh.make_node("ReduceSum", ["x"], ["y"], keepdims=0)
    (got,) = _run_with_consts(node, [np.ones((2, 3), np.float32)], 13, const=())
    assert isinstance(got, np.ndarray) and got.shape == () and got == 6


# --- ArgMax, ArgMin -----------------------------------------------------------------------


ARG_CASES = [
    (opset, axis, last)
    for opset in (1, 11, 12, 13)
    for axis in (0, 1, 2, -1, -3)
    for last in (0, 1)
    # Negative axes arrive in opset 11, select_last_index in 12.
    if (opset > 1 or axis >= 0) and (opset >= 12 or not last)
]


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize(("opset", "axis", "select_last_index"), ARG_CASES)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_arg_reduce(op: str, opset: int, axis: int, keepdims: int, select_last_index: int) -> None:
    attrs = {"axis": axis, "keepdims": keepdims}
    if select_last_index:
        attrs["select_last_index"] = 1
    # Few distinct values, so that ties decide the index.
    x = np.random.default_rng(5).integers(0, 3, (3, 4, 5)).astype(np.float32)
    got = check_node(oh.make_node(op, ["x"], ["y"], **attrs), [x], opset=opset, rtol=0, atol=0)
    assert got[0].dtype == np.int64


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize(("shape", "dtype"), [((6,), np.int32), ((2, 1, 3, 1, 4), np.float16)])
def test_arg_reduce_shapes_and_dtypes(op: str, shape: tuple, dtype: type) -> None:
    x = np.random.default_rng(6).integers(-5, 5, shape).astype(dtype)
    check_node(oh.make_node(op, ["x"], ["y"], axis=-1, select_last_index=1), [x], opset=13)


def test_arg_max_select_last_index_picks_the_last_tie() -> None:
    node = oh.make_node("ArgMax", ["x"], ["y"], axis=1, keepdims=0, select_last_index=1)
    (got,) = _run_with_consts(node, [np.array([[1, 3, 3, 0], [2, 2, 2, 2]], np.float32)], 13, ())
    np.testing.assert_array_equal(got, [2, 3])


# --- CumSum -------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [11, 14])
@pytest.mark.parametrize("axis", [0, 1, -1, -3])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])
def test_cum_sum(opset: int, axis: int, exclusive: int, reverse: int, dtype: type) -> None:
    x = (np.random.default_rng(7).standard_normal((3, 4, 5)) * 10).astype(dtype)
    node = oh.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    check_node(node, [x, np.array(axis, np.int32)], opset=opset, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("shape", [(6,), (0, 3), (2, 1, 2, 1, 3)])
def test_cum_sum_constant_axis(exclusive: int, reverse: int, shape: tuple) -> None:
    x = np.random.default_rng(8).standard_normal(shape).astype(np.float64)
    node = oh.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    inputs = [x, np.array(len(shape) - 1, np.int64)]
    got = _run_with_consts(node, inputs, 14, const=(1,))
    _assert_same(got, run_reference(node, inputs, 14), rtol=1e-12)


def test_cum_sum_exclusive_reverse_example() -> None:
    node = oh.make_node("CumSum", ["x", "axis"], ["y"], exclusive=1, reverse=1)
    got = _run_with_consts(node, [np.array([1.0, 2.0, 3.0]), np.array(0)], 14, const=())
    np.testing.assert_array_equal(got[0], [5.0, 3.0, 0.0])


def test_cum_sum_rejects_out_of_range_axis() -> None:
    node = oh.make_node("CumSum", ["x", "axis"], ["y"])
    with pytest.raises(ValueError, match="axis"):
        _run_with_consts(node, [np.ones((2, 3)), np.array(2)], 14, const=())


# --- TopK ---------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [1, 10, 11, 24])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_top_k_versions(opset: int, axis: int, k: int) -> None:
    # Small integers give many ties; they must come out lower index first.
    x = np.random.default_rng(9).integers(0, 4, (5, 6, 5)).astype(np.float32)
    if opset < 10:
        node = oh.make_node("TopK", ["x"], ["values", "indices"], axis=axis, k=k)
        inputs = [x]
    else:
        node = oh.make_node("TopK", ["x", "k"], ["values", "indices"], axis=axis)
        inputs = [x, np.array([k], np.int64)]
    check_node(node, inputs, opset=opset, rtol=0, atol=0)


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize(
    ("shape", "dtype", "axis", "k"),
    [
        ((7,), np.float64, 0, 7),
        ((2, 1, 3, 1, 8), np.float16, -1, 2),
        ((4, 9), np.int64, 1, 4),
        ((4, 9), np.uint8, -1, 3),
        ((3, 4000), np.float32, -1, 20),
        ((3, 4000), np.int32, 1, 100),
        ((2, 2000, 2), np.int64, 1, 7),
        ((2, 2000, 2), np.float32, -2, 1),
    ],
)
def test_top_k_largest_and_smallest(
    largest: int, shape: tuple, dtype: type, axis: int, k: int
) -> None:
    # The long rows take the partition path; integers in a small range force ties there.
    rng = np.random.default_rng(10)
    if np.issubdtype(dtype, np.integer):
        x = rng.integers(0, 50, shape).astype(dtype)
    else:
        x = rng.standard_normal(shape).astype(dtype)
    node = oh.make_node("TopK", ["x", "k"], ["values", "indices"], axis=axis, largest=largest)
    check_node(node, [x, np.array([k], np.int64)], opset=11, rtol=0, atol=0)


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("n", [10, 3000])
def test_top_k_with_nan(largest: int, n: int) -> None:
    x = np.random.default_rng(11).standard_normal((2, n)).astype(np.float32)
    x[0, [1, 5]] = np.nan
    node = oh.make_node("TopK", ["x", "k"], ["values", "indices"], largest=largest)
    check_node(node, [x, np.array([4], np.int64)], opset=11, rtol=0, atol=0)


def test_top_k_constant_k() -> None:
    x = np.random.default_rng(12).standard_normal((3, 2000)).astype(np.float32)
    node = oh.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1, largest=0)
    inputs = [x, np.array([10], np.int64)]
    got = _run_with_consts(node, inputs, 11, const=(1,))
    _assert_same(got, run_reference(node, inputs, 11), rtol=0)


def test_top_k_rejects_k_larger_than_axis() -> None:
    node = oh.make_node("TopK", ["x", "k"], ["values", "indices"])
    with pytest.raises(ValueError, match="k=4"):
        _run_with_consts(node, [np.ones((2, 3)), np.array([4], np.int64)], 11, const=())
