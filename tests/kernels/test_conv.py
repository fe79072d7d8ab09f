"""Conv and ConvTranspose against onnx.reference (and onnxruntime where the reference errs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

from aioinfer.devices.cpu.kernels.registry import find_kernel, find_out_kernel, make_spec
from tests.kernels._check import check_from_threads, check_node, run_aioinfer, run_reference

RTOL, ATOL = 1e-4, 1e-5

rng = np.random.default_rng(7)


def _random(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def check_onnxruntime(
    node: onnx.NodeProto,
    inputs: Sequence[np.ndarray | None],
    opset: int,
    rtol: float = RTOL,
    atol: float = ATOL,
) -> list[np.ndarray]:
    """Like ``check_node``, against onnxruntime: for cases where onnx.reference is wrong."""
    ort = pytest.importorskip("onnxruntime")
    feeds = {n: x for n, x in zip(node.input, inputs, strict=False) if n and x is not None}
    graph = oh.make_graph(
        [node],
        "check",
        [
            oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(x.dtype), x.shape)
            for n, x in feeds.items()
        ],
        [onnx.ValueInfoProto(name=n) for n in node.output if n],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    want = session.run(None, feeds)
    got = run_aioinfer(node, inputs, opset)
    for g, w in zip(got, want, strict=False):
        assert g.dtype == w.dtype, f"dtype {g.dtype}, want {w.dtype}"
        assert g.shape == w.shape, f"shape {g.shape}, want {w.shape}"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return got


def run_with_constant_weights(
    node: onnx.NodeProto, inputs: Sequence[np.ndarray | None], opset: int
) -> list[np.ndarray]:
    """Run ``node`` with every input but the first known at compile time."""
    ir_node = ir.from_proto(node)
    entry = find_kernel(ir_node.domain, ir_node.op_type, opset)
    fn = entry.factory(make_spec(ir_node, opset, [None, *inputs[1:]]))
    return list(fn(*inputs))


# -- Conv --------------------------------------------------------------------------------

# (x shape, w shape, attributes, opset)
CONV_CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any], int]] = {
    "1d": ((2, 3, 9), (4, 3, 3), {"strides": [2], "pads": [1, 2]}, 11),
    "1d-dilated": ((1, 2, 11), (3, 2, 3), {"dilations": [3]}, 7),
    "2d-opset1": ((1, 3, 6, 6), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}, 1),
    "2d-opset7": ((2, 3, 6, 5), (4, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, 7),
    "2d-asymmetric": (
        (2, 4, 7, 8),
        (5, 4, 3, 2),
        {"pads": [1, 0, 2, 1], "strides": [2, 1], "dilations": [1, 2]},
        22,
    ),
    "2d-kernel-shape-attr": ((1, 2, 5, 6), (3, 2, 2, 3), {"kernel_shape": [2, 3]}, 11),
    "2d-same-upper": (
        (1, 3, 7, 8),
        (4, 3, 3, 2),
        {"auto_pad": "SAME_UPPER", "strides": [2, 3]},
        11,
    ),
    "2d-same-lower": (
        (1, 3, 7, 8),
        (4, 3, 3, 2),
        {"auto_pad": "SAME_LOWER", "strides": [2, 3]},
        11,
    ),
    "2d-same-lower-dilated": (
        (1, 3, 7, 8),
        (4, 3, 3, 2),
        {"auto_pad": "SAME_LOWER", "strides": [2, 1], "dilations": [2, 2]},
        22,
    ),
    "2d-valid": ((1, 3, 7, 8), (4, 3, 3, 2), {"auto_pad": "VALID", "strides": [2, 2]}, 11),
    "2d-group2": ((2, 4, 6, 5), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 0, 0]}, 11),
    "2d-group2-strided": ((1, 4, 7, 7), (4, 2, 3, 3), {"group": 2, "strides": [2, 2]}, 22),
    "2d-depthwise": (
        (2, 3, 7, 7),
        (3, 1, 3, 3),
        {"group": 3, "pads": [1] * 4, "strides": [2] * 2},
        11,
    ),
    "2d-depthwise-multiplier": ((1, 3, 6, 6), (6, 1, 3, 3), {"group": 3, "pads": [0, 1, 1, 0]}, 11),
    # Depthwise 1-D and 2-D convolutions read contiguous runs of strided phases.
    "1d-depthwise": ((2, 4, 9), (4, 1, 3), {"group": 4, "pads": [2, 0], "strides": [2]}, 11),
    "2d-depthwise-5x5-same": (
        (1, 6, 9, 7),
        (6, 1, 5, 5),
        {"group": 6, "auto_pad": "SAME_UPPER"},
        11,
    ),
    "2d-depthwise-dilated-strided": (
        (2, 3, 11, 10),
        (3, 1, 3, 2),
        {"group": 3, "pads": [0, 2, 1, 1], "strides": [3, 2], "dilations": [2, 3]},
        11,
    ),
    "3d-depthwise": ((1, 2, 4, 5, 4), (2, 1, 2, 3, 2), {"group": 2, "pads": [1] * 6}, 11),
    "2d-pointwise": ((2, 8, 5, 4), (6, 8, 1, 1), {}, 11),
    "2d-pointwise-group": ((1, 8, 3, 3), (6, 4, 1, 1), {"group": 2}, 11),
    "2d-pointwise-strided": ((1, 8, 5, 5), (6, 8, 1, 1), {"strides": [2, 2]}, 11),
    "2d-pointwise-padded": ((1, 4, 3, 3), (2, 4, 1, 1), {"pads": [1, 0, 0, 1]}, 11),
    "2d-size-one": ((1, 2, 1, 1), (3, 2, 1, 1), {}, 11),
    "2d-kernel-covers-input": ((1, 2, 3, 4), (3, 2, 3, 4), {}, 11),
    "2d-empty-batch": ((0, 2, 4, 4), (3, 2, 3, 3), {}, 11),
    "3d": (
        (1, 2, 5, 4, 6),
        (3, 2, 3, 2, 2),
        {"pads": [1, 0, 1, 0, 1, 0], "strides": [1, 2, 1]},
        11,
    ),
    "3d-group-dilated": (
        (1, 4, 5, 5, 5),
        (4, 2, 2, 2, 2),
        {"group": 2, "dilations": [2, 1, 2]},
        22,
    ),
    "3d-same-upper": ((1, 2, 4, 5, 3), (2, 2, 2, 3, 2), {"auto_pad": "SAME_UPPER"}, 11),
}


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv(case: str, with_bias: bool) -> None:
    x_shape, w_shape, attrs, opset = CONV_CASES[case]
    inputs = [_random(*x_shape), _random(*w_shape)]
    if with_bias:
        inputs.append(_random(w_shape[0]))
    node = oh.make_node("Conv", ["x", "w", "b"][: len(inputs)], ["y"], **attrs)
    check_node(node, inputs, opset=opset, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", ["1d", "2d-asymmetric", "2d-group2", "2d-depthwise", "3d"])
def test_conv_constant_weights_match_reference(case: str) -> None:
    x_shape, w_shape, attrs, opset = CONV_CASES[case]
    inputs = [_random(*x_shape), _random(*w_shape), _random(w_shape[0])]
    node = oh.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    got = run_with_constant_weights(node, inputs, opset)[0]
    want = run_reference(node, inputs, opset)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(("dtype", "tol"), [(np.float64, 1e-10), (np.float16, 1e-2)])
def test_conv_dtypes(dtype: type, tol: float) -> None:
    inputs = [_random(1, 3, 5, 5, dtype=dtype), _random(2, 3, 3, 3, dtype=dtype)]
    inputs.append(_random(2, dtype=dtype))
    node = oh.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])
    check_node(node, inputs, opset=11, rtol=tol, atol=tol)


def test_conv_is_deterministic_across_input_shapes() -> None:
    node = oh.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])
    w = _random(2, 3, 3, 3)
    ir_node = ir.from_proto(node)
    fn = find_kernel("", "Conv", 11).factory(make_spec(ir_node, 11, [None, w]))
    for shape in [(1, 3, 5, 5), (2, 3, 8, 6), (1, 3, 5, 5)]:
        x = _random(*shape)
        np.testing.assert_allclose(
            fn(x, w)[0], run_reference(node, [x, w], 11)[0], rtol=RTOL, atol=ATOL
        )


@pytest.mark.parametrize("kernel", [(1, 1), (3, 2)])
def test_conv_non_contiguous_input(kernel: tuple[int, int]) -> None:
    x = _random(1, 3, 6, 5).transpose(0, 1, 3, 2)[:, :, ::-1]
    w = _random(4, 3, *kernel)
    check_node(oh.make_node("Conv", ["x", "w"], ["y"]), [x, w], opset=11, rtol=RTOL, atol=ATOL)


def test_conv_does_not_modify_inputs() -> None:
    x, w, b = _random(1, 2, 4, 4), _random(3, 2, 1, 1), _random(3)
    copies = [x.copy(), w.copy(), b.copy()]
    for flag in (x, w, b):
        flag.flags.writeable = False
    run_aioinfer(oh.make_node("Conv", ["x", "w", "b"], ["y"]), [x, w, b], 11)
    for original, copy in zip((x, w, b), copies, strict=True):
        np.testing.assert_array_equal(original, copy)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        ((1, 3, 5, 5), (2, 2, 3, 3), {}),
        ((1, 4, 5, 5), (3, 2, 3, 3), {"group": 2}),
        ((1, 3, 2, 2), (2, 3, 3, 3), {}),
        ((1, 3, 5), (2, 3, 3, 3), {}),
        ((1, 3, 5, 5), (2, 3, 3, 3), {"pads": [1, 1]}),
        ((1, 3, 5, 5), (2, 3, 3, 3), {"strides": [1, 1, 1]}),
    ],
)
def test_conv_rejects_inconsistent_shapes(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]
) -> None:
    node = oh.make_node("Conv", ["x", "w"], ["y"], **attrs)
    with pytest.raises(ValueError):
        run_aioinfer(node, [_random(*x_shape), _random(*w_shape)], 11)


def test_conv_rejects_unknown_auto_pad() -> None:
    node = oh.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME")
    with pytest.raises(ValueError, match="auto_pad"):
        run_aioinfer(node, [_random(1, 1, 3, 3), _random(1, 1, 1, 1)], 11)


# -- ConvTranspose -----------------------------------------------------------------------

# (x shape, w shape, attributes, opset)
TRANSPOSE_CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any], int]] = {
    "2d-opset1": ((1, 3, 4, 4), (3, 2, 3, 3), {}, 1),
    "2d-strided-asymmetric": (
        (2, 3, 4, 3),
        (3, 2, 3, 2),
        {"strides": [2, 3], "pads": [1, 0, 0, 2], "output_padding": [1, 0]},
        11,
    ),
    "2d-dilated": ((1, 3, 4, 3), (3, 2, 3, 2), {"strides": [2, 1], "dilations": [2, 3]}, 22),
    "2d-output-shape": (
        (1, 3, 4, 4),
        (3, 2, 3, 3),
        {"strides": [2, 2], "output_shape": [9, 10]},
        11,
    ),
    "2d-same-upper": (
        (1, 3, 4, 3),
        (3, 2, 3, 3),
        {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
        11,
    ),
    "2d-same-lower": (
        (1, 3, 4, 3),
        (3, 2, 3, 3),
        {"strides": [2, 2], "auto_pad": "SAME_LOWER"},
        11,
    ),
    "2d-same-upper-output-shape": (
        (1, 3, 4, 4),
        (3, 2, 3, 3),
        {"strides": [2, 2], "auto_pad": "SAME_UPPER", "output_shape": [8, 7]},
        11,
    ),
    "2d-valid": ((1, 3, 4, 3), (3, 2, 2, 3), {"strides": [2, 2], "auto_pad": "VALID"}, 11),
    "2d-kernel-shape-attr": ((1, 2, 3, 4), (2, 2, 3, 2), {"kernel_shape": [3, 2]}, 22),
    "1d": ((2, 3, 5), (3, 2, 3), {"strides": [2], "pads": [1, 0]}, 11),
    "3d": (
        (1, 2, 3, 4, 3),
        (2, 2, 2, 3, 2),
        {"strides": [2, 1, 2], "pads": [1, 0, 0, 0, 1, 1]},
        11,
    ),
    # Kernel as large as the stride: each tap's products go straight to their pixels.
    "2d-tiled": ((2, 3, 5, 4), (3, 2, 2, 2), {"strides": [2, 2]}, 11),
    "2d-tiled-3x2": ((1, 4, 3, 5), (4, 3, 3, 2), {"strides": [3, 2]}, 11),
    "1d-tiled": ((2, 3, 5), (3, 4, 3), {"strides": [3]}, 11),
    "2d-tiled-padding-cropped": (
        (1, 2, 3, 4),
        (2, 2, 2, 2),
        {"strides": [2, 2], "output_padding": [1, 1], "pads": [0, 0, 1, 1]},
        11,
    ),
    "2d-kernel-stride-shifted": (
        (1, 2, 3, 4),
        (2, 2, 2, 2),
        {"strides": [2, 2], "output_padding": [1, 1], "pads": [1, 0, 0, 1]},
        11,
    ),
}


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("case", list(TRANSPOSE_CASES))
def test_conv_transpose(case: str, with_bias: bool) -> None:
    x_shape, w_shape, attrs, opset = TRANSPOSE_CASES[case]
    inputs = [_random(*x_shape), _random(*w_shape)]
    if with_bias:
        inputs.append(_random(w_shape[1] * attrs.get("group", 1)))
    node = oh.make_node("ConvTranspose", ["x", "w", "b"][: len(inputs)], ["y"], **attrs)
    check_node(node, inputs, opset=opset, rtol=RTOL, atol=ATOL)


# onnx.reference mishandles groups and odd output_shape padding; onnxruntime follows the spec.
ORT_TRANSPOSE_CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = {
    "group2": ((1, 4, 4, 3), (4, 3, 3, 3), {"group": 2, "strides": [2, 2]}),
    "depthwise": ((2, 3, 4, 4), (3, 1, 3, 3), {"group": 3, "pads": [1, 1, 0, 0]}),
    "odd-output-shape-padding": (
        (1, 3, 4, 4),
        (3, 2, 3, 3),
        {"strides": [2, 2], "output_shape": [8, 8]},
    ),
    "3d-group": ((1, 4, 2, 3, 2), (4, 1, 2, 2, 2), {"group": 2, "strides": [1, 2, 2]}),
    "tiled-group": ((2, 4, 3, 3), (4, 3, 2, 2), {"group": 2, "strides": [2, 2]}),
}


@pytest.mark.parametrize("case", list(ORT_TRANSPOSE_CASES))
def test_conv_transpose_against_onnxruntime(case: str) -> None:
    x_shape, w_shape, attrs = ORT_TRANSPOSE_CASES[case]
    inputs = [_random(*x_shape), _random(*w_shape), _random(w_shape[1] * attrs.get("group", 1))]
    node = oh.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    check_onnxruntime(node, inputs, opset=11)


@pytest.mark.parametrize("case", ["2d-strided-asymmetric", "3d"])
def test_conv_transpose_constant_weights(case: str) -> None:
    x_shape, w_shape, attrs, opset = TRANSPOSE_CASES[case]
    inputs = [_random(*x_shape), _random(*w_shape), _random(w_shape[1])]
    node = oh.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    got = run_with_constant_weights(node, inputs, opset)[0]
    want = run_reference(node, inputs, opset)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(("dtype", "tol"), [(np.float64, 1e-10), (np.float16, 1e-2)])
def test_conv_transpose_dtypes(dtype: type, tol: float) -> None:
    inputs = [_random(1, 2, 3, 3, dtype=dtype), _random(2, 2, 3, 3, dtype=dtype)]
    node = oh.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2])
    check_node(node, inputs, opset=11, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        ((1, 3, 4, 4), (2, 2, 3, 3), {}),
        ((1, 3, 4, 4), (3, 2, 3, 3), {"group": 2}),
        ((1, 3, 4, 4), (3, 2, 3, 3), {"pads": [3, 3, 3, 3]}),
        ((1, 3, 4, 4), (3, 2, 3, 3), {"output_padding": [1]}),
        ((1, 3, 4, 4), (3, 2, 3, 3), {"output_shape": [9]}),
    ],
)
def test_conv_transpose_rejects_inconsistent_shapes(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]
) -> None:
    node = oh.make_node("ConvTranspose", ["x", "w"], ["y"], **attrs)
    with pytest.raises(ValueError):
        run_aioinfer(node, [_random(*x_shape), _random(*w_shape)], 11)


@pytest.mark.parametrize("size", [8, 48], ids=["kept-columns", "thread-scratch"])
def test_conv_columns_are_per_thread(size: int) -> None:
    """One Conv kernel (as requests share it) called from several threads at once, on
    the small shapes whose im2col buffers it keeps and on larger ones that use a thread's
    scratch buffer: every call gives its own input's result, and earlier results stay."""
    node = oh.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], strides=[1, 1])
    w, b = _random(8, 4, 3, 3), _random(8)
    inputs = [_random(1, 4, size, size) for _ in range(4)]
    want = [run_reference(node, [x, w, b], 18)[0] for x in inputs]
    ir_node = ir.from_proto(node)
    run = find_kernel("", "Conv", 18).factory(make_spec(ir_node, 18))
    check_from_threads(
        lambda index: [run(inputs[index], w, b)[0] for _ in range(20)], want, RTOL, ATOL
    )


@pytest.mark.parametrize("case", ["2d-tiled", "2d-strided-asymmetric"])
def test_conv_transpose_writes_into_the_planned_buffer(case: str) -> None:
    """The out form writes into a buffer of the output's shape and dtype, and allocates
    when the inputs give the output another shape."""
    x_shape, w_shape, attrs, opset = TRANSPOSE_CASES[case]
    inputs = [_random(*x_shape), _random(*w_shape), _random(w_shape[1])]
    node = oh.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    want = run_reference(node, inputs, opset)[0]
    entry = find_kernel("", "ConvTranspose", opset)
    out_factory = find_out_kernel(entry)
    assert out_factory is not None
    run = out_factory(make_spec(ir.from_proto(node), opset))
    assert run is not None
    buffer = np.full(want.shape, np.nan, np.float32)
    got = run(buffer, *inputs)[0]
    assert got is buffer
    np.testing.assert_allclose(buffer, want, rtol=RTOL, atol=ATOL)
    other = run(np.empty((1, 1), np.float32), *inputs)[0]
    np.testing.assert_allclose(other, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", ["2d-tiled", "2d-strided-asymmetric"])
def test_conv_transpose_from_several_threads(case: str) -> None:
    """One ConvTranspose kernel called from several threads at once (its products go
    to a per-thread scratch buffer): every call gives its own input's result."""
    x_shape, w_shape, attrs, opset = TRANSPOSE_CASES[case]
    node = oh.make_node("ConvTranspose", ["x", "w"], ["y"], **attrs)
    w = _random(*w_shape)
    inputs = [_random(*x_shape) for _ in range(4)]
    want = [run_reference(node, [x, w], opset)[0] for x in inputs]
    run = find_kernel("", "ConvTranspose", opset).factory(make_spec(ir.from_proto(node), opset))
    check_from_threads(
        lambda index: [run(inputs[index], w)[0] for _ in range(20)], want, RTOL, ATOL
    )
