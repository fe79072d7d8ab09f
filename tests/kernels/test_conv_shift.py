"""Convolutions with a one-row or one-column kernel whose columns are shifted copies of
the input (:mod:`aioinfer.devices.cpu.kernels.conv_shift`): openWakeWord's 1x3 (width
kept) and 3x1 (unpadded) convolutions, odd and tiny widths, asymmetric padding, batch,
with and without a bias (folded into the product when constant), float64, and the fused
floored LeakyRelu epilogue.

Checked against onnx.reference. Tolerances: float32 rtol 1e-4 and atol 1e-4 on sums of
up to 2880 products of standard normal values (float32 rounding of such sums, in any
order, stays below 1e-4), float64 1e-10.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx.helper as oh
import pytest

from aioinfer.devices.cpu.kernels.conv import KEPT_COLUMNS_BYTES
from aioinfer.devices.cpu.kernels.conv_shift import ShiftPlan, fill_columns, shift_plan
from aioinfer.transforms.rewrite import AIOINFER_DOMAIN
from tests.kernels._check import run_aioinfer, run_reference
from tests.kernels.test_conv import run_with_constant_weights

RTOL, ATOL = 1e-4, 1e-4

rng = np.random.default_rng(29)

# (x shape, w shape, pads)
CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], list[int]]] = {
    "1x3-same": ((1, 24, 74, 32), (24, 24, 1, 3), [0, 1, 0, 1]),
    "1x3-odd-batch": ((3, 5, 7, 9), (6, 5, 1, 3), [0, 1, 0, 1]),
    "1x3-width-2": ((2, 16, 10, 2), (8, 16, 1, 3), [0, 1, 0, 1]),
    "1x3-width-1": ((2, 4, 5, 1), (3, 4, 1, 3), [0, 1, 0, 1]),
    "1x3-pad-after": ((2, 6, 5, 7), (4, 6, 1, 3), [0, 0, 0, 2]),
    "1x3-pad-before": ((1, 6, 5, 7), (4, 6, 1, 3), [0, 2, 0, 0]),
    "1x5-same": ((2, 8, 6, 11), (5, 8, 1, 5), [0, 2, 0, 2]),
    "1x2-pad-after": ((1, 3, 4, 5), (2, 3, 1, 2), [0, 0, 0, 1]),
    "1x3-one-row": ((2, 5, 1, 9), (4, 5, 1, 3), [0, 1, 0, 1]),
    "1x3-one-row-many-channels": ((1, 960, 1, 40), (6, 960, 1, 3), [0, 1, 0, 1]),
    "3x1-valid": ((1, 48, 36, 16), (48, 48, 3, 1), [0, 0, 0, 0]),
    "3x1-odd-batch": ((2, 96, 13, 7), (10, 96, 3, 1), [0, 0, 0, 0]),
    "5x1-valid-batch": ((3, 64, 9, 33), (7, 64, 5, 1), [0, 0, 0, 0]),
}


def _random(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def _plan(
    in_shape: tuple[int, ...],
    kernel: tuple[int, ...],
    strides: tuple[int, ...] | list[int],
    dilations: tuple[int, ...] | list[int],
    begins: tuple[int, ...] | list[int],
    ends: tuple[int, ...] | list[int],
) -> ShiftPlan | None:
    """``shift_plan`` with the output shape of those attributes (as Conv derives it)."""
    out = [
        (size + b + e - (k - 1) * d - 1) // s + 1
        for size, k, s, d, b, e in zip(
            in_shape, kernel, strides, dilations, begins, ends, strict=True
        )
    ]
    return shift_plan(in_shape, kernel, strides, dilations, begins, ends, out)


def _shifted(x_shape: tuple[int, ...], w_shape: tuple[int, ...], pads: list[int]) -> bool:
    """Whether the convolution takes the shifted columns (see conv.conv_compute)."""
    columns = x_shape[0] * x_shape[1] * w_shape[2] * w_shape[3] * 4
    columns *= (x_shape[2] - w_shape[2] + 1) * x_shape[3]
    whole = w_shape[3] == 1 or x_shape[2] - w_shape[2] + 1 == 1
    if whole and columns <= KEPT_COLUMNS_BYTES:
        return False
    return _plan(x_shape[2:], w_shape[2:], [1, 1], [1, 1], pads[:2], pads[2:]) is not None


def test_the_cases_take_the_shifted_columns() -> None:
    # Every 1xk case over several rows, and the others whose columns are not kept
    # (small ones keep the window view's columns, which are whole channels long).
    taken = {case for case, shapes in CASES.items() if _shifted(*shapes)}
    assert taken == set(CASES) - {"3x1-odd-batch", "1x3-one-row"}


@pytest.mark.parametrize(
    ("kernel", "strides", "dilations", "begins", "ends"),
    [
        ((3, 3), (1, 1), (1, 1), (0, 1), (0, 1)),  # two-dimensional kernel
        ((1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),  # pointwise
        ((1, 3), (1, 2), (1, 1), (0, 1), (0, 1)),  # strided
        ((1, 3), (1, 1), (1, 2), (0, 2), (0, 2)),  # dilated
        ((1, 3), (1, 1), (1, 1), (1, 1), (1, 1)),  # padded rows
        ((1, 3), (1, 1), (1, 1), (0, 1), (0, 0)),  # narrower output
        ((3, 1), (1, 1), (1, 1), (0, 0), (0, 1)),  # wider output
    ],
)
def test_other_geometries_have_no_shift_plan(
    kernel: tuple[int, int],
    strides: tuple[int, int],
    dilations: tuple[int, int],
    begins: tuple[int, int],
    ends: tuple[int, int],
) -> None:
    assert _plan((9, 8), kernel, strides, dilations, begins, ends) is None


@pytest.mark.parametrize("case", list(CASES))
def test_columns_are_the_windows(case: str) -> None:
    """The shifted copies equal the padded input's windows, padding entries zero (the
    buffer starts as NaN: every entry is written)."""
    x_shape, w_shape, pads = CASES[case]
    c, (hx, wx), (kh, kw) = x_shape[1], x_shape[2:], w_shape[2:]
    plan = _plan((hx, wx), (kh, kw), (1, 1), (1, 1), pads[:2], pads[2:])
    assert isinstance(plan, ShiftPlan)
    x = _random(c, hx, wx)
    padded = np.pad(x, ((0, 0), (0, 0), (pads[1], pads[3])))
    oh_, ow = plan.out_shape
    want = np.stack(
        [padded[:, i : i + oh_, j : j + ow] for i in range(kh) for j in range(kw)], axis=1
    )
    cols = np.full((c, plan.taps, plan.length), np.nan, np.float32)
    fill_columns(plan, x.reshape(c, -1), cols)
    np.testing.assert_array_equal(cols.reshape(want.shape), want)


@pytest.mark.parametrize("constant", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_shifted_conv_matches_reference(
    case: str, with_bias: bool, constant: bool, threads: int
) -> None:
    x_shape, w_shape, pads = CASES[case]
    inputs = [_random(*x_shape), _random(*w_shape)]
    if with_bias:
        inputs.append(_random(w_shape[0]))
    node = oh.make_node("Conv", ["x", "w", "b"][: len(inputs)], ["y"], pads=pads)
    run = run_with_constant_weights if constant else run_aioinfer
    got = run(node, inputs, 11)[0]
    want = run_reference(node, inputs, 11)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", ["1x3-odd-batch", "5x1-valid-batch"])
def test_shifted_conv_float64(case: str) -> None:
    x_shape, w_shape, pads = CASES[case]
    inputs = [_random(*x_shape, dtype=np.float64), _random(*w_shape, dtype=np.float64)]
    inputs.append(_random(w_shape[0], dtype=np.float64))
    node = oh.make_node("Conv", ["x", "w", "b"], ["y"], pads=pads)
    got = run_with_constant_weights(node, inputs, 11)[0]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, run_reference(node, inputs, 11)[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", ["1x3-same", "1x3-odd-batch", "3x1-valid"])
def test_fused_floored_leaky_relu(case: str, threads: int) -> None:
    """openWakeWord's epilogue: LeakyRelu(0.2) then Max with -0.4, fused."""
    x_shape, w_shape, pads = CASES[case]
    feeds: dict[str, Any] = {
        "x": _random(*x_shape),
        "w": _random(*w_shape),
        "b": _random(w_shape[0]),
    }
    conv = oh.make_node("Conv", ["x", "w", "b"], ["c"], pads=pads)
    want = run_reference(conv, list(feeds.values()), 18)[0]
    want = np.maximum(np.where(want > 0, want, np.float32(0.2) * want), np.float32(-0.4))
    node = oh.make_node(
        "FusedConv",
        list(feeds),
        ["y"],
        domain=AIOINFER_DOMAIN,
        activation="LeakyRelu",
        activation_params=[0.2, -0.4],
        pads=pads,
    )
    got = run_with_constant_weights(node, list(feeds.values()), 1)[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
