"""Shape-manipulation kernels (and Resize/Upsample) against onnx.reference."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

from aioinfer.devices.cpu.kernels import resize  # noqa: F401  (registers Resize, Upsample)
from aioinfer.devices.cpu.kernels.registry import find_kernel, make_spec
from tests.kernels._check import check_node, run_aioinfer, run_reference

RNG = np.random.default_rng(20240611)


@pytest.fixture(autouse=True)
def _reseed() -> None:
    """Give every test the same random stream, whichever tests run before it."""
    global RNG
    RNG = np.random.default_rng(20240611)


F32 = {"rtol": 1e-5, "atol": 1e-6}
"""Tolerance of float32 results computed in float32 from a handful of terms."""
CUBIC = {"rtol": 1e-5, "atol": 1e-5}
"""The reference computes cubic weights in float32 (cubic_coeff_a is a float32 scalar)."""


def rand(*shape: int, dtype: type = np.float32) -> np.ndarray:
    if np.issubdtype(dtype, np.integer):
        return RNG.integers(-50, 50, size=shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def i64(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def assert_same(got: Sequence[np.ndarray], want: Sequence[np.ndarray], **tol: float) -> None:
    assert len(got) >= len(want)
    for g, w in zip(got, want, strict=False):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype, f"dtype {g.dtype}, want {w.dtype}"
        assert g.shape == w.shape, f"shape {g.shape}, want {w.shape}"
        np.testing.assert_allclose(g, w, rtol=tol.get("rtol", 0), atol=tol.get("atol", 0))


def run_const(
    node: onnx.NodeProto, inputs: Sequence[np.ndarray | None], opset: int, const: Sequence[int]
) -> list[np.ndarray]:
    """Run our kernel with the inputs at positions ``const`` known at compile time."""
    ir_node = ir.from_proto(node)
    entry = find_kernel(ir_node.domain, ir_node.op_type, opset)
    consts = [x if i in const else None for i, x in enumerate(inputs)]
    return list(entry.factory(make_spec(ir_node, opset, consts))(*inputs))


def check_const(
    node: onnx.NodeProto,
    inputs: Sequence[np.ndarray | None],
    opset: int,
    const: Sequence[int] = (1,),
    **tol: float,
) -> None:
    """check_node with run-time operands, then again with ``const`` inputs constant."""
    want = check_node(node, inputs, opset, **tol)
    assert_same(run_const(node, inputs, opset, const), want)


def check_like(
    node: onnx.NodeProto,
    inputs: Sequence[np.ndarray | None],
    opset: int,
    ref_node: onnx.NodeProto,
    ref_inputs: Sequence[np.ndarray | None],
    ref_opset: int,
    **tol: float,
) -> None:
    """Our ``node`` at ``opset`` against the reference running an equivalent node."""
    assert_same(
        run_aioinfer(node, inputs, opset), run_reference(ref_node, ref_inputs, ref_opset), **tol
    )


# -- Reshape, Flatten, Transpose, Squeeze, Unsqueeze ----------------------------------


@pytest.mark.parametrize("opset", [5, 13, 21])
@pytest.mark.parametrize(
    ("in_shape", "target"),
    [
        ((2, 3, 4), [4, 0, -1]),
        ((2, 3, 4), [-1]),
        ((2, 3, 4), [2, -1, 2]),
        ((1, 1, 1, 1, 5), [5, 1]),
        ((0, 3), [3, -1]),
        ((6,), [1, 2, 1, 3, 1]),
    ],
)
def test_reshape(in_shape: tuple[int, ...], target: list[int], opset: int) -> None:
    node = oh.make_node("Reshape", ["x", "s"], ["y"])
    check_const(node, [rand(*in_shape), i64(*target)], opset)


def test_reshape_allowzero_keeps_zero() -> None:
    node = oh.make_node("Reshape", ["x", "s"], ["y"], allowzero=1)
    check_const(node, [rand(0, 3), i64(3, 0)], 14)


def test_reshape_attribute_before_opset_5() -> None:
    x = rand(2, 3, 4)
    node = oh.make_node("Reshape", ["x"], ["y"], shape=[4, 0, -1])
    check_like(node, [x], 1, oh.make_node("Reshape", ["x", "s"], ["y"]), [x, i64(4, 0, -1)], 5)


def test_reshape_copy_beyond_rank_is_an_error() -> None:
    node = oh.make_node("Reshape", ["x", "s"], ["y"])
    with pytest.raises(ValueError, match="copies dimension 2"):
        run_aioinfer(node, [rand(6), i64(1, 6, 0)], 13)


@pytest.mark.parametrize(
    ("shape", "axis", "opset"),
    [((2, 3, 4, 5), 0, 9), ((2, 3, 4, 5), 2, 1), ((2, 3, 4, 5), 4, 11), ((2, 3, 4, 5), -1, 13),
     ((2, 3, 4, 5), -4, 21), ((5,), 1, 11), ((2, 0, 3), 1, 13)],
)  # fmt: skip
def test_flatten(shape: tuple[int, ...], axis: int, opset: int) -> None:
    check_node(oh.make_node("Flatten", ["x"], ["y"], axis=axis), [rand(*shape)], opset)


@pytest.mark.parametrize("opset", [1, 13, 21])
@pytest.mark.parametrize(
    ("shape", "perm"),
    [((2, 3, 4), None), ((2, 3, 4), [1, 0, 2]), ((1, 2, 3, 4, 5), [4, 2, 0, 3, 1])],
)
def test_transpose(shape: tuple[int, ...], perm: list[int] | None, opset: int) -> None:
    attrs = {} if perm is None else {"perm": perm}
    check_node(oh.make_node("Transpose", ["x"], ["y"], **attrs), [rand(*shape)], opset)


@pytest.mark.parametrize(("axes", "opset"), [([0], 1), ([0, 4], 1), (None, 1), ([0, -1], 11)])
def test_squeeze_attribute(axes: list[int] | None, opset: int) -> None:
    attrs = {} if axes is None else {"axes": axes}
    check_node(oh.make_node("Squeeze", ["x"], ["y"], **attrs), [rand(1, 3, 1, 4, 1)], opset)


@pytest.mark.parametrize("opset", [13, 21])
@pytest.mark.parametrize("axes", [[0], [-1, 2], []])
def test_squeeze_input(axes: list[int], opset: int) -> None:
    node = oh.make_node("Squeeze", ["x", "a"], ["y"])
    x = rand(1, 3, 1, 4, 1)
    if axes:
        check_const(node, [x, i64(*axes)], opset)
    else:
        check_node(oh.make_node("Squeeze", ["x"], ["y"]), [x], opset)


def test_squeeze_non_unit_axis_is_an_error() -> None:
    node = oh.make_node("Squeeze", ["x", "a"], ["y"])
    with pytest.raises(ValueError, match="not 1"):
        run_aioinfer(node, [rand(2, 1), i64(0)], 13)


@pytest.mark.parametrize(("axes", "opset"), [([0], 1), ([0, -1], 11), ([0, 2, 4], 11)])
def test_unsqueeze_attribute(axes: list[int], opset: int) -> None:
    check_node(oh.make_node("Unsqueeze", ["x"], ["y"], axes=axes), [rand(3, 4)], opset)


def test_unsqueeze_axes_in_any_order() -> None:
    x = rand(3, 4)
    node = oh.make_node("Unsqueeze", ["x"], ["y"], axes=[4, 0, 2])
    check_like(node, [x], 11, oh.make_node("Unsqueeze", ["x"], ["y"], axes=[0, 2, 4]), [x], 11)


@pytest.mark.parametrize("opset", [13, 21])
@pytest.mark.parametrize(("shape", "axes"), [((3, 4), [1, 3]), ((), [0]), ((2, 3), [-1, 0])])
def test_unsqueeze_input(shape: tuple[int, ...], axes: list[int], opset: int) -> None:
    node = oh.make_node("Unsqueeze", ["x", "a"], ["y"])
    check_const(node, [rand(*shape), i64(*axes)], opset)


def _bound_with_constant_axes(op: str, axes: list[int]) -> object:
    """One kernel instance of ``op`` with constant ``axes`` (input 1, opset 13)."""
    ir_node = ir.from_proto(oh.make_node(op, ["x", "a"], ["y"]))
    entry = find_kernel("", op, 13)
    return entry.factory(make_spec(ir_node, 13, [None, i64(*axes)]))


def test_squeeze_with_constant_axes_indexes_a_view_once_made_per_rank() -> None:
    """The indexed path: the same kernel on inputs of several shapes and ranks gives
    np.squeeze's results as views of the input; dropping every axis gives a 0-d array
    (not a numpy scalar), and a non-unit axis is still an error."""
    run = _bound_with_constant_axes("Squeeze", [0, -1])
    for shape in [(1, 3, 1), (1, 5, 1), (1, 2, 3, 1), (1, 1), (1, 3, 1)]:
        x = rand(*shape)
        (y,) = run(x, None)  # type: ignore[operator]
        assert type(y) is np.ndarray and np.shares_memory(y, x)
        np.testing.assert_array_equal(y, np.squeeze(x, axis=(0, len(shape) - 1)))
    with pytest.raises(ValueError, match="not 1"):
        run(rand(1, 3, 2), None)  # type: ignore[operator]


def test_unsqueeze_with_constant_axes_indexes_a_view_once_made_per_rank() -> None:
    run = _bound_with_constant_axes("Unsqueeze", [-1, 0])
    for shape in [(3, 4), (), (5,), (3, 4), (2, 3, 4)]:
        x = rand(*shape)
        (y,) = run(x, None)  # type: ignore[operator]
        assert np.shares_memory(y, x) or x.size == 0
        np.testing.assert_array_equal(y, np.expand_dims(x, (0, len(shape) + 1)))
    with pytest.raises(ValueError, match="repeat"):
        _bound_with_constant_axes("Unsqueeze", [0, -3])(rand(4), None)  # type: ignore[operator]


def test_expand_copies_small_outputs_and_broadcasts_large_ones() -> None:
    """Up to _EXPAND_COPY_ELEMENTS the output is a fresh array, beyond it a broadcast
    view of the input; the same values either way, for constant and run-time shapes."""
    from aioinfer.devices.cpu.kernels.shape import _EXPAND_COPY_ELEMENTS

    node = oh.make_node("Expand", ["x", "s"], ["y"])
    ir_node = ir.from_proto(node)
    x = rand(3, 1)
    for width in (4, _EXPAND_COPY_ELEMENTS // 3 + 1, 4):
        shape = i64(2, 3, width)
        want = run_reference(node, [x, shape], 13)[0]
        for consts in ([None, None], [None, shape]):
            run = find_kernel("", "Expand", 13).factory(make_spec(ir_node, 13, consts))
            (y,) = run(x, shape)
            np.testing.assert_array_equal(y, want)
            assert np.shares_memory(y, x) == (y.size > _EXPAND_COPY_ELEMENTS)


# -- Concat, Split, Expand, Tile -------------------------------------------------------


@pytest.mark.parametrize(
    ("shapes", "axis", "opset"),
    [([(2, 3), (2, 5), (2, 1)], -1, 11), ([(0, 3), (2, 3)], 0, 13), ([(2, 3, 4)], 1, 4),
     ([(1, 2, 1, 2, 2), (1, 2, 3, 2, 2)], 2, 13), ([(2, 1), (2, 2)], 1, 1)],
)  # fmt: skip
def test_concat(shapes: list[tuple[int, ...]], axis: int, opset: int) -> None:
    names = [f"x{i}" for i in range(len(shapes))]
    node = oh.make_node("Concat", names, ["y"], axis=axis)
    check_node(node, [rand(*s) for s in shapes], opset)


@pytest.mark.parametrize(
    ("shape", "axis", "split", "outputs", "opset"),
    [((2, 4), 1, [1, 3], 2, 2), ((6, 2), 0, None, 3, 11), ((2, 3, 5), -1, [2, 0, 3], 3, 11),
     ((4, 5), 1, [2, 3], 2, 13), ((6, 2), 0, None, 2, 13), ((4, 7), 1, None, 3, 18)],
)  # fmt: skip
def test_split(
    shape: tuple[int, ...], axis: int, split: list[int] | None, outputs: int, opset: int
) -> None:
    out = [f"y{i}" for i in range(outputs)]
    x = rand(*shape)
    attrs: dict = {"axis": axis}
    if opset >= 18 and split is None:
        attrs["num_outputs"] = outputs
    if opset < 13:
        if split is not None:
            attrs["split"] = split
        check_node(oh.make_node("Split", ["x"], out, **attrs), [x], opset)
    elif split is None:
        check_node(oh.make_node("Split", ["x"], out, **attrs), [x], opset)
    else:
        check_const(oh.make_node("Split", ["x", "s"], out, **attrs), [x, i64(*split)], opset)


def test_split_opset_1_takes_sizes_as_input() -> None:
    x = rand(3, 5)
    node = oh.make_node("Split", ["x", "s"], ["a", "b"], axis=1)
    ref = oh.make_node("Split", ["x", "s"], ["a", "b"], axis=1)
    check_like(node, [x, i64(1, 4)], 1, ref, [x, i64(1, 4)], 13)


def test_split_that_cannot_fit_is_an_error() -> None:
    node = oh.make_node("Split", ["x"], ["a", "b", "c", "d"], num_outputs=4)
    with pytest.raises(ValueError, match="cannot be split"):
        run_aioinfer(node, [rand(5)], 18)


@pytest.mark.parametrize("opset", [8, 13])
@pytest.mark.parametrize(
    ("shape", "target"),
    [((3, 1), [2, 1, 6]), ((2, 3, 4), [3, 1]), ((), [2, 2]), ((1, 1, 1, 1, 2), [3, 1, 1, 1, 1])],
)
def test_expand(shape: tuple[int, ...], target: list[int], opset: int) -> None:
    check_const(oh.make_node("Expand", ["x", "s"], ["y"]), [rand(*shape), i64(*target)], opset)


@pytest.mark.parametrize("opset", [6, 13])
@pytest.mark.parametrize(
    ("shape", "reps"),
    [
        ((2, 3, 4), [2, 1, 3]),
        ((2, 3), [0, 2]),
        ((5,), [1]),
        # Only unit axes repeat (the broadcast-copy path), a zero repeat among them.
        ((1, 30, 1), [1, 1, 8]),
        ((1, 3, 1), [4, 1, 0]),
        ((3, 1), [1, 5]),
    ],
)
def test_tile(shape: tuple[int, ...], reps: list[int], opset: int) -> None:
    check_const(oh.make_node("Tile", ["x", "r"], ["y"]), [rand(*shape), i64(*reps)], opset)


# -- Pad --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_attributes(mode: str) -> None:
    x = rand(3, 4, 5)
    check_node(
        oh.make_node("Pad", ["x"], ["y"], mode=mode, pads=[1, 0, 2, 2, 3, 0], value=1.5), [x], 2
    )
    check_node(oh.make_node("Pad", ["x"], ["y"], mode=mode, paddings=[0, 2, 1, 1, 0, 2]), [x], 1)


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
@pytest.mark.parametrize(("mode", "opset"), [("constant", 11), ("reflect", 13), ("edge", 18)])
def test_pad_inputs(mode: str, opset: int, dtype: type) -> None:
    x = rand(2, 3, 4, dtype=dtype)
    value = np.array(7, dtype=dtype)
    node = oh.make_node("Pad", ["x", "p", "v"], ["y"], mode=mode)
    check_const(node, [x, i64(0, 1, 2, 1, 0, 3), value], opset, const=(1, 2))
    check_node(oh.make_node("Pad", ["x", "p"], ["y"], mode=mode), [x, i64(1, 1, 1, 1, 1, 1)], opset)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_axes_and_wrap(mode: str) -> None:
    node = oh.make_node("Pad", ["x", "p", "v", "a"], ["y"], mode=mode)
    inputs = [rand(1, 2, 3, 4, 5), i64(2, 1, 3, 2), f32(-1), i64(-1, 2)]
    check_const(node, inputs, 19, const=(1, 2, 3))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize(
    ("shape", "pads"),
    [
        ((1, 512), (0, 64, 0, 64)),  # Silero VAD's reflect Pad
        ((7,), (6, 6)),  # reflect's largest pads (one less than the axis)
        ((2, 3, 4, 5), (0, 2, 3, 1, 1, 0, 2, 4)),
        ((3, 4), (0, 0, 0, 3)),
    ],
)
def test_pad_sliced_matches_reference(mode: str, shape: tuple[int, ...], pads: tuple) -> None:
    """Constant, reflect and edge padding by slices (np.pad only for wrap and what
    reflect cannot do) equal onnx.reference exactly."""
    node = oh.make_node("Pad", ["x", "p", "v"], ["y"], mode=mode)
    for dtype in (np.float32, np.int64):
        x = rand(*shape, dtype=dtype)
        check_node(node, [x, i64(*pads), np.array(3, dtype=dtype)], 18, rtol=0, atol=0)


def test_pad_reflect_beyond_the_axis_and_edge_of_empty_axis_follow_numpy() -> None:
    """Cases the slices do not cover fall back to np.pad: reflect pads as long as the
    axis reflect repeatedly; edge-padding an empty axis is an error."""
    x = np.arange(3, dtype=np.float32)
    (got,) = run_aioinfer(
        oh.make_node("Pad", ["x", "p"], ["y"], mode="reflect"), [x, i64(4, 0)], 18
    )
    np.testing.assert_array_equal(got, np.pad(x, (4, 0), mode="reflect"))
    with pytest.raises(ValueError):
        run_aioinfer(
            oh.make_node("Pad", ["x", "p"], ["y"], mode="edge"),
            [np.zeros((2, 0), np.float32), i64(0, 1, 0, 1)],
            18,
        )


@pytest.mark.parametrize("mode", ["constant", "edge"])
def test_pad_negative_pads_crop(mode: str) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    node = oh.make_node("Pad", ["x", "p"], ["y"], mode=mode)
    (got,) = run_aioinfer(node, [x, i64(-1, 1, 1, -2)], 11)
    if mode == "constant":
        want = [[0, 4, 5], [0, 8, 9], [0, 0, 0]]
    else:
        want = [[4, 4, 5], [8, 8, 9], [8, 8, 9]]
    np.testing.assert_array_equal(got, np.array(want, dtype=np.float32))


def test_pad_wrong_pads_length_is_an_error() -> None:
    with pytest.raises(ValueError, match="3 pads"):
        run_aioinfer(oh.make_node("Pad", ["x", "p"], ["y"]), [rand(2, 2), i64(1, 1, 1)], 11)


# -- Shape, Size, ConstantOfShape, Range -----------------------------------------------


@pytest.mark.parametrize(
    ("attrs", "opset"),
    [({}, 1), ({}, 15), ({"start": 1}, 15), ({"end": -1}, 19), ({"start": -10, "end": 10}, 15),
     ({"start": 2, "end": 1}, 21), ({"start": -2}, 15)],
)  # fmt: skip
def test_shape(attrs: dict, opset: int) -> None:
    check_node(oh.make_node("Shape", ["x"], ["y"], **attrs), [rand(2, 3, 4, 5)], opset)


@pytest.mark.parametrize("opset", [1, 13, 21])
@pytest.mark.parametrize("shape", [(2, 3, 4), (), (3, 0)])
def test_size(shape: tuple[int, ...], opset: int) -> None:
    check_node(oh.make_node("Size", ["x"], ["y"]), [rand(*shape)], opset)


@pytest.mark.parametrize("opset", [9, 20, 21])
@pytest.mark.parametrize("value", [None, np.array([3], np.int64), np.array([1.5], np.float16)])
@pytest.mark.parametrize("shape", [[2, 3], [], [4, 0]])
def test_constant_of_shape(shape: list[int], value: np.ndarray | None, opset: int) -> None:
    attrs = {} if value is None else {"value": onnx.numpy_helper.from_array(value)}
    node = oh.make_node("ConstantOfShape", ["s"], ["y"], **attrs)
    check_const(node, [np.array(shape, dtype=np.int64)], opset, const=(0,))


@pytest.mark.parametrize(
    ("start", "limit", "delta"),
    [(np.int32(1), np.int32(10), np.int32(3)), (np.float32(0.5), np.float32(3), np.float32(0.25)),
     (np.int64(10), np.int64(-3), np.int64(-4)), (np.float64(1), np.float64(0), np.float64(1)),
     (np.int16(-2), np.int16(2), np.int16(1))],
)  # fmt: skip
def test_range(start: np.generic, limit: np.generic, delta: np.generic) -> None:
    node = oh.make_node("Range", ["a", "b", "c"], ["y"])
    check_node(node, [np.array(start), np.array(limit), np.array(delta)], 11)


# -- DepthToSpace, SpaceToDepth, Trilu ---------------------------------------------------


@pytest.mark.parametrize(("mode", "opset"), [(None, 1), ("DCR", 11), ("CRD", 11), ("CRD", 13)])
def test_depth_to_space(mode: str | None, opset: int) -> None:
    attrs = {} if mode is None else {"mode": mode}
    node = oh.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, **attrs)
    check_node(node, [rand(2, 12, 3, 5)], opset)


@pytest.mark.parametrize("opset", [1, 13])
@pytest.mark.parametrize("blocksize", [2, 3])
def test_space_to_depth(blocksize: int, opset: int) -> None:
    node = oh.make_node("SpaceToDepth", ["x"], ["y"], blocksize=blocksize)
    check_node(node, [rand(2, 3, 6, 12)], opset)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize(
    ("shape", "k"), [((4, 5), 0), ((2, 4, 3), -1), ((3, 3), 2), ((5, 2), None)]
)
def test_trilu(shape: tuple[int, ...], k: int | None, upper: int) -> None:
    x = rand(*shape)
    if k is None:
        check_node(oh.make_node("Trilu", ["x"], ["y"], upper=upper), [x], 14)
    else:
        check_const(oh.make_node("Trilu", ["x", "k"], ["y"], upper=upper), [x, i64(k)[0]], 14)


# -- Resize, Upsample ------------------------------------------------------------------

COORDINATE_MODES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
SCALES = [f32(1, 1, 2, 3), f32(1, 1, 0.6, 0.8), f32(1, 1, 1.7, 0.5)]
"""Enlarging, shrinking by non-integral factors, and a mix of both."""


def resize_node(inputs: Sequence[np.ndarray | None], **attrs: object) -> onnx.NodeProto:
    """A Resize node whose omitted inputs are those given as None."""
    names = [
        "" if v is None else n
        for n, v in zip(("x", "roi", "scales", "sizes"), inputs, strict=False)
    ]
    while names[-1] == "":
        names.pop()
    return oh.make_node("Resize", names, ["y"], **attrs)


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("coordinate_mode", COORDINATE_MODES)
@pytest.mark.parametrize("nearest_mode", NEAREST_MODES)
def test_resize_nearest(nearest_mode: str, coordinate_mode: str, scales: np.ndarray) -> None:
    inputs = [rand(2, 3, 5, 7), None, scales, None]
    node = resize_node(
        inputs,
        mode="nearest",
        nearest_mode=nearest_mode,
        coordinate_transformation_mode=coordinate_mode,
    )
    check_node(node, inputs, 19)


@pytest.mark.parametrize("opset", [11, 13, 19])
@pytest.mark.parametrize("coordinate_mode", COORDINATE_MODES)
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("scales", SCALES)
def test_resize_linear_and_cubic_scales(
    scales: np.ndarray, mode: str, coordinate_mode: str, opset: int
) -> None:
    inputs = [rand(2, 3, 5, 7), f32() if opset == 11 else None, scales, None]
    node = resize_node(inputs, mode=mode, coordinate_transformation_mode=coordinate_mode)
    check_const(node, inputs, opset, const=(1, 2), **(CUBIC if mode == "cubic" else F32))


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_half_pixel_symmetric(mode: str) -> None:
    # Scales chosen so no source coordinate lands within an ulp above an integer: there
    # the reference's tap window is off by one (see the test below for such a case).
    scales = f32(1, 1, 1.7, 1.3) if mode == "nearest" else f32(1, 1, 1.5, 0.6)
    inputs = [rand(2, 3, 5, 7), None, scales, None]
    node = resize_node(inputs, mode=mode, coordinate_transformation_mode="half_pixel_symmetric")
    check_node(node, inputs, 19, **CUBIC)


def test_resize_half_pixel_symmetric_nearest_shrink() -> None:
    # 7 -> 3: offset = 3.5 * (1 - 3 / 3.5) = 0.5, so x_original = 2 * x_resized + 1.
    inputs = [np.arange(7, dtype=np.float32).reshape(1, 1, 1, 7), None, f32(1, 1, 1, 0.5)]
    node = resize_node(
        inputs, mode="nearest", coordinate_transformation_mode="half_pixel_symmetric"
    )
    (got,) = run_aioinfer(node, inputs, 19)
    np.testing.assert_array_equal(got.reshape(-1), f32(1, 3, 5))


@pytest.mark.parametrize("exclude_outside", [0, 1])
@pytest.mark.parametrize("cubic_a", [-0.5, -0.75])
@pytest.mark.parametrize("sizes", [i64(1, 2, 9, 4), i64(1, 2, 1, 11)])
def test_resize_cubic_sizes(sizes: np.ndarray, cubic_a: float, exclude_outside: int) -> None:
    inputs = [rand(1, 2, 6, 5), None, None, sizes]
    node = resize_node(inputs, mode="cubic", cubic_coeff_a=cubic_a, exclude_outside=exclude_outside)
    check_const(node, inputs, 13, const=(3,), **CUBIC)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("sizes", [i64(3, 2, 4), i64(1, 7, 9)])
def test_resize_rank3_and_rank5_sizes(sizes: np.ndarray, mode: str) -> None:
    inputs = [rand(2, 5, 6), f32(), f32(), sizes]
    check_node(resize_node(inputs, mode=mode), inputs, 11, **CUBIC)
    inputs = [rand(1, 2, 2, 5, 6), None, None, np.concatenate([i64(1, 2), sizes])]
    check_node(resize_node(inputs, mode=mode), inputs, 18, **CUBIC)


@pytest.mark.parametrize("extrapolation_value", [0.0, 10.0])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize(
    ("roi", "sizes"),
    [(f32(0, 0, 0.4, 0.6, 1, 1, 0.6, 0.8), i64(1, 2, 3, 3)),
     (f32(0, 0, -0.2, 0.3, 1, 1, 1.3, 1.1), i64(1, 2, 6, 4)),
     (f32(0, 0, 0.1, 0.2, 1, 1, 0.9, 0.9), i64(1, 2, 1, 5))],
)  # fmt: skip
def test_resize_tf_crop_and_resize(
    roi: np.ndarray, sizes: np.ndarray, mode: str, extrapolation_value: float
) -> None:
    inputs = [rand(1, 2, 5, 6), roi, None, sizes]
    node = resize_node(
        inputs,
        mode=mode,
        coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=extrapolation_value,
    )
    check_const(node, inputs, 13, const=(1, 3), **CUBIC)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize(
    ("axes", "scales", "sizes", "roi"),
    [([2, 3], f32(2, 1.5), None, None), ([3, 2], f32(1.5, 0.5), None, None),
     ([3], None, i64(9), None), ([3, 2], None, i64(3, 7), f32(0.1, 0.2, 0.8, 0.9))],
)  # fmt: skip
def test_resize_axes(
    axes: list[int],
    scales: np.ndarray | None,
    sizes: np.ndarray | None,
    roi: np.ndarray | None,
    mode: str,
) -> None:
    attrs: dict = {"mode": mode, "axes": axes}
    if roi is not None:
        attrs["coordinate_transformation_mode"] = "tf_crop_and_resize"
    inputs = [rand(2, 3, 4, 5), roi, scales, sizes]
    check_node(resize_node(inputs, **attrs), inputs, 18, **F32)


def test_resize_negative_axes() -> None:
    inputs = [rand(2, 3, 4, 5), None, f32(0.5, 2.5), None]
    node = resize_node(inputs, mode="linear", axes=[-1, -3])
    ref = resize_node(inputs, mode="linear", axes=[3, 1])
    check_like(node, inputs, 18, ref, inputs, 18, **F32)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("axes", [None, [2, 3]])
def test_resize_keep_aspect_ratio(axes: list[int] | None, policy: str) -> None:
    attrs: dict = {"mode": "linear", "keep_aspect_ratio_policy": policy}
    sizes = i64(7, 8)
    if axes is None:
        sizes = np.concatenate([i64(2, 3), sizes])
    else:
        attrs["axes"] = axes
    inputs = [rand(2, 3, 4, 5), None, None, sizes]
    check_node(resize_node(inputs, **attrs), inputs, 18, **F32)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("scales", [f32(1, 1, 0.6, 0.3), f32(1, 1, 2, 0.45)])
def test_resize_antialias(scales: np.ndarray, mode: str) -> None:
    inputs = [rand(1, 2, 10, 12), None, scales, None]
    check_node(resize_node(inputs, mode=mode, antialias=1), inputs, 18, **CUBIC)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.float64, np.float16])
def test_resize_dtypes(dtype: type, mode: str) -> None:
    if np.issubdtype(dtype, np.integer):
        x = RNG.integers(0, 255, size=(1, 3, 4, 6)).astype(dtype)
    else:
        x = rand(1, 3, 4, 6, dtype=dtype)
    if dtype == np.float16:
        tol = {"rtol": 1e-3, "atol": 1e-3}
    else:
        tol = CUBIC if mode == "cubic" and dtype == np.float64 else {"rtol": 1e-12}
    inputs = [x, None, f32(1, 1, 1.5, 0.7), None]
    check_node(resize_node(inputs, mode=mode), inputs, 19, **tol)


def test_resize_identity_and_empty() -> None:
    x = rand(1, 2, 3, 4)
    inputs = [x, None, f32(1, 1, 1, 1), None]
    (same,) = run_aioinfer(resize_node(inputs, mode="linear"), inputs, 13)
    np.testing.assert_array_equal(same, x)
    inputs = [np.zeros((0, 2, 3, 4), np.float32), None, f32(1, 1, 2, 2), None]
    (got,) = run_aioinfer(resize_node(inputs, mode="linear"), inputs, 13)
    assert got.shape == (0, 2, 6, 8) and got.dtype == np.float32


def test_resize_tf_half_pixel_for_nn() -> None:
    inputs = [f32(0, 1, 2, 3).reshape(1, 1, 1, 4), f32(), f32(1, 1, 1, 2)]
    node = resize_node(
        inputs, mode="nearest", coordinate_transformation_mode="tf_half_pixel_for_nn"
    )
    (got,) = run_aioinfer(node, inputs, 11)
    np.testing.assert_array_equal(got.reshape(-1), f32(0, 1, 1, 2, 2, 3, 3, 3))


@pytest.mark.parametrize(
    "attrs",
    [
        {"mode": "area"},
        {"coordinate_transformation_mode": "x"},
        {"nearest_mode": "up"},
        {"keep_aspect_ratio_policy": "fit"},
    ],
)
def test_resize_bad_attribute_fails_at_compile_time(attrs: dict) -> None:
    ir_node = ir.from_proto(oh.make_node("Resize", ["x", "", "s"], ["y"], **attrs))
    with pytest.raises(ValueError, match="Resize"):
        find_kernel("", "Resize", 19).factory(make_spec(ir_node, 19))


def test_resize_needs_scales_or_sizes() -> None:
    node = oh.make_node("Resize", ["x"], ["y"])
    with pytest.raises(ValueError, match="scales"):
        run_aioinfer(node, [rand(1, 1, 2, 2)], 13)


# Resize-10 and Upsample sample like "asymmetric": the reference runs them as Resize-13.


@pytest.mark.parametrize("scales", [f32(1, 1, 2, 3), f32(1, 1, 1.5, 2.5)])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_10_and_upsample_enlarge(mode: str, scales: np.ndarray) -> None:
    x = rand(2, 3, 4, 5)
    ref_inputs = [x, None, scales, None]
    ref = resize_node(
        ref_inputs, mode=mode, coordinate_transformation_mode="asymmetric", nearest_mode="floor"
    )
    for op, opset in [("Resize", 10), ("Upsample", 9)]:
        node = oh.make_node(op, ["x", "s"], ["y"], mode=mode)
        check_like(node, [x, scales], opset, ref, ref_inputs, 13, **F32)
    node = oh.make_node("Upsample", ["x"], ["y"], mode=mode, scales=scales.tolist())
    check_like(node, [x], 7, ref, ref_inputs, 13, **F32)


def test_resize_10_shrinks_nearest_with_ceil() -> None:
    x = np.arange(1, 9, dtype=np.float32).reshape(1, 1, 2, 4)
    node = oh.make_node("Resize", ["x", "s"], ["y"], mode="nearest")
    (got,) = run_aioinfer(node, [x, f32(1, 1, 0.6, 0.6)], 10)
    np.testing.assert_array_equal(got, f32(1, 3).reshape(1, 1, 1, 2))


def test_upsample_nearest_matches_reference() -> None:
    node = oh.make_node("Upsample", ["x", "s"], ["y"], mode="nearest")
    check_node(node, [rand(1, 2, 3, 4), f32(1, 1, 2, 3)], 9)
