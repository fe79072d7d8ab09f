"""The fast Conv paths: phase-flattened columns (taps over padding left out, exact or
long-run columns), depthwise blocks (across images too), Winograd F(2x2, 3x3) and the
FusedConv epilogue applied on each thread's share of a depthwise output.

Checked against onnxruntime and onnx.reference. Tolerances: float32 rtol 1e-4 and atol
1e-4 on sums of up to 864 products of standard normal values (outputs of magnitude up
to ~100; float32 rounding of such sums, in any order, stays below 1e-4), float64 1e-10.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import onnx.helper as oh
import onnx_ir as ir
import pytest

from aioinfer.devices.cpu.kernels import parallel
from aioinfer.devices.cpu.kernels.conv import KEPT_COLUMNS_BYTES
from aioinfer.devices.cpu.kernels.conv_flat import (
    DEPTHWISE_BLOCK_BYTES,
    by_pixels,
    depthwise_channel_bytes,
    flat_geometry,
    shifted_rows,
    tap_bands,
)
from aioinfer.devices.cpu.kernels.conv_winograd import winograd_fits
from aioinfer.devices.cpu.kernels.matmul import columns_split_exactly
from aioinfer.devices.cpu.kernels.registry import find_kernel, make_spec
from aioinfer.transforms.rewrite import AIOINFER_DOMAIN
from tests.kernels._check import (
    check_from_threads,
    run_aioinfer,
    run_reference,
)
from tests.kernels.test_conv import check_onnxruntime, run_with_constant_weights

RTOL, ATOL = 1e-4, 1e-4

rng = np.random.default_rng(23)


def _random(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


# (x shape, w shape, attributes)
CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = {
    # 5x5 on maps 2 and 3 pixels high: the outer kernel rows read only padding.
    "depthwise-5x5-short-maps": ((6, 20, 2, 24), (20, 1, 5, 5), {"group": 20, "pads": [2] * 4}),
    "depthwise-5x5-stride-2-1": (
        (3, 12, 3, 24),
        (12, 1, 5, 5),
        {"group": 12, "pads": [2] * 4, "strides": [2, 1]},
    ),
    # Kernel rows from two phases in one band: rows 0 and 2 from one, row 1 the other.
    "depthwise-3x3-stride-2-1": (
        (2, 10, 9, 20),
        (10, 1, 3, 3),
        {"group": 10, "pads": [1, 1, 2, 1], "strides": [2, 1]},
    ),
    # Blocks of channels that span several images.
    "depthwise-3x3-batch": ((5, 7, 10, 10), (7, 1, 3, 3), {"group": 7, "pads": [1] * 4}),
    # Many channels: blocks within one image.
    "depthwise-5x5-many-channels": (
        (1, 300, 14, 14),
        (300, 1, 5, 5),
        {"group": 300, "pads": [2] * 4},
    ),
    "depthwise-3x3-stride-2": (
        (1, 32, 23, 22),
        (32, 1, 3, 3),
        {"group": 32, "pads": [1, 0, 1, 1], "strides": [2, 2]},
    ),
    # Stride 2 along the columns too: two bands (kernel columns 0, 2, 4 and 1, 3).
    "depthwise-5x5-stride-2": (
        (2, 9, 23, 18),
        (9, 1, 5, 5),
        {"group": 9, "pads": [2, 1, 2, 2], "strides": [2, 2]},
    ),
    "depthwise-3x3-dilated": (
        (2, 6, 9, 11),
        (6, 1, 3, 3),
        {"group": 6, "pads": [2, 1, 2, 3], "dilations": [2, 2]},
    ),
    "depthwise-dilated-kernel-larger-than-map": (
        (2, 4, 3, 4),
        (4, 1, 3, 3),
        {"group": 4, "pads": [3, 3, 3, 3], "dilations": [3, 2]},
    ),
    # Large maps; the columns of one channel of the last two exceed a block: done in
    # pieces of output rows (the last one shorter).
    "depthwise-3x3-large-map": ((2, 6, 60, 61), (6, 1, 3, 3), {"group": 6, "pads": [1] * 4}),
    "depthwise-3x3-large-map-stride-2": (
        (1, 5, 130, 121),
        (5, 1, 3, 3),
        {"group": 5, "pads": [1] * 4, "strides": [2, 2]},
    ),
    "depthwise-3x3-pieces": ((2, 3, 211, 213), (3, 1, 3, 3), {"group": 3, "pads": [1] * 4}),
    "depthwise-3x3-pieces-stride-2": (
        (1, 2, 421, 357),
        (2, 1, 3, 3),
        {"group": 2, "pads": [1, 0, 1, 1], "strides": [2, 2]},
    ),
    "depthwise-5x5-pieces-stride-2": (
        (1, 2, 421, 357),
        (2, 1, 5, 5),
        {"group": 2, "pads": [2, 1, 2, 2], "strides": [2, 2]},
    ),
    "depthwise-1d": ((2, 16, 50), (16, 1, 5), {"group": 16, "pads": [2, 2]}),
    # Taps of one phase whose offsets do not form one run (stride 3, dilation 2, and
    # padding that leaves out a middle tap's rows for no output).
    "general-stride-3-dilation-2": (
        (2, 64, 4, 170),
        (5, 64, 5, 5),
        {"pads": [5, 1, 5, 1], "strides": [3, 3], "dilations": [2, 2]},
    ),
    # Long-run columns (few filters) and exact columns (many filters on a 7x7 map).
    "general-long-runs": ((2, 16, 40, 45), (8, 16, 3, 3), {"pads": [1] * 4}),
    "general-exact-columns": ((4, 64, 7, 7), (512, 64, 3, 3), {"pads": [1] * 4}),
    "general-stem-stride-2": (
        (2, 3, 96, 96),
        (16, 3, 3, 3),
        {"pads": [1] * 4, "strides": [2, 2]},
    ),
    "grouped": ((2, 16, 30, 30), (24, 4, 3, 3), {"group": 4, "pads": [1] * 4}),
    "general-1d": ((2, 32, 1000), (7, 32, 3), {"pads": [1, 1], "strides": [2]}),
    # Large products of few filters, split between threads by pixels.
    "few-filters-3x3": ((1, 16, 64, 60), (48, 16, 3, 3), {"pads": [1] * 4}),
    "few-filters-pointwise": ((2, 64, 48, 48), (32, 64, 1, 1), {}),
    "few-filters-pointwise-strided": ((1, 64, 95, 96), (40, 64, 1, 1), {"strides": [2, 2]}),
    # One output pixel per image: the images are the rows of one product.
    "one-pixel-pointwise-batch": ((6, 88, 1, 1), (22, 88, 1, 1), {}),
    "one-pixel-3x3-batch": ((4, 8, 3, 3), (5, 8, 3, 3), {}),
    "one-pixel-strided-1d": ((3, 16, 5), (7, 16, 1), {"strides": [5]}),
    # Winograd F(2x2, 3x3): even and odd output sizes, asymmetric padding, batch.
    "winograd-even": ((1, 96, 12, 12), (96, 96, 3, 3), {"pads": [1] * 4}),
    "winograd-odd-asymmetric": ((2, 96, 13, 11), (100, 96, 3, 3), {"pads": [0, 1, 2, 1]}),
    "winograd-valid": ((1, 128, 15, 16), (96, 128, 3, 3), {}),
}


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_conv_paths_match_onnxruntime(case: str, with_bias: bool, threads: int) -> None:
    x_shape, w_shape, attrs = CASES[case]
    inputs = [_random(*x_shape), _random(*w_shape)]
    if with_bias:
        inputs.append(_random(w_shape[0]))
    node = oh.make_node("Conv", ["x", "w", "b"][: len(inputs)], ["y"], **attrs)
    check_onnxruntime(node, inputs, 11, rtol=RTOL, atol=ATOL)
    got = run_with_constant_weights(node, inputs, 11)[0]
    np.testing.assert_allclose(got, run_reference(node, inputs, 11)[0], rtol=RTOL, atol=ATOL)


def test_the_cases_take_the_paths_they_name() -> None:
    """The geometry of each case leads where its name says (the tests above would pass
    on any correct path)."""

    def geometry(case: str) -> Any:
        x_shape, w_shape, attrs = CASES[case]
        rank = len(x_shape) - 2
        pads = attrs.get("pads", [0] * 2 * rank)
        strides = attrs.get("strides", [1] * rank)
        dilations = attrs.get("dilations", [1] * rank)
        out = [
            (size + pads[i] + pads[i + rank] - (k - 1) * d - 1) // s + 1
            for i, (size, k, s, d) in enumerate(
                zip(x_shape[2:], w_shape[2:], strides, dilations, strict=True)
            )
        ]
        group = attrs.get("group", 1)
        return flat_geometry(
            x_shape[2:],
            w_shape[2:],
            strides,
            dilations,
            pads[:rank],
            pads[rank:],
            out,
            w_shape[0] // group,
            w_shape[1],
        ), out

    for case, (x_shape, w_shape, _) in CASES.items():
        if case.startswith("general") or case == "grouped":  # not kept im2col columns
            _, out = geometry(case)
            columns = x_shape[0] * x_shape[1] * np.prod(w_shape[2:]) * np.prod(out) * 4
            assert columns > KEPT_COLUMNS_BYTES, case

    def channel_bytes(case: str) -> int:
        flat = geometry(case)[0]
        return depthwise_channel_bytes(flat, 4, flat.length)

    for case in (
        "depthwise-3x3-pieces",
        "depthwise-3x3-pieces-stride-2",
        "depthwise-5x5-pieces-stride-2",
    ):
        assert channel_bytes(case) > DEPTHWISE_BLOCK_BYTES, case  # in pieces of rows
    assert channel_bytes("depthwise-3x3-large-map") < DEPTHWISE_BLOCK_BYTES
    # Shifted rows: one tap group, several groups (stride 2 along the rows, or both
    # ways with 5x5), dilated columns, pieces of rows; the others copy columns.
    rows = {
        "depthwise-5x5-short-maps",
        "depthwise-5x5-stride-2-1",
        "depthwise-3x3-stride-2-1",
        "depthwise-3x3-batch",
        "depthwise-5x5-many-channels",
        "depthwise-3x3-dilated",
        "depthwise-3x3-large-map",
        "depthwise-3x3-pieces",
        "depthwise-5x5-stride-2",
        "depthwise-5x5-pieces-stride-2",
    }
    for case in CASES:
        if case.startswith("depthwise"):
            assert shifted_rows(geometry(case)[0]) is (case in rows), case
    for case in ("depthwise-5x5-stride-2-1", "depthwise-3x3-stride-2-1"):
        flat = geometry(case)[0]
        assert len(flat.groups) == 2 and len(tap_bands(flat)) == 1, case  # two phases, one band
    flat = geometry("depthwise-5x5-stride-2")[0]
    assert len(flat.groups) == 4 and len(tap_bands(flat)) == 2  # four phases, two bands
    assert geometry("depthwise-3x3-dilated")[0].groups[0].col_step == 2
    short, _ = geometry("depthwise-5x5-short-maps")
    assert len(short.order) == 15  # kernel rows 0 and 4 read only padding
    irregular, _ = geometry("general-stride-3-dilation-2")
    assert len(irregular.order) < 25 and any(g.rows == 1 for g in irregular.groups)
    assert not geometry("general-long-runs")[0].exact
    assert geometry("general-exact-columns")[0].exact
    for case in ("winograd-even", "winograd-odd-asymmetric", "winograd-valid"):
        x_shape, w_shape, _ = CASES[case]
        out = tuple(geometry(case)[1])
        assert winograd_fits((3, 3), (1, 1), (1, 1), 1, x_shape[1], w_shape[0], out)
    assert not winograd_fits((3, 3), (1, 1), (1, 1), 1, 32, 256, (7, 7))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_few_filters_split_by_pixels_only_where_columns_do_not_split_exactly(
    dtype: type,
) -> None:
    """A large product of few filters on two threads is split by pixels (and transposed
    into the output) only where matmul's column blocks are not bit for bit one call's
    columns; where they are, its column blocks write the output directly."""
    x_shape, w_shape, _ = CASES["few-filters-pointwise"]
    filters, inner, pixels = w_shape[0], x_shape[1], x_shape[2] * x_shape[3]
    before = parallel._POOL._inside.threads
    parallel.use_intra_op_threads(2)
    try:
        split = by_pixels(filters, inner, pixels, np.dtype(dtype))
        parallel.use_intra_op_threads(1)
        alone = by_pixels(filters, inner, pixels, np.dtype(dtype))
    finally:
        parallel._POOL._inside.threads = before
    exact = dtype == np.float32 and columns_split_exactly()
    assert split is not exact
    assert not alone


@pytest.mark.parametrize(
    ("case", "counts"),
    [
        ("few-filters-3x3", (2, 2, 2)),
        ("few-filters-pointwise", (2, 2, 2)),
        ("general-long-runs", (2, 2, 2)),
        ("general-exact-columns", (1, 2, 1, 2)),
        ("winograd-even", (1, 2, 1, 2)),
        ("depthwise-5x5-many-channels", (1, 2, 1, 2)),
        ("depthwise-3x3-pieces", (1, 2, 1, 2)),
    ],
)
def test_conv_paths_are_deterministic(case: str, counts: tuple[int, ...]) -> None:
    """Repeated runs give the same result bit for bit, and so do one and two intra-op
    threads except for products of few filters (on two threads, computed by pixels in
    blocks whose bounds keep the result of one call). BLAS runs on one thread, as the
    device runs it."""
    x_shape, w_shape, attrs = CASES[case]
    inputs = [_random(*x_shape), _random(*w_shape)]
    node = oh.make_node("Conv", ["x", "w"], ["y"], **attrs)
    before = parallel._POOL._inside.threads
    parallel.set_intra_op_threads(parallel._POOL.threads)
    try:
        results = []
        for count in counts:
            parallel.use_intra_op_threads(count)
            results.append(run_with_constant_weights(node, inputs, 11)[0])
    finally:
        parallel._POOL._inside.threads = before
    for result in results[1:]:
        np.testing.assert_array_equal(result, results[0])


@pytest.mark.parametrize(("dtype", "tol"), [(np.float64, 1e-10), (np.float16, 2e-2)])
@pytest.mark.parametrize("case", ["winograd-odd-asymmetric", "depthwise-3x3-batch"])
def test_conv_paths_dtypes(case: str, dtype: type, tol: float) -> None:
    x_shape, w_shape, attrs = CASES[case]
    inputs = [_random(*x_shape, dtype=dtype), _random(*w_shape, dtype=dtype)]
    node = oh.make_node("Conv", ["x", "w"], ["y"], **attrs)
    got = run_aioinfer(node, inputs, 11)[0]
    wide = [x.astype(np.float64) for x in inputs]
    want = run_reference(node, wide, 11)[0]
    assert got.dtype == dtype
    # float16 output: relative to the largest output (sums of hundreds of products).
    scale = 1.0 if dtype == np.float64 else float(np.abs(want).max())
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize(
    ("activation", "unfused_op"), [("HardSwish", "HardSwish"), ("Relu", "Relu"), ("", None)]
)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize(
    "case",
    [
        "depthwise-5x5-many-channels",
        "depthwise-5x5-stride-2-1",
        "depthwise-3x3-large-map",
        "depthwise-3x3-pieces",
        "depthwise-1d",
    ],
)
def test_fused_depthwise_epilogue(
    activation: str, unfused_op: str | None, residual: bool, case: str, threads: int
) -> None:
    """FusedConv on a depthwise convolution: bias, residual and activation applied on
    each thread's share of the output, as the unfused nodes compute them."""
    x_shape, w_shape, attrs = CASES[case]
    x_shape = (2, *x_shape[1:])
    feeds = {"x": _random(*x_shape), "w": _random(*w_shape), "b": _random(w_shape[0])}
    conv = oh.make_node("Conv", ["x", "w", "b"], ["c"], **attrs)
    want = run_reference(conv, [feeds["x"], feeds["w"], feeds["b"]], 18)[0]
    if residual:
        feeds["z"] = _random(*want.shape)
    node = oh.make_node(
        "FusedConv",
        list(feeds),
        ["y"],
        domain=AIOINFER_DOMAIN,
        activation=activation,
        **attrs,
    )
    got = run_aioinfer(node, list(feeds.values()), 1)[0]
    if residual:
        want = want + feeds["z"]
    if unfused_op is not None:
        want = run_reference(oh.make_node(unfused_op, ["c"], ["y"]), [want], 18)[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("activation", "params"), [("HardSigmoid", [0.2, 0.5]), ("Relu", []), ("HardSwish", [])]
)
@pytest.mark.parametrize("case", ["one-pixel-pointwise-batch", "one-pixel-3x3-batch"])
def test_fused_one_pixel_epilogue(activation: str, params: list[float], case: str) -> None:
    """FusedConv of one output pixel per image (a squeeze-and-excitation block's): the
    bias and the activation on the rows of the one product, as the unfused nodes."""
    x_shape, w_shape, attrs = CASES[case]
    inputs = [_random(*x_shape), _random(*w_shape), _random(w_shape[0])]
    node = oh.make_node(
        "FusedConv",
        ["x", "w", "b"],
        ["y"],
        domain=AIOINFER_DOMAIN,
        activation=activation,
        **({"activation_params": params} if params else {}),
        **attrs,
    )
    got = run_aioinfer(node, inputs, 1)[0]
    want = run_reference(oh.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), inputs, 18)[0]
    named = dict(zip(["alpha", "beta"], params, strict=False))
    unfused = oh.make_node(activation, ["c"], ["y"], **named)
    want = run_reference(unfused, [want], 18)[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_fused_depthwise_residual_that_does_not_fit_fails() -> None:
    x_shape, w_shape, attrs = CASES["depthwise-3x3-batch"]
    feeds = [_random(*x_shape), _random(*w_shape), _random(w_shape[0]), _random(5, 7, 3, 10)]
    node = oh.make_node("FusedConv", ["x", "w", "b", "z"], ["y"], domain=AIOINFER_DOMAIN, **attrs)
    with pytest.raises(ValueError):
        run_aioinfer(node, feeds, 1)


@pytest.mark.parametrize(
    "case", ["depthwise-5x5-many-channels", "winograd-even", "general-long-runs"]
)
def test_conv_paths_from_several_threads(case: str) -> None:
    """One kernel called from several threads at once (requests share kernels; the
    scratch buffers are per thread): every call gives its own input's result."""
    x_shape, w_shape, attrs = CASES[case]
    node = oh.make_node("Conv", ["x", "w"], ["y"], **attrs)
    w = _random(*w_shape)
    inputs = [_random(*x_shape) for _ in range(3)]
    want = [run_reference(node, [x, w], 11)[0] for x in inputs]

    def results_of(index: int) -> list[np.ndarray]:
        found = [run_with_constant_weights(node, [inputs[index], w], 11)[0]]
        return found + [run_aioinfer(node, [inputs[index], w], 11)[0] for _ in range(5)]

    check_from_threads(results_of, want, RTOL, ATOL)


@pytest.mark.parametrize("threads", [1], indirect=True)
def test_depthwise_views_of_scratch_follow_a_grown_slot(threads: int) -> None:
    """A depthwise convolution whose phases and blocks are views of this thread's
    scratch keeps the views between calls, but not past a slot that another kernel grew
    since: the next call makes them again, and the replaced buffers are freed."""
    from aioinfer.devices.cpu.kernels import conv_flat

    x_shape, w_shape, attrs = CASES["depthwise-3x3-pieces"]  # blocks on this thread
    node = oh.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    w, b = _random(*w_shape), _random(w_shape[0])
    ir_node = ir.from_proto(node)
    conv = find_kernel("", "Conv", 11).factory(make_spec(ir_node, 11, [None, w, b]))
    for call in range(2):
        x = _random(*x_shape)
        want = run_reference(node, [x, w, b], 11)[0]
        np.testing.assert_allclose(conv(x, w, b)[0], want, rtol=RTOL, atol=ATOL)
        slots = ("phases", "block", "block-sums")
        arena = conv_flat._arena.buffers
        if call == 0:
            replaced = [weakref.ref(arena[slot]) for slot in slots]
            for slot in slots:  # another kernel needs more
                conv_flat.scratch(slot, (arena[slot].nbytes + 1,), np.dtype(np.uint8))
    gc.collect()
    assert all(ref() is None for ref in replaced)


def test_depthwise_taps_are_made_once_with_a_bias_fed_at_run_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Constant depthwise weights with a bias known only at run time: the taps of the
    shifted rows are made at the first call and kept (each call only adds its bias to
    the vectors of the last product)."""
    from aioinfer.devices.cpu.kernels import conv as conv_module

    seen: list[Any] = []
    depthwise = conv_module.flat_depthwise

    def spy(geometry: Any, x: np.ndarray, operands: Any, *rest: Any) -> None:
        seen.append(operands)
        depthwise(geometry, x, operands, *rest)

    monkeypatch.setattr(conv_module, "flat_depthwise", spy)
    x_shape, w_shape, attrs = CASES["depthwise-5x5-short-maps"]
    node = oh.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    w = _random(*w_shape)
    conv = find_kernel("", "Conv", 11).factory(make_spec(ir.from_proto(node), 11, [None, w]))
    for _ in range(2):
        x, b = _random(*x_shape), _random(w_shape[0])
        want = run_reference(node, [x, w, b], 11)[0]
        np.testing.assert_allclose(conv(x, w, b)[0], want, rtol=RTOL, atol=ATOL)
    first, second = seen
    assert first.biased and second.biased and first.bands
    assert all(a is b for a, b in zip(first.bands, second.bands, strict=True))
