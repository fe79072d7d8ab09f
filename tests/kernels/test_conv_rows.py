"""Convolutions computed in blocks of output rows (:mod:`.conv_rows`): per-tap products
read in place, block columns, 1x1 blocks of pixels (strided: rows), blocks across
images, and the FusedConv epilogue applied to each block.

Checked against onnx.reference. Tolerances: float32 rtol 1e-4 and atol 1e-4 on sums of
up to 1,000 products of standard normal values (float32 rounding of such sums, in any
order, stays below 1e-4), float64 1e-10.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx.helper as oh
import pytest

from aioinfer.devices.cpu.kernels import conv_rows, parallel
from aioinfer.devices.cpu.kernels.conv_flat import flat_geometry
from aioinfer.transforms.rewrite import AIOINFER_DOMAIN
from tests.kernels._check import (
    check_from_threads,
    run_aioinfer,
    run_reference,
)
from tests.kernels.test_conv import run_with_constant_weights

RTOL, ATOL = 1e-4, 1e-4

rng = np.random.default_rng(29)


def _random(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of a few rows, so that small convolutions take many blocks (a part of
    several blocks, of several images, a short last block)."""
    monkeypatch.setattr(conv_rows, "MIN_BLOCK_WORK", 1 << 12)
    monkeypatch.setattr(conv_rows, "BLOCK_ELEMENTS", 1 << 12)
    monkeypatch.setattr(conv_rows, "FLAT_COLUMNS", 0)


# (x shape, w shape, attributes, kind): kind names the way the blocks are computed.
CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any], str]] = {
    "implicit-3x3": ((1, 40, 21, 19), (12, 40, 3, 3), {"pads": [1] * 4}, "implicit"),
    "implicit-batch-asymmetric": (
        (3, 32, 11, 13),
        (7, 32, 3, 2),
        {"pads": [2, 0, 1, 1]},
        "implicit",
    ),
    "implicit-stride-2-dilated": (
        (2, 36, 17, 18),
        (5, 36, 3, 3),
        {"pads": [1, 2, 2, 1], "strides": [2, 2], "dilations": [2, 1]},
        "implicit",
    ),
    "columns-stem-stride-2": (
        (2, 3, 30, 27),
        (16, 3, 3, 3),
        {"pads": [1] * 4, "strides": [2, 2]},
        "columns",
    ),
    "columns-7x7-stride-2": (
        (1, 3, 33, 31),
        (8, 3, 7, 7),
        {"pads": [3] * 4, "strides": [2, 2]},
        "columns",
    ),
    "columns-valid-stride-3-1": ((2, 5, 20, 23), (6, 5, 4, 3), {"strides": [3, 1]}, "columns"),
    # 5x5 on a map 2 pixels high: the outer kernel rows read only padding.
    "columns-short-map": ((3, 4, 2, 40), (9, 4, 5, 5), {"pads": [2] * 4}, "columns"),
    "pointwise": ((2, 24, 13, 17), (10, 24, 1, 1), {}, "pixels"),
    "pointwise-strided": ((2, 16, 15, 22), (12, 16, 1, 1), {"strides": [2, 3]}, "rows"),
}


def _plan(case: str, threads: int = 2) -> conv_rows.RowPlan | None:
    x_shape, w_shape, attrs, kind = CASES[case]
    strides = attrs.get("strides", [1, 1])
    dilations = attrs.get("dilations", [1, 1])
    pads = attrs.get("pads", [0] * 4)
    out = tuple(
        (size + pads[i] + pads[i + 2] - (k - 1) * d - 1) // s + 1
        for i, (size, k, s, d) in enumerate(
            zip(x_shape[2:], w_shape[2:], strides, dilations, strict=True)
        )
    )
    geometry = None
    if kind not in ("pixels", "rows"):
        geometry = flat_geometry(
            x_shape[2:],
            w_shape[2:],
            strides,
            dilations,
            pads[:2],
            pads[2:],
            out,
            w_shape[0],
            x_shape[1],
        )
    return conv_rows.row_plan(
        geometry, tuple(strides), out, x_shape[0], x_shape[1], w_shape[0], threads
    )


@pytest.mark.usefixtures("small_blocks")
def test_the_cases_take_the_paths_they_name() -> None:
    for case, (x_shape, _, _, kind) in CASES.items():
        plan = _plan(case)
        assert plan is not None and _plan(case, threads=1) == plan, case
        blocks = x_shape[0] * -(-plan.rows // plan.block_rows)
        assert blocks >= 3, case
        assert plan.implicit == (kind in ("implicit", "pixels", "rows")), case
        assert (plan.geometry is None) == (kind in ("pixels", "rows")), case
    assert _plan("pointwise").rows == 13 * 17  # type: ignore[union-attr]
    assert _plan("pointwise-strided").rows == 8  # type: ignore[union-attr]
    assert len(_plan("columns-short-map").taps) == 15  # type: ignore[union-attr]


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_blocks_match_the_reference(case: str, with_bias: bool, threads: int) -> None:
    x_shape, w_shape, attrs, _ = CASES[case]
    inputs = [_random(*x_shape), _random(*w_shape)]
    if with_bias:
        inputs.append(_random(w_shape[0]))
    node = oh.make_node("Conv", ["x", "w", "b"][: len(inputs)], ["y"], **attrs)
    want = run_reference(node, inputs, 18)[0]
    np.testing.assert_allclose(run_aioinfer(node, inputs, 18)[0], want, rtol=RTOL, atol=ATOL)
    got = run_with_constant_weights(node, inputs, 18)[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize(
    "case", ["implicit-batch-asymmetric", "columns-stem-stride-2", "pointwise"]
)
def test_float64(case: str) -> None:
    x_shape, w_shape, attrs, _ = CASES[case]
    inputs = [_random(*x_shape, dtype=np.float64), _random(*w_shape, dtype=np.float64)]
    node = oh.make_node("Conv", ["x", "w"], ["y"], **attrs)
    got = run_aioinfer(node, inputs, 18)[0]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, run_reference(node, inputs, 18)[0], rtol=1e-10, atol=1e-10)


def test_a_large_convolution_takes_the_blocks_at_the_default_sizes() -> None:
    """PP-OCRv4's detector shape, scaled down: few filters over a large map."""
    x_shape, w_shape = (1, 48, 60, 80), (24, 48, 3, 3)
    geometry = flat_geometry((60, 80), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), (60, 80), 24, 48)
    plan = conv_rows.row_plan(geometry, (1, 1), (60, 80), 1, 48, 24, 2)
    assert plan is not None and plan.implicit and -(-plan.rows // plan.block_rows) >= 2
    inputs = [_random(*x_shape), _random(*w_shape), _random(24)]
    node = oh.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1] * 4)
    got = run_with_constant_weights(node, inputs, 18)[0]
    np.testing.assert_allclose(got, run_reference(node, inputs, 18)[0], rtol=RTOL, atol=ATOL)
    # Many filters, or a small map: one product split by filters.
    assert conv_rows.row_plan(geometry, (1, 1), (60, 80), 1, 48, 128, 2) is None
    small = flat_geometry((8, 8), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), (8, 8), 24, 48)
    assert conv_rows.row_plan(small, (1, 1), (8, 8), 1, 48, 24, 2) is None
    # Nor a batch of small maps with the work of many blocks: a block never spans
    # images, and one image holds less work than a block's numpy calls pay for.
    assert conv_rows.row_plan(small, (1, 1), (8, 8), 64, 48, 24, 2) is None
    # On one thread, 64 filters run faster as one product; on two, in blocks.
    assert conv_rows.row_plan(geometry, (1, 1), (60, 80), 1, 48, 64, 1) is None
    assert conv_rows.row_plan(geometry, (1, 1), (60, 80), 1, 48, 64, 2) is not None


def _square_plan(
    channels: int,
    filters: int,
    size: tuple[int, int],
    kernel: int,
    stride: int,
    threads: int,
    batch: int = 1,
) -> conv_rows.RowPlan | None:
    """The plan of a ``kernel`` x ``kernel`` convolution padded by ``kernel // 2``."""
    pad = kernel // 2
    out = tuple((s + 2 * pad - kernel) // stride + 1 for s in size)
    geometry = flat_geometry(
        size,
        (kernel, kernel),
        (stride,) * 2,
        (1, 1),
        (pad,) * 2,
        (pad,) * 2,
        out,
        filters,
        channels,
    )
    return conv_rows.row_plan(geometry, (stride,) * 2, out, batch, channels, filters, threads)


# (channels, filters, input size, kernel, stride): the models' convolutions whose columns
# of one image fit FLAT_COLUMNS, and some whose columns do not.
ONE_PRODUCT = {
    "resnet-64-64-56": (64, 64, (56, 56), 3, 1),
    "resnet-stem-7x7": (3, 64, (224, 224), 7, 2),
    "yolox-48-48-52": (48, 48, (52, 52), 3, 1),
    "squeezenet-16-64-55": (16, 64, (55, 55), 3, 1),
}
BLOCKS = {
    "ppocr-stem-480x640": (3, 16, (480, 640), 3, 2),
    "ppocr-96-24-60x80": (96, 24, (60, 80), 3, 1),
    "yolox-12-24-208": (12, 24, (208, 208), 3, 1),
    "64-64-80": (64, 64, (80, 80), 3, 1),
}


def test_columns_that_fit_take_one_product_on_two_threads() -> None:
    """On two threads, one product over the image when its columns fit FLAT_COLUMNS,
    blocks beyond and for batches; on one thread the filters alone decide (as before)."""
    for case, (c, m, size, k, s) in ONE_PRODUCT.items():
        assert _square_plan(c, m, size, k, s, 2) is None, case
    for case, (c, m, size, k, s) in BLOCKS.items():
        assert _square_plan(c, m, size, k, s, 2) is not None, case
    # A batch keeps the blocks, which span its images.
    assert _square_plan(16, 64, (55, 55), 3, 1, 2, batch=8) is not None
    assert _square_plan(48, 48, (52, 52), 3, 1, 1) is not None
    assert _square_plan(64, 64, (56, 56), 3, 1, 1) is None


@pytest.mark.parametrize("case", ["yolox-48-48-52", "squeezenet-16-64-55"])
def test_one_product_of_small_columns_matches_the_reference(case: str, threads: int) -> None:
    """The geometries FLAT_COLUMNS moves to one product, at the default sizes."""
    c, m, size, k, s = ONE_PRODUCT[case]
    inputs = [_random(1, c, *size), _random(m, c, k, k), _random(m)]
    node = oh.make_node("Conv", ["x", "w", "b"], ["y"], pads=[k // 2] * 4, strides=[s, s])
    want = run_reference(node, inputs, 18)[0]
    got = run_with_constant_weights(node, inputs, 18)[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(run_aioinfer(node, inputs, 18)[0], want, rtol=RTOL, atol=ATOL)


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize(
    "case", ["implicit-batch-asymmetric", "columns-7x7-stride-2", "pointwise", "pointwise-strided"]
)
def test_blocks_are_bit_for_bit_the_same_on_one_and_two_threads(case: str) -> None:
    """Block bounds depend on the shapes only: one and two intra-op threads, and repeated
    runs, give the same result bit for bit."""
    x_shape, w_shape, attrs, _ = CASES[case]
    inputs = [_random(*x_shape), _random(*w_shape), _random(w_shape[0])]
    node = oh.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    before = parallel._POOL._inside.threads
    parallel.set_intra_op_threads(parallel._POOL.threads)
    try:
        results = []
        for count in (1, 2, 1, 2):
            parallel.use_intra_op_threads(count)
            results.append(run_with_constant_weights(node, inputs, 18)[0])
    finally:
        parallel._POOL._inside.threads = before
    for result in results[1:]:
        np.testing.assert_array_equal(result, results[0])


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize(
    ("activation", "unfused_op"),
    [("Relu", "Relu"), ("HardSwish", "HardSwish"), ("Sigmoid", "Sigmoid"), ("", None)],
)
@pytest.mark.parametrize("residual", ["none", "whole", "per-channel"])
@pytest.mark.parametrize(
    "case", ["implicit-batch-asymmetric", "columns-stem-stride-2", "pointwise", "pointwise-strided"]
)
def test_fused_epilogue_on_each_block(
    activation: str, unfused_op: str | None, residual: str, case: str, threads: int
) -> None:
    """FusedConv: bias, residual (of the output's shape, or one value per image and
    channel) and activation applied to each block as the unfused nodes compute them."""
    x_shape, w_shape, attrs, _ = CASES[case]
    feeds = {"x": _random(*x_shape), "w": _random(*w_shape), "b": _random(w_shape[0])}
    conv = oh.make_node("Conv", ["x", "w", "b"], ["c"], **attrs)
    want = run_reference(conv, list(feeds.values()), 18)[0]
    if residual != "none":
        shape = want.shape if residual == "whole" else (*want.shape[:2], 1, 1)
        feeds["z"] = _random(*shape)
        want = want + feeds["z"]
    if unfused_op is not None:
        want = run_reference(oh.make_node(unfused_op, ["c"], ["y"]), [want], 18)[0]
    node = oh.make_node(
        "FusedConv", list(feeds), ["y"], domain=AIOINFER_DOMAIN, activation=activation, **attrs
    )
    got = run_aioinfer(node, list(feeds.values()), 1)[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.usefixtures("small_blocks")
def test_a_residual_that_does_not_fit_fails() -> None:
    x_shape, w_shape, attrs, _ = CASES["implicit-3x3"]
    feeds = [_random(*x_shape), _random(*w_shape), _random(w_shape[0]), _random(1, 12, 5, 19)]
    node = oh.make_node("FusedConv", ["x", "w", "b", "z"], ["y"], domain=AIOINFER_DOMAIN, **attrs)
    with pytest.raises(ValueError):
        run_aioinfer(node, feeds, 1)


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("case", ["implicit-3x3", "columns-stem-stride-2", "pointwise-strided"])
def test_blocks_from_several_threads(case: str) -> None:
    """One kernel called from several threads at once (requests share kernels; the
    scratch buffers are per thread): every call gives its own input's result."""
    x_shape, w_shape, attrs, _ = CASES[case]
    node = oh.make_node("Conv", ["x", "w"], ["y"], **attrs)
    w = _random(*w_shape)
    inputs = [_random(*x_shape) for _ in range(3)]
    want = [run_reference(node, [x, w], 18)[0] for x in inputs]

    def results_of(index: int) -> list[np.ndarray]:
        return [run_with_constant_weights(node, [inputs[index], w], 18)[0] for _ in range(5)]

    check_from_threads(results_of, want, RTOL, ATOL)


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("case", ["implicit-3x3", "columns-valid-stride-3-1", "pointwise"])
def test_fused_clip_on_each_block(case: str, threads: int) -> None:
    """A Clip activation is applied while each block is copied into place."""
    x_shape, w_shape, attrs, _ = CASES[case]
    feeds = {"x": _random(*x_shape), "w": _random(*w_shape), "b": _random(w_shape[0])}
    conv = oh.make_node("Conv", ["x", "w", "b"], ["c"], **attrs)
    want = np.clip(run_reference(conv, list(feeds.values()), 18)[0], -0.5, 0.75)
    node = oh.make_node(
        "FusedConv",
        list(feeds),
        ["y"],
        domain=AIOINFER_DOMAIN,
        activation="Clip",
        activation_params=[-0.5, 0.75],
        **attrs,
    )
    got = run_aioinfer(node, list(feeds.values()), 1)[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
