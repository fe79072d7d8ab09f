"""Indexing kernels against onnx.reference."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

from aioinfer.devices.cpu.kernels.registry import find_kernel, make_spec
from tests.kernels._check import check_node, run_aioinfer, run_reference

RNG = np.random.default_rng(7)
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


@pytest.fixture(autouse=True)
def _reseed() -> None:
    """Give every test the same random stream, whichever tests run before it."""
    global RNG
    RNG = np.random.default_rng(7)


def rand(*shape: int, dtype: type = np.float32) -> np.ndarray:
    if np.issubdtype(dtype, np.integer):
        return RNG.integers(-50, 50, size=shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def indices(high: int, shape: tuple[int, ...], negative: bool = True) -> np.ndarray:
    """Random valid indices into an axis of length ``high``, some of them negative."""
    low = -high if negative else 0
    return RNG.integers(low, high, size=shape).astype(np.int64)


def unique_indices(high: int, count: int) -> np.ndarray:
    """``count`` distinct indices into an axis of length ``high``, some written negative."""
    picked = RNG.permutation(high)[:count]
    return np.where(RNG.random(count) < 0.5, picked - high, picked).astype(np.int64)


def assert_same(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> None:
    assert len(got) >= len(want)
    for g, w in zip(got, want, strict=False):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype, f"dtype {g.dtype}, want {w.dtype}"
        assert g.shape == w.shape, f"shape {g.shape}, want {w.shape}"
        np.testing.assert_array_equal(g, w)


def check_const(
    node: onnx.NodeProto, inputs: Sequence[np.ndarray | None], opset: int, const: Sequence[int]
) -> None:
    """check_node with run-time operands, then again with ``const`` inputs constant."""
    want = check_node(node, inputs, opset, rtol=0, atol=0)
    ir_node = ir.from_proto(node)
    entry = find_kernel(ir_node.domain, ir_node.op_type, opset)
    consts = [x if i in const else None for i, x in enumerate(inputs)]
    assert_same(list(entry.factory(make_spec(ir_node, opset, consts))(*inputs)), want)


def exact(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None], opset: int) -> None:
    check_node(node, inputs, opset, rtol=0, atol=0)


# -- Gather family ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "axis", "index_shape", "opset"),
    [((5, 4), 0, (3,), 1), ((5, 4), 1, (2, 3), 11), ((2, 3, 4), -1, (), 13),
     ((1, 2, 3, 4, 5), 3, (2, 2), 13), ((5, 4), 0, (0,), 13)],
)  # fmt: skip
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_gather(
    shape: tuple[int, ...], axis: int, index_shape: tuple[int, ...], opset: int, index_dtype: type
) -> None:
    idx = indices(shape[axis], index_shape, negative=opset >= 11).astype(index_dtype)
    exact(oh.make_node("Gather", ["x", "i"], ["y"], axis=axis), [rand(*shape), idx], opset)


def test_gather_out_of_range_raises() -> None:
    with pytest.raises(IndexError):
        run_aioinfer(oh.make_node("Gather", ["x", "i"], ["y"]), [rand(3), i64(3)], 13)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize(("shape", "axis"), [((4, 5), 0), ((4, 5), -1), ((2, 3, 4), 1), ((6,), 0)])
def test_gather_elements(shape: tuple[int, ...], axis: int, opset: int) -> None:
    index_shape = list(shape)
    index_shape[axis] = 3
    inputs = [rand(*shape), indices(shape[axis], tuple(index_shape))]
    node = oh.make_node("GatherElements", ["x", "i"], ["y"], axis=axis)
    # The reference mishandles negative axes; it runs the same axis counted from the front.
    ref = oh.make_node("GatherElements", ["x", "i"], ["y"], axis=axis % len(shape))
    assert_same(run_aioinfer(node, inputs, opset), run_reference(ref, inputs, opset))


def test_gather_elements_indices_smaller_than_data() -> None:
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    node = oh.make_node("GatherElements", ["x", "i"], ["y"], axis=1)
    (got,) = run_aioinfer(node, [data, np.array([[3, 0], [-1, 1]])], 13)
    np.testing.assert_array_equal(got, np.array([[3, 0], [7, 5]], dtype=np.float32))


@pytest.mark.parametrize(
    ("shape", "index_shape", "batch_dims", "opset"),
    [((4, 5), (3, 2), 0, 11), ((4, 5, 6), (2, 3, 1), 0, 12), ((2, 3, 4), (2, 2), 1, 12),
     ((2, 3, 4, 5), (2, 3, 2, 1), 2, 13), ((2, 3, 4), (2, 5, 2), 1, 13)],
)  # fmt: skip
def test_gather_nd(
    shape: tuple[int, ...], index_shape: tuple[int, ...], batch_dims: int, opset: int
) -> None:
    k = index_shape[-1]
    columns = [indices(shape[batch_dims + j], (*index_shape[:-1], 1)) for j in range(k)]
    idx = np.concatenate(columns, axis=-1)
    attrs = {"batch_dims": batch_dims} if opset >= 12 else {}
    exact(oh.make_node("GatherND", ["x", "i"], ["y"], **attrs), [rand(*shape), idx], opset)


def test_gather_nd_empty_index_tuples_take_whole_slices() -> None:
    data = rand(2, 3, 4)
    node = oh.make_node("GatherND", ["x", "i"], ["y"], batch_dims=1)
    (got,) = run_aioinfer(node, [data, np.zeros((2, 5, 0), np.int64)], 13)
    np.testing.assert_array_equal(got, np.repeat(data[:, None], 5, axis=1))


# -- Scatter family --------------------------------------------------------------------

REDUCTIONS = [("none", 11), ("none", 16), ("add", 16), ("mul", 16), ("max", 18), ("min", 18)]


@pytest.mark.parametrize(("reduction", "opset"), REDUCTIONS)
@pytest.mark.parametrize(("shape", "k"), [((4, 5), 2), ((4, 5, 3), 1), ((6,), 1)])
def test_scatter_nd(shape: tuple[int, ...], k: int, reduction: str, opset: int) -> None:
    count = 3
    if reduction == "none":  # distinct targets: the result of duplicates is unspecified
        flat = unique_indices(int(np.prod(shape[:k])), count)
        idx = np.stack(np.unravel_index(flat % int(np.prod(shape[:k])), shape[:k]), axis=-1)
    else:
        idx = np.stack([indices(shape[j], (count,)) for j in range(k)], axis=-1)
    updates = rand(count, *shape[k:])
    attrs = {"reduction": reduction} if opset >= 16 else {}
    node = oh.make_node("ScatterND", ["x", "i", "u"], ["y"], **attrs)
    check_node(node, [rand(*shape), idx.astype(np.int64), updates], opset, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("reduction", "opset"), REDUCTIONS)
@pytest.mark.parametrize(("shape", "axis"), [((4, 5), 0), ((4, 5), -1), ((3, 4, 5), 1)])
def test_scatter_elements(shape: tuple[int, ...], axis: int, reduction: str, opset: int) -> None:
    index_shape = list(shape)
    index_shape[axis] = 2
    if reduction == "none":
        cols = [unique_indices(shape[axis], 2) for _ in range(int(np.prod(index_shape)) // 2)]
        idx = np.moveaxis(np.array(cols).reshape(*np.delete(index_shape, axis), 2), -1, axis)
    else:
        idx = indices(shape[axis], tuple(index_shape))
    attrs = {"reduction": reduction} if opset >= 16 else {}
    node = oh.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=axis, **attrs)
    inputs = [rand(*shape), idx, rand(*index_shape)]
    check_node(node, inputs, opset, rtol=1e-6, atol=1e-6)


def test_scatter_elements_indices_smaller_than_data() -> None:
    node = oh.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1, reduction="add")
    inputs = [rand(3, 4), i64(1, 1, -1).reshape(1, 3), rand(1, 3)]
    check_node(node, inputs, 16, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("opset", [9, 10])
def test_scatter_is_scatter_elements(opset: int) -> None:
    inputs = [rand(4, 5), np.array([[1, 0, 3, 2, 0]]), rand(1, 5)]
    node = oh.make_node("Scatter", ["x", "i", "u"], ["y"], axis=0)
    ref = oh.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=0)
    assert_same(run_aioinfer(node, inputs, opset), run_reference(ref, inputs, 11))


def test_scatter_does_not_modify_its_input() -> None:
    data = rand(3, 4)
    data.setflags(write=False)
    node = oh.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction="add")
    (got,) = run_aioinfer(node, [data, i64(1).reshape(1, 1), np.ones((1, 4), np.float32)], 18)
    np.testing.assert_array_equal(got[1], data[1] + 1)


# -- Slice -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("starts", "ends", "axes"),
    [([1, 0], [3, 2], None), ([1], [-1], [2]), ([-3, 1], [100, 1000], [0, 1]), ([0], [0], [1])],
)
def test_slice_attributes(starts: list[int], ends: list[int], axes: list[int] | None) -> None:
    attrs = {} if axes is None else {"axes": axes}
    node = oh.make_node("Slice", ["x"], ["y"], starts=starts, ends=ends, **attrs)
    exact(node, [rand(4, 5, 6)], 1)


SLICES = [
    ([1, 0], [3, 2], None, None),
    ([1], [-1], [-1], None),
    ([-3, 1], [INT64_MAX, 1000], [0, 1], [1, 2]),
    ([INT64_MAX], [INT64_MIN], [2], [-1]),
    ([-1, 4], [-1000, 0], [1, -1], [-2, -3]),
    ([10], [-10], [0], [-1]),
    ([0], [0], [1], None),
    ([2, 0, 1], [3, INT64_MAX, 5], [0, 1, 2], [1, 3, 2]),
]


@pytest.mark.parametrize("opset", [10, 11, 13])
@pytest.mark.parametrize(("starts", "ends", "axes", "steps"), SLICES)
def test_slice_inputs(
    starts: list[int], ends: list[int], axes: list[int] | None, steps: list[int] | None, opset: int
) -> None:
    if opset == 10 and axes is not None and min(axes) < 0:
        axes = [a % 3 for a in axes]  # negative axes arrived in opset 11
    inputs = [rand(4, 5, 6), i64(*starts), i64(*ends)]
    if axes is not None:
        inputs.append(i64(*axes))
    if steps is not None:
        if axes is None:
            inputs.append(np.arange(len(starts), dtype=np.int64))
        inputs.append(i64(*steps))
    names = ["x", "s", "e", "a", "p"][: len(inputs)]
    check_const(oh.make_node("Slice", names, ["y"]), inputs, opset, const=(1, 2, 3, 4))


def test_slice_with_constant_operands_keys_each_input_shape() -> None:
    """The numpy index a constant Slice keeps per input shape: alternating shapes give
    each its own clamped index."""
    node = oh.make_node("Slice", ["x", "s", "e", "a"], ["y"])
    ir_node = ir.from_proto(node)
    operands = [i64(1), i64(-1), i64(1)]
    run = find_kernel("", "Slice", 13).factory(make_spec(ir_node, 13, [None, *operands]))
    for shape in [(2, 5), (3, 2), (2, 5), (1, 1), (3, 2)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        (y,) = run(x, *operands)
        np.testing.assert_array_equal(y, run_reference(node, [x, *operands], 13)[0])


@pytest.mark.parametrize(
    ("shape", "axis", "index"), [((5,), 0, -2), ((2, 1, 3), 0, 1), ((2, 4), 1, 3)]
)
def test_gather_of_a_constant_scalar_index_is_a_view(
    shape: tuple[int, ...], axis: int, index: int
) -> None:
    """The constant scalar path: onnx.reference's values, as a view of the data (0-d for
    a vector); an index out of range is still an error."""
    node = oh.make_node("Gather", ["x", "i"], ["y"], axis=axis)
    index_array = np.array(index, np.int64)
    run = find_kernel("", "Gather", 13).factory(
        make_spec(ir.from_proto(node), 13, [None, index_array])
    )
    x = RNG.standard_normal(shape).astype(np.float32)
    (y,) = run(x, index_array)
    assert type(y) is np.ndarray and np.shares_memory(y, x)
    assert_same([y], run_reference(node, [x, index_array], 13))
    with pytest.raises(IndexError):
        run(RNG.standard_normal((1, 1, 1)).astype(np.float32), index_array)


@pytest.mark.parametrize(("shape", "axis", "index"), [((5,), 0, -2), ((2, 4), 1, 3)])
def test_gather_of_a_scalar_index_given_at_run_time_is_a_view(
    shape: tuple[int, ...], axis: int, index: int
) -> None:
    """A scalar index that is not a constant of the node (a branch's constant, folded
    when specialisation inlines the branch) takes basic indexing too: onnx.reference's
    values, as a view of the data; an index out of range is still an error."""
    node = oh.make_node("Gather", ["x", "i"], ["y"], axis=axis)
    index_array = np.array(index, np.int64)
    x = RNG.standard_normal(shape).astype(np.float32)
    (y,) = run_aioinfer(node, [x, index_array], 13)
    assert type(y) is np.ndarray and np.shares_memory(y, x)
    assert_same([y], run_reference(node, [x, index_array], 13))
    with pytest.raises(IndexError):
        run_aioinfer(node, [RNG.standard_normal((1, 1)).astype(np.float32), index_array], 13)


def test_gather_of_a_scalar_index_into_a_vector_is_an_array() -> None:
    index = np.array(1, np.int64)  # 0-d
    (y,) = run_aioinfer(oh.make_node("Gather", ["x", "i"], ["y"]), [i64(4, 5, 6), index], 13)
    assert type(y) is np.ndarray and y.shape == () and y == 5


def test_slice_negative_step_clamps_start_to_first_element() -> None:
    # start -10 -> -5 -> clamped to 0; end -20 -> -15 -> clamped to -1 (before the start):
    # the specification keeps element 0 where Python's slicing would keep nothing.
    node = oh.make_node("Slice", ["x", "s", "e", "a", "p"], ["y"])
    x = np.arange(5, dtype=np.float32)
    (got,) = run_aioinfer(node, [x, i64(-10), i64(-20), i64(0), i64(-1)], 13)
    np.testing.assert_array_equal(got, np.array([0], dtype=np.float32))


@pytest.mark.parametrize(
    ("inputs", "match"),
    [([i64(0), i64(1), i64(0), i64(0)], "steps"), ([i64(0, 0), i64(1, 1), i64(0, -2)], "repeated"),
     ([i64(0), i64(1, 2)], "length"), ([i64(0), i64(1), i64(3)], "out of range")],
)  # fmt: skip
def test_slice_errors(inputs: list[np.ndarray], match: str) -> None:
    names = ["x", "s", "e", "a", "p"][: len(inputs) + 1]
    with pytest.raises(ValueError, match=match):
        run_aioinfer(oh.make_node("Slice", names, ["y"]), [rand(2, 2), *inputs], 13)


# -- NonZero, OneHot, Compress, ReverseSequence, Unique, EyeLike -----------------------


@pytest.mark.parametrize("opset", [9, 13])
@pytest.mark.parametrize(
    "x",
    [np.array([0, 1, 0, 3], np.float32), rand(2, 3, 4, dtype=np.int32) % 3,
     np.array([[True, False], [False, True]]), np.zeros((2, 0), np.float32),
     np.array(5.0, np.float32), np.zeros((1, 2, 1, 2, 3), np.int64)],
)  # fmt: skip
def test_non_zero(x: np.ndarray, opset: int) -> None:
    exact(oh.make_node("NonZero", ["x"], ["y"]), [x], opset)


def test_one_hot_keeps_a_class_column_per_depth_and_rank() -> None:
    """One kernel, inputs of several ranks and depths in turn (its cached columns are
    keyed by both): onnx.reference's values every time."""
    node = oh.make_node("OneHot", ["i", "d", "v"], ["y"], axis=1)
    run = find_kernel("", "OneHot", 11).factory(make_spec(ir.from_proto(node), 11))
    values = np.array([0, 1], np.float32)
    for indices, depth in [
        (i64(0, 2), 3),
        (np.array([[1, -1], [0, 4]], np.int64), 5),
        (i64(1, 0), 3),
        (np.array([[2, 0]], np.int64), 3),
    ]:
        inputs = [indices, np.array(depth, np.int64), values]
        assert_same(list(run(*inputs)), run_reference(node, inputs, 11))


@pytest.mark.parametrize("opset", [9, 11])
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize(
    ("index_values", "depth", "values"),
    [(np.array([[0, 3], [-1, 7]]), np.array(5), np.array([0, 1], np.float32)),
     (np.array([[1.0, 2.0], [0.0, -2.0]], np.float32), np.array(3.0, np.float32),
      np.array([-2, 9], np.int32))],
)  # fmt: skip
def test_one_hot(
    index_values: np.ndarray, depth: np.ndarray, values: np.ndarray, axis: int, opset: int
) -> None:
    node = oh.make_node("OneHot", ["i", "d", "v"], ["y"], axis=axis)
    exact(node, [index_values, depth, values], opset)


@pytest.mark.parametrize("opset", [9, 11])
@pytest.mark.parametrize(
    ("axis", "condition"),
    [(None, [True, False, True]), (0, [False, True, True]), (1, [True, False]),
     (-1, [False, True, False, True]), (0, [False, False, False])],
)  # fmt: skip
def test_compress(axis: int | None, condition: list[bool], opset: int) -> None:
    if opset == 9 and axis is not None and axis < 0:
        axis += 3
    attrs = {} if axis is None else {"axis": axis}
    node = oh.make_node("Compress", ["x", "c"], ["y"], **attrs)
    exact(node, [rand(3, 4, 4), np.array(condition)], opset)


@pytest.mark.parametrize(
    ("batch_axis", "time_axis", "shape", "lens"),
    [(1, 0, (4, 3), [4, 1, 2]), (0, 1, (3, 5, 2), [5, 0, 3]), (0, 1, (2, 4, 2, 3), [1, 4])],
)
def test_reverse_sequence(
    batch_axis: int, time_axis: int, shape: tuple[int, ...], lens: list[int]
) -> None:
    node = oh.make_node(
        "ReverseSequence", ["x", "l"], ["y"], batch_axis=batch_axis, time_axis=time_axis
    )
    exact(node, [rand(*shape), i64(*lens)], 10)


UNIQUE_INPUT = np.array([[2, 1, 2], [0, 5, 0], [2, 1, 2], [7, 5, 7]], dtype=np.float32)


@pytest.mark.parametrize(
    ("x", "axis", "keep_sorted"),
    [(np.array([3, 1, 3, 2, 1, 5], np.int64), None, 1),
     (np.array([3, 1, 3, 2, 1, 5], np.int64), None, 0),
     (UNIQUE_INPUT, None, 1), (UNIQUE_INPUT, 0, 1), (UNIQUE_INPUT, 0, 0),
     (UNIQUE_INPUT, 1, 1), (UNIQUE_INPUT, -1, 1), (np.zeros(0, np.float32), None, 1)],
)  # fmt: skip
def test_unique(x: np.ndarray, axis: int | None, keep_sorted: int) -> None:
    attrs = {"sorted": keep_sorted} if axis is None else {"sorted": keep_sorted, "axis": axis}
    exact(oh.make_node("Unique", ["x"], ["y", "first", "inverse", "counts"], **attrs), [x], 11)


def test_unique_unsorted_flattens_and_keeps_first_occurrence_order() -> None:
    node = oh.make_node("Unique", ["x"], ["y", "first", "inverse", "counts"], sorted=0)
    y, first, inverse, counts = run_aioinfer(node, [UNIQUE_INPUT], 11)
    np.testing.assert_array_equal(y, np.array([2, 1, 0, 5, 7], np.float32))
    np.testing.assert_array_equal(first, i64(0, 1, 3, 4, 9))
    np.testing.assert_array_equal(inverse, i64(0, 1, 0, 2, 3, 2, 0, 1, 0, 4, 3, 4))
    np.testing.assert_array_equal(counts, i64(4, 2, 2, 2, 2))


@pytest.mark.parametrize("opset", [9, 22])
@pytest.mark.parametrize(
    ("shape", "attrs"),
    [((3, 4), {}), ((4, 3), {"k": -1}), ((3, 3), {"k": 2, "dtype": onnx.TensorProto.INT32}),
     ((2, 5), {"dtype": onnx.TensorProto.DOUBLE, "k": 7})],
)  # fmt: skip
def test_eye_like(shape: tuple[int, ...], attrs: dict, opset: int) -> None:
    exact(oh.make_node("EyeLike", ["x"], ["y"], **attrs), [rand(*shape)], opset)
