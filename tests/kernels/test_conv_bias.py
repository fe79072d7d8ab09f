"""A constant bias added by the convolution's product (a column of the weights against a
row of ones under the columns) rather than by a pass over the output: the
phase-flattened columns, the blocks of rows that copy their columns, and 1x1
convolutions with fewer input than output channels (whose input is copied under a row
of ones). SqueezeNet's 3x3 expands over small maps copy their exact columns.

Checked against onnx.reference, with SqueezeNet's shapes scaled down: float32 rtol and
atol 1e-4 on sums of up to 577 products of standard normal values (the bias is one more
term of the sum, added in another order than after it: float32 rounding of such sums,
in any order, stays below 1e-4), float64 1e-10.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx.helper as oh
import pytest

from aioinfer.devices.cpu.kernels import conv, conv_rows
from aioinfer.devices.cpu.kernels.conv_flat import flat_geometry
from aioinfer.transforms.rewrite import AIOINFER_DOMAIN
from tests.kernels._check import run_aioinfer, run_reference
from tests.kernels.test_conv import run_with_constant_weights

RTOL, ATOL = 1e-4, 1e-4

rng = np.random.default_rng(31)

# (x shape, w shape, attributes, path): path names where the bias is folded.
CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any], str]] = {
    # Fire modules' 3x3 expands: padded, the columns longer than the output rows.
    "expand-3x3": ((2, 16, 15, 13), (64, 16, 3, 3), {"pads": [1] * 4}, "flat"),
    "expand-3x3-asymmetric": (
        (1, 8, 9, 11),
        (24, 8, 3, 2),
        {"pads": [1, 0, 2, 1], "dilations": [2, 1]},
        "flat",
    ),
    # The stem: three channels, stride 2, no padding.
    "stem-stride-2": ((2, 3, 31, 29), (32, 3, 3, 3), {"strides": [2, 2]}, "flat"),
    "stem-blocks-of-rows": ((2, 3, 31, 29), (32, 3, 3, 3), {"strides": [2, 2]}, "rows"),
    "columns-blocks-of-rows": (
        (1, 6, 20, 23),
        (10, 6, 4, 3),
        {"strides": [3, 1], "pads": [1, 0, 0, 2]},
        "rows",
    ),
    # 1x1 expands (and a strided one): fewer input than output channels.
    "expand-1x1": ((2, 8, 11, 9), (32, 8, 1, 1), {}, "pointwise"),
    "expand-1x1-strided": ((3, 5, 12, 13), (10, 5, 1, 1), {"strides": [2, 3]}, "pointwise"),
    # (two images: one image this small takes the small-convolution path of conv_small)
    "expand-1x1-equal-halves": ((2, 16, 7, 7), (32, 16, 1, 1), {}, "pointwise"),
    # Small columns kept per node (im2col), of at most half as many rows as filters.
    "kept-columns": ((2, 2, 6, 7), (40, 2, 3, 3), {"pads": [1, 0, 1, 2]}, "kept"),
}
"""Cases whose bias is folded into the product."""

UNFOLDED: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = {
    # A squeeze: more input than output channels (the copy would cost more).
    "squeeze-1x1": ((2, 32, 9, 9), (8, 32, 1, 1), {}),
    "grouped-3x3": ((2, 8, 9, 9), (12, 4, 3, 3), {"pads": [1] * 4, "group": 2}),
}
"""Cases whose bias is added after the product."""


def _random(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


@pytest.fixture
def rows_or_not(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of rows for the ``rows`` cases (small blocks, many of them, on two threads),
    none for the others; the phase-flattened columns for the ``flat`` ones."""
    if request.node.callspec.params["case"] in [n for n, c in CASES.items() if c[3] == "rows"]:
        monkeypatch.setattr(conv_rows, "MIN_BLOCK_WORK", 1 << 12)
        monkeypatch.setattr(conv_rows, "BLOCK_ELEMENTS", 1 << 12)
        monkeypatch.setattr(conv_rows, "ONE_THREAD_FILTERS", 1 << 10)
        monkeypatch.setattr(conv_rows, "FLAT_COLUMNS", 0)
    else:
        monkeypatch.setattr(conv_rows, "MIN_BLOCK_WORK", 1 << 40)
    if CASES[request.node.callspec.params["case"]][3] == "flat":
        # Test-sized columns kept per node take the im2col path instead.
        monkeypatch.setattr(conv, "KEPT_COLUMNS_BYTES", 0)


def _inputs(x_shape: tuple[int, ...], w_shape: tuple[int, ...], dtype: type) -> list[np.ndarray]:
    x, w, b = (_random(*shape, dtype=dtype) for shape in (x_shape, w_shape, w_shape[:1]))
    return [x, w, b]


def _finished_biases(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, np.ndarray | None]]:
    """The biases the convolutions hand to the pass over their output, or to the blocks
    of rows that add them to each block (recorded)."""
    seen: list[tuple[str, np.ndarray | None]] = []
    finish, rows = conv._finish_channels, conv.rows_conv

    def spy_finish(y: np.ndarray, b: np.ndarray | None, epilogue: Any) -> bool:
        seen.append(("after", b))
        return finish(y, b, epilogue)

    def spy_rows(plan: Any, x: np.ndarray, weights: np.ndarray, bias: Any, *rest: Any) -> bool:
        seen.append(("rows", bias))
        return rows(plan, x, weights, bias, *rest)

    monkeypatch.setattr(conv, "_finish_channels", spy_finish)
    monkeypatch.setattr(conv, "rows_conv", spy_rows)
    return seen


@pytest.mark.usefixtures("rows_or_not")
@pytest.mark.parametrize(
    ("dtype", "tol"), [(np.float32, RTOL), (np.float64, 1e-10)], ids=["float32", "float64"]
)
@pytest.mark.parametrize("case", list(CASES))
def test_folded_bias_matches_the_reference(
    case: str, dtype: type, tol: float, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    x_shape, w_shape, attrs, path = CASES[case]
    inputs = _inputs(x_shape, w_shape, dtype)
    node = oh.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    want = run_reference(node, inputs, 18)[0]
    finished = _finished_biases(monkeypatch)
    got = run_with_constant_weights(node, inputs, 18)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    # The bias went into the product: no pass over the output adds it.
    assert finished and all(b is None for _, b in finished), case
    assert {where for where, _ in finished} == {"rows" if path == "rows" else "after"}, case
    # Twice: the cached weights with their bias column, and the scratch row of ones.
    np.testing.assert_array_equal(run_with_constant_weights(node, inputs, 18)[0], got)


@pytest.mark.usefixtures("rows_or_not")
@pytest.mark.parametrize("case", [n for n, c in CASES.items() if c[3] != "rows"])
def test_folded_bias_with_fused_relu(case: str, threads: int) -> None:
    """FusedConv's Relu after a folded bias (SqueezeNet's every convolution)."""
    x_shape, w_shape, attrs, _ = CASES[case]
    inputs = _inputs(x_shape, w_shape, np.float32)
    want = np.maximum(
        run_reference(oh.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), inputs, 18)[0], 0
    )
    node = oh.make_node(
        "FusedConv", ["x", "w", "b"], ["y"], domain=AIOINFER_DOMAIN, activation="Relu", **attrs
    )
    got = run_with_constant_weights(node, inputs, 1)[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.usefixtures("rows_or_not")
@pytest.mark.parametrize("case", list(CASES))
def test_a_bias_known_only_at_run_time_is_added_after(
    case: str, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    x_shape, w_shape, attrs, _ = CASES[case]
    inputs = _inputs(x_shape, w_shape, np.float32)
    node = oh.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    want = run_reference(node, inputs, 18)[0]
    finished = _finished_biases(monkeypatch)
    np.testing.assert_allclose(run_aioinfer(node, inputs, 18)[0], want, rtol=RTOL, atol=ATOL)
    assert finished and finished[0][1] is inputs[2], case


@pytest.mark.parametrize("case", list(UNFOLDED))
def test_unfolded_cases_add_the_bias_after(
    case: str, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    x_shape, w_shape, attrs = UNFOLDED[case]
    inputs = _inputs(x_shape, w_shape, np.float32)
    node = oh.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    want = run_reference(node, inputs, 18)[0]
    finished = _finished_biases(monkeypatch)
    got = run_with_constant_weights(node, inputs, 18)[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    assert finished and finished[0][1] is inputs[2], case


@pytest.mark.parametrize(
    ("channels", "filters", "size"), [(32, 128, 27), (48, 192, 13), (64, 256, 13)]
)
def test_fire_expands_over_small_maps_copy_exact_columns(
    channels: int, filters: int, size: int
) -> None:
    """Copying their columns run by run costs less than multiplying and cropping the
    two padding columns of every row."""
    geometry = flat_geometry(
        (size, size), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), (size, size), filters, channels
    )
    assert geometry.exact and geometry.length == size * size


@pytest.mark.parametrize("batch", [1, 2])
def test_exact_columns_with_folded_bias_match_the_reference(
    batch: int, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(conv, "KEPT_COLUMNS_BYTES", 0)
    x_shape, w_shape = (batch, 16, 9, 11), (256, 16, 3, 3)
    flat = flat_geometry((9, 11), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), (9, 11), 256, 16)
    assert flat.exact
    inputs = _inputs(x_shape, w_shape, np.float32)
    node = oh.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1] * 4)
    want = run_reference(node, inputs, 18)[0]
    np.testing.assert_allclose(
        run_with_constant_weights(node, inputs, 18)[0], want, rtol=RTOL, atol=ATOL
    )
