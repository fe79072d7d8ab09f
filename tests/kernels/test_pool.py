"""Pooling kernels against onnx.reference (and onnxruntime where the reference errs)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx.helper as oh
import onnx_ir as ir
import pytest

from aioinfer.devices.cpu.kernels.conv import PLAN_CACHE_SIZE
from aioinfer.devices.cpu.kernels.registry import find_kernel, make_spec
from tests.kernels._check import check_node, run_aioinfer
from tests.kernels.test_conv import check_onnxruntime

RTOL, ATOL = 1e-5, 1e-6

rng = np.random.default_rng(11)


def _random(*shape: int, dtype: type = np.float32) -> np.ndarray:
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max + 1, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


# (input shape, attributes, opset)
Case = tuple[tuple[int, ...], dict[str, Any], int]

MAX_POOL_CASES: dict[str, Case] = {
    "2d-opset1": ((1, 2, 6, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}, 1),
    "2d-opset7-pads": (
        (2, 2, 7, 8),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4},
        7,
    ),
    "2d-asymmetric": (
        (1, 3, 7, 8),
        {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 0, 1]},
        11,
    ),
    "2d-ceil": (
        (1, 2, 7, 8),
        {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 0, 1], "ceil_mode": 1},
        10,
    ),
    "2d-dilated": (
        (1, 2, 8, 7),
        {"kernel_shape": [3, 2], "strides": [1, 2], "dilations": [2, 1], "pads": [1, 0, 1, 1]},
        12,
    ),
    "2d-same-upper": (
        (1, 2, 7, 8),
        {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
        11,
    ),
    "2d-same-lower-stride1": ((1, 2, 5, 6), {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER"}, 11),
    "2d-valid": (
        (1, 2, 7, 8),
        {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"},
        22,
    ),
    "2d-resnet-like": (
        (1, 4, 12, 12),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4},
        22,
    ),
    "2d-resnet-like-batch-odd-channels": (
        (3, 7, 16, 15),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4},
        22,
    ),
    "2d-size-one": ((1, 1, 1, 1), {"kernel_shape": [1, 1]}, 22),
    "1d-strided": ((2, 3, 9), {"kernel_shape": [3], "strides": [2], "pads": [1, 0]}, 22),
    "3d-strided": ((1, 2, 5, 4, 6), {"kernel_shape": [2, 2, 3], "strides": [2, 1, 2]}, 22),
}


@pytest.mark.parametrize("case", list(MAX_POOL_CASES))
def test_max_pool(case: str, threads: int) -> None:
    """On two threads, the inputs of more than one channel are split by channels."""
    shape, attrs, opset = MAX_POOL_CASES[case]
    node = oh.make_node("MaxPool", ["x"], ["y"], **attrs)
    check_node(node, [_random(*shape)], opset=opset, rtol=RTOL, atol=ATOL)


# onnx.reference gets these wrong (its stride-1 path misreads pads, its strided path
# rounds SAME_LOWER outputs down); onnxruntime follows the spec.
MAX_POOL_ORT_CASES: dict[str, Case] = {
    "1d-padded": ((2, 2, 7), {"kernel_shape": [3], "pads": [1, 2]}, 13),
    "3d-padded": ((1, 2, 3, 4, 5), {"kernel_shape": [2, 2, 2], "pads": [1, 0, 0, 0, 1, 1]}, 13),
    "2d-same-lower-strided": (
        (1, 2, 7, 8),
        {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"},
        13,
    ),
    "2d-stride1-asymmetric": ((1, 2, 5, 6), {"kernel_shape": [2, 3], "pads": [1, 1, 0, 0]}, 12),
    "3d-ceil-dilated": (
        (1, 1, 6, 5, 7),
        {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2], "dilations": [1, 2, 1], "ceil_mode": 1},
        22,
    ),
}


@pytest.mark.parametrize("case", list(MAX_POOL_ORT_CASES))
def test_max_pool_against_onnxruntime(case: str, threads: int) -> None:
    shape, attrs, opset = MAX_POOL_ORT_CASES[case]
    node = oh.make_node("MaxPool", ["x"], ["y"], **attrs)
    check_onnxruntime(node, [_random(*shape)], opset=opset, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("opset", [8, 12, 22])
@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize(
    ("shape", "attrs"),
    [
        ((2, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ((1, 2, 4, 5, 6), {"kernel_shape": [2, 2, 2], "strides": [2, 1, 1]}),
        ((2, 3, 9), {"kernel_shape": [3], "strides": [2]}),
    ],
)
def test_max_pool_indices(
    shape: tuple[int, ...], attrs: dict[str, Any], storage_order: int, opset: int
) -> None:
    node = oh.make_node("MaxPool", ["x"], ["y", "indices"], storage_order=storage_order, **attrs)
    got = check_node(node, [_random(*shape)], opset=opset, rtol=RTOL, atol=ATOL)
    assert got[1].dtype == np.int64


def test_max_pool_indices_with_dilations() -> None:
    node = oh.make_node(
        "MaxPool", ["x"], ["y", "indices"], kernel_shape=[3, 2], strides=[2, 1], dilations=[2, 2]
    )
    check_node(node, [_random(2, 2, 9, 8)], opset=12, rtol=RTOL, atol=ATOL)


def test_max_pool_indices_pick_the_first_maximum() -> None:
    x = np.zeros((1, 1, 2, 4), dtype=np.float32)
    x[0, 0, 1, 0] = x[0, 0, 0, 1] = 5.0
    node = oh.make_node("MaxPool", ["x"], ["y", "indices"], kernel_shape=[2, 2], strides=[2, 2])
    values, indices = run_aioinfer(node, [x], 12)
    np.testing.assert_array_equal(values, [[[[5.0, 0.0]]]])
    np.testing.assert_array_equal(indices, [[[[1, 2]]]])


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float16, np.float64])
def test_max_pool_dtypes(dtype: type) -> None:
    node = oh.make_node(
        "MaxPool", ["x"], ["y"], kernel_shape=[2, 3], strides=[2, 1], pads=[1, 1, 0, 0]
    )
    check_node(node, [_random(1, 2, 5, 6, dtype=dtype)], opset=12, rtol=0, atol=0)


def test_max_pool_single_output_pixel() -> None:
    node = oh.make_node("MaxPool", ["x"], ["y"], kernel_shape=[7, 7])
    check_node(node, [_random(2, 3, 7, 7)], opset=13, rtol=0, atol=0)


# -- AveragePool -------------------------------------------------------------------------

AVERAGE_POOL_CASES: dict[str, Case] = {
    "2d-opset1": ((1, 2, 6, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}, 1),
    "2d-opset7-pads": (
        (2, 2, 7, 8),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4},
        7,
    ),
    "2d-opset7-count-pads": (
        (2, 2, 7, 8),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4, "count_include_pad": 1},
        7,
    ),
    "2d-asymmetric": (
        (1, 3, 7, 8),
        {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 2, 1]},
        11,
    ),
    "2d-ceil": (
        (1, 2, 7, 8),
        {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1},
        10,
    ),
    "2d-ceil-count-pads": (
        (1, 2, 6, 6),
        {
            "kernel_shape": [3, 3],
            "strides": [2, 2],
            "pads": [1, 0, 1, 0],
            "ceil_mode": 1,
            "count_include_pad": 1,
        },
        22,
    ),
    "2d-dilated": (
        (1, 2, 8, 7),
        {"kernel_shape": [3, 2], "strides": [1, 2], "dilations": [2, 1], "pads": [1, 0, 1, 1]},
        19,
    ),
    "2d-same-upper": (
        (1, 2, 7, 8),
        {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
        11,
    ),
    "2d-same-lower-count-pads": (
        (1, 2, 7, 8),
        {
            "kernel_shape": [3, 3],
            "strides": [2, 2],
            "auto_pad": "SAME_LOWER",
            "count_include_pad": 1,
        },
        11,
    ),
    "2d-valid": (
        (1, 2, 7, 8),
        {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"},
        22,
    ),
    "2d-global-like": ((2, 3, 7, 7), {"kernel_shape": [7, 7]}, 22),
    "1d": ((2, 2, 7), {"kernel_shape": [3], "pads": [1, 2]}, 22),
    "3d": ((1, 2, 3, 4, 5), {"kernel_shape": [2, 2, 2], "pads": [1, 0, 0, 0, 1, 1]}, 22),
    "3d-strided-count-pads": (
        (1, 2, 5, 4, 6),
        {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [1] * 6, "count_include_pad": 1},
        19,
    ),
}


@pytest.mark.parametrize("case", list(AVERAGE_POOL_CASES))
def test_average_pool(case: str) -> None:
    shape, attrs, opset = AVERAGE_POOL_CASES[case]
    node = oh.make_node("AveragePool", ["x"], ["y"], **attrs)
    check_node(node, [_random(*shape)], opset=opset, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(("dtype", "tol"), [(np.float16, 1e-3), (np.float64, 1e-12)])
def test_average_pool_dtypes(dtype: type, tol: float) -> None:
    node = oh.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    check_node(node, [_random(1, 2, 5, 6, dtype=dtype)], opset=11, rtol=tol, atol=tol)


def test_average_pool_divisor_excludes_padding() -> None:
    x = np.ones((1, 1, 2, 2), dtype=np.float32)
    node = oh.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(run_aioinfer(node, [x], 11)[0], np.ones((1, 1, 3, 3)))
    node = oh.make_node(
        "AveragePool", ["x"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1
    )
    want = np.array([[0.25, 0.5, 0.25], [0.5, 1.0, 0.5], [0.25, 0.5, 0.25]], dtype=np.float32)
    np.testing.assert_array_equal(run_aioinfer(node, [x], 11)[0], want.reshape(1, 1, 3, 3))


# -- LpPool ------------------------------------------------------------------------------

LP_POOL_CASES: dict[str, Case] = {
    "p2-opset2": ((1, 2, 6, 7), {"kernel_shape": [3, 3], "strides": [2, 2]}, 2),
    "p3-opset11-pads": ((1, 2, 6, 7), {"kernel_shape": [3, 2], "pads": [1, 0, 0, 1], "p": 3}, 11),
    "p1-opset18": ((2, 2, 6, 7), {"kernel_shape": [2, 3], "strides": [2, 1], "p": 1}, 18),
    "dilated-opset18": ((1, 2, 8, 7), {"kernel_shape": [2, 2], "dilations": [2, 3]}, 18),
    "1d-opset22": ((2, 3, 9), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, 22),
    "3d-opset22": ((1, 2, 4, 4, 5), {"kernel_shape": [2, 2, 3], "p": 3}, 22),
}


@pytest.mark.parametrize("case", list(LP_POOL_CASES))
def test_lp_pool(case: str) -> None:
    shape, attrs, opset = LP_POOL_CASES[case]
    node = oh.make_node("LpPool", ["x"], ["y"], **attrs)
    check_node(node, [_random(*shape)], opset=opset, rtol=1e-4, atol=1e-5)


def test_lp_pool_opset1_float_p() -> None:
    # LpPool-1 has a float p; the reference implements only LpPool-2+, whose meaning is equal.
    x = _random(1, 2, 4, 4)
    node = oh.make_node("LpPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], p=3.0)
    got = run_aioinfer(node, [x], 1)[0]
    windows = np.abs(x).reshape(1, 2, 2, 2, 2, 2).transpose(0, 1, 2, 4, 3, 5) ** 3
    want = windows.reshape(1, 2, 2, 2, 4).sum(axis=-1) ** (1 / 3)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_lp_pool_ceil_mode_against_onnxruntime() -> None:
    # onnx.reference rescales partial ceil_mode windows as if they were full.
    node = oh.make_node(
        "LpPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4, ceil_mode=1
    )
    check_onnxruntime(node, [_random(1, 2, 7, 8)], opset=18, rtol=1e-4, atol=1e-5)


# -- Global pools ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape",
    [
        (2, 3, 5),
        (1, 2, 4, 3),
        (1, 2, 3, 2, 4),
        (2, 3, 1, 1),
        # Squeeze-and-excite maps (summed by a product with ones), the largest such map,
        # and one larger (numpy's pairwise sum).
        (6, 40, 2, 96),
        (1, 3, 64, 64),
        (2, 3, 65, 64),
    ],
)
@pytest.mark.parametrize("opset", [1, 22])
def test_global_average_pool(shape: tuple[int, ...], opset: int) -> None:
    node = oh.make_node("GlobalAveragePool", ["x"], ["y"])
    check_node(node, [_random(*shape)], opset=opset, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_global_average_pool_of_a_view(dtype: type) -> None:
    """A non-contiguous input (a transposed view) and float64: the same means."""
    x = _random(3, 7, 6, 5, dtype=dtype).transpose(0, 1, 3, 2)
    node = oh.make_node("GlobalAveragePool", ["x"], ["y"])
    got = run_aioinfer(node, [x], 22)[0]
    assert got.dtype == dtype and got.shape == (3, 7, 1, 1)
    want = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    tol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_global_average_pool_float16() -> None:
    node = oh.make_node("GlobalAveragePool", ["x"], ["y"])
    check_node(node, [_random(1, 3, 8, 8, dtype=np.float16)], opset=13, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("opset", [1, 22])
def test_global_max_pool(opset: int) -> None:
    node = oh.make_node("GlobalMaxPool", ["x"], ["y"])
    check_node(node, [_random(2, 3, 4, 5)], opset=opset, rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 2, 3, 2, 4)])
def test_global_max_pool_other_ranks(shape: tuple[int, ...]) -> None:
    # onnx.reference reduces the wrong axes unless the input is 4-D.
    node = oh.make_node("GlobalMaxPool", ["x"], ["y"])
    check_onnxruntime(node, [_random(*shape)], opset=13, rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 2, 4, 3), (1, 2, 3, 2, 4)])
@pytest.mark.parametrize("p", [1, 2, 3])
def test_global_lp_pool(shape: tuple[int, ...], p: int) -> None:
    # onnx.reference has no GlobalLpPool.
    node = oh.make_node("GlobalLpPool", ["x"], ["y"], p=p)
    check_onnxruntime(node, [_random(*shape)], opset=13, rtol=1e-5, atol=1e-6)


def test_global_lp_pool_opset1_float_p() -> None:
    x = _random(1, 2, 3, 4)
    node = oh.make_node("GlobalLpPool", ["x"], ["y"], p=3.0)
    got = run_aioinfer(node, [x], 1)[0]
    want = (np.abs(x) ** 3).sum(axis=(2, 3), keepdims=True) ** (1 / 3)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# -- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op_type", "shape", "attrs"),
    [
        ("MaxPool", (1, 1, 4, 4), {}),
        ("MaxPool", (1, 1, 4, 4), {"kernel_shape": [2]}),
        ("AveragePool", (1, 1, 2, 2), {"kernel_shape": [3, 3]}),
        ("AveragePool", (1, 1, 4, 4), {"kernel_shape": [2, 2], "pads": [1, 1]}),
        ("LpPool", (1, 1, 4, 4), {"kernel_shape": [2, 2], "strides": [1]}),
        ("LpPool", (1, 1, 4, 4), {"kernel_shape": [2, 2], "p": 0}),
        ("MaxPool", (1, 1, 4, 4), {"kernel_shape": [2, 2], "auto_pad": "SAME"}),
    ],
)
def test_pool_rejects_bad_attributes_or_shapes(
    op_type: str, shape: tuple[int, ...], attrs: dict[str, Any]
) -> None:
    node = oh.make_node(op_type, ["x"], ["y"], **attrs)
    with pytest.raises(ValueError):
        run_aioinfer(node, [_random(*shape)], 13)


def test_pool_serves_more_input_shapes_than_it_caches() -> None:
    node = oh.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    ir_node = ir.from_proto(node)
    fn = find_kernel("", "MaxPool", 13).factory(make_spec(ir_node, 13))
    for size in [*range(2, 2 + 2 * PLAN_CACHE_SIZE, 2), 4, 2]:
        x = _random(1, 2, size, 6)
        want = x.reshape(1, 2, size // 2, 2, 3, 2).max(axis=(3, 5))
        np.testing.assert_array_equal(fn(x)[0], want)


INSIDE_CASES: dict[str, dict[str, Any]] = {
    "3x3-stride2-odd": {"kernel_shape": [3, 3], "strides": [2, 2]},
    "2x2-stride2": {"kernel_shape": [2, 2], "strides": [2, 2]},
    "1x2-stride-1x2": {"kernel_shape": [1, 2], "strides": [1, 2]},
    "1x1-stride2": {"kernel_shape": [1, 1], "strides": [2, 2]},
    "dilated": {"kernel_shape": [2, 3], "dilations": [2, 1], "strides": [1, 2]},
    "stride-past-the-end": {"kernel_shape": [3, 2], "strides": [3, 3]},
    "explicit-zero-pads": {"kernel_shape": [3, 3], "strides": [2, 1], "pads": [0, 0, 0, 0]},
}


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("case", list(INSIDE_CASES))
@pytest.mark.parametrize("view", [False, True])
def test_pool_windows_inside_the_input(op: str, case: str, view: bool) -> None:
    """Pools whose windows all lie inside the input (no padding: strided views of the
    input, not its padded copy), on a contiguous input and a strided view, against
    onnx.reference; the output never shares the input's memory."""
    x = _random(2, 3, 11, 9)
    if view:
        x = _random(2, 3, 22, 9)[:, :, ::2]
    node = oh.make_node(op, ["x"], ["y"], **INSIDE_CASES[case])
    (got,) = check_node(node, [x], opset=19, rtol=RTOL, atol=ATOL)
    assert not np.may_share_memory(got, x)
