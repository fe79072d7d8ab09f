"""Quantization kernels against onnx.reference (quantized values exactly; dequantized
float32 values with rtol 1e-6)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx.helper as oh
import pytest
from onnx import TensorProto as TP

from tests.kernels._check import check_node, run_aioinfer, run_reference


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


ZERO_POINTS = {
    "uint8": np.uint8(3),
    "int8": np.int8(-2),
    "uint16": np.uint16(7),
    "int4": np.array(1, ml_dtypes.int4),
    "uint4": np.array(2, ml_dtypes.uint4),
    "int2": np.array(-1, ml_dtypes.int2),
    "float8e4m3fn": np.array(0, ml_dtypes.float8_e4m3fn),
    "float8e5m2": np.array(0, ml_dtypes.float8_e5m2),
    "float4e2m1": np.array(0, ml_dtypes.float4_e2m1fn),
}


@pytest.mark.parametrize("kind", sorted(ZERO_POINTS))
def test_quantize_per_tensor(kind: str) -> None:
    x = np.float32([[-300, -1.26, -0.5, 0], [0.49, 1.5, 2.5, 1e4]])
    node = oh.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])
    inputs = [x, np.float32(0.5), ZERO_POINTS[kind]]
    assert_same(run_aioinfer(node, inputs, 25)[0], run_reference(node, inputs, 25)[0])


@pytest.mark.parametrize("saturate", [0, 1])
def test_quantize_float8_saturation(saturate: int) -> None:
    x = np.float32([1e6, -1e6, 3.0, np.nan])
    node = oh.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], saturate=saturate)
    inputs = [x, np.float32(1), ZERO_POINTS["float8e4m3fn"]]
    assert_same(run_aioinfer(node, inputs, 21)[0], run_reference(node, inputs, 21)[0])


def test_quantize_per_axis_and_blocked() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32) * 10
    per_axis = oh.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=1)
    inputs = [x, np.float32([0.1, 0.2, 0.3, 0.4]), np.int8([0, 1, -1, 2])]
    assert_same(run_aioinfer(per_axis, inputs, 21)[0], run_reference(per_axis, inputs, 21)[0])
    blocked = oh.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=2, block_size=2)
    scales = rng.uniform(0.05, 0.5, (3, 4, 3)).astype(np.float32)
    zeros = rng.integers(0, 10, (3, 4, 3)).astype(np.uint8)
    inputs = [x, scales, zeros]
    assert_same(run_aioinfer(blocked, inputs, 21)[0], run_reference(blocked, inputs, 21)[0])


def test_quantize_output_dtype_and_precision() -> None:
    x = np.float32([0.1, 1.7, -2.3])
    node = oh.make_node("QuantizeLinear", ["x", "s"], ["y"], output_dtype=TP.INT16, precision=11)
    inputs = [x, np.float32(0.01)]
    assert_same(run_aioinfer(node, inputs, 25)[0], run_reference(node, inputs, 25)[0])


@pytest.mark.parametrize("kind", ["uint8", "int8", "int4", "uint4", "float8e4m3fn"])
def test_dequantize(kind: str) -> None:
    zero_point = ZERO_POINTS[kind]
    x = np.arange(-4, 4).astype(np.float32).reshape(2, 4)
    if kind.startswith("u"):
        x = x + 4
    q = x.astype(zero_point.dtype)
    node = oh.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1)
    check_node(node, [q, np.float32([0.5, 1, 2, 4]), np.full(4, zero_point)], opset=21)


def test_dequantize_blocked_and_output_dtype() -> None:
    rng = np.random.default_rng(1)
    q = rng.integers(-100, 100, (2, 6)).astype(np.int8)
    node = oh.make_node(
        "DequantizeLinear", ["q", "s", "z"], ["y"], axis=1, block_size=4, output_dtype=TP.FLOAT16
    )
    inputs = [q, np.float32([[0.5, 2], [1, 3]]), np.int8([[1, -1], [0, 2]])]
    check_node(node, inputs, opset=23, rtol=1e-3, atol=1e-3)


def test_dynamic_quantize_linear() -> None:
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    check_node(oh.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"]), [x], opset=11)


def test_qlinear_matmul_and_conv() -> None:
    rng = np.random.default_rng(3)
    a = rng.integers(0, 255, (2, 3, 4)).astype(np.uint8)
    b = rng.integers(-128, 127, (4, 5)).astype(np.int8)
    node = oh.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"])
    check_node(
        node,
        [
            a,
            np.float32(0.02),
            np.uint8(100),
            b,
            np.float32(0.03),
            np.int8(3),
            np.float32(0.5),
            np.uint8(120),
        ],
        opset=21,
    )
    x = rng.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    w = rng.integers(-50, 50, (3, 2, 3, 3)).astype(np.int8)
    conv = oh.make_node(
        "QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "bias"], ["y"], pads=[1] * 4
    )
    check_node(
        conv,
        [
            x,
            np.float32(0.01),
            np.uint8(128),
            w,
            np.float32([0.02, 0.05, 0.01]),
            np.int8([0, 0, 0]),
            np.float32(0.2),
            np.uint8(100),
            np.int32([10, -20, 30]),
        ],
        opset=10,
    )
    integer = oh.make_node("ConvInteger", ["x", "w", "zx"], ["y"], strides=[2, 2])
    check_node(integer, [x, w.astype(np.uint8), np.uint8(128)], opset=10)
