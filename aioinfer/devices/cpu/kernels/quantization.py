"""Quantization kernels: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
QLinearMatMul, QLinearConv and ConvInteger.

Scales and zero points are per tensor (a scalar or one element), per axis (1-D along
``axis``) or blocked (the input's shape with ``axis`` divided into blocks of
``block_size``). Quantized types include int4/uint4/int2/uint2 and the float8, float6
and float4 types of ml_dtypes. Integer products run exactly in float64 BLAS (int8 and
int16 operands cannot lose precision there) and are rounded back.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import onnx

from aioinfer.devices.cpu.kernels.conv import conv
from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel

_FLOAT8 = frozenset(
    {
        onnx.TensorProto.FLOAT8E4M3FN,
        onnx.TensorProto.FLOAT8E4M3FNUZ,
        onnx.TensorProto.FLOAT8E5M2,
        onnx.TensorProto.FLOAT8E5M2FNUZ,
    }
)


def _granular(value: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int) -> np.ndarray:
    """A scale or zero point broadcastable to ``shape``."""
    if value.size == 1:
        return value.reshape(())
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis < len(shape):
        raise ValueError(f"axis {axis} is out of range for an input of shape {shape}")
    if block_size <= 0:
        if value.ndim != 1 or value.size != shape[axis]:
            raise ValueError(
                f"a per-axis scale/zero point must be 1-D of length {shape[axis]} "
                f"(axis {axis} of {shape}), got shape {value.shape}"
            )
        dims = [1] * len(shape)
        dims[axis] = value.size
        return value.reshape(dims)
    blocked = np.repeat(value, block_size, axis=axis).take(range(shape[axis]), axis=axis)
    if blocked.shape != shape:
        raise ValueError(
            f"a blocked scale/zero point of shape {value.shape} with block_size "
            f"{block_size} along axis {axis} does not cover an input of shape {shape}"
        )
    return blocked


def _tensor_type(dtype: np.dtype) -> int:
    return int(onnx.helper.np_dtype_to_tensor_dtype(dtype))


def _quantize(
    values: np.ndarray, zero_point: np.ndarray | None, to: int, saturate: bool
) -> np.ndarray:
    """``values`` (already divided by the scale) plus the zero point, as type ``to``."""
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(to))
    if dtype.kind in "iu" or dtype.name in ("int4", "uint4", "int2", "uint2"):
        info = ml_dtypes.iinfo(dtype)
        rounded = np.rint(values)
        if zero_point is not None:
            rounded = rounded + zero_point.astype(np.float64)
        return np.clip(rounded, info.min, info.max).astype(dtype)
    if zero_point is not None:
        values = values + zero_point.astype(np.float32)
    if to in _FLOAT8 and saturate:
        limits = ml_dtypes.finfo(dtype)
        values = np.clip(values, limits.min, limits.max)
    # float4/float6 have no infinity: ml_dtypes saturates them by itself.
    return values.astype(dtype)


@kernel("QuantizeLinear", since=10)
def _quantize_linear(spec: NodeSpec) -> Kernel:
    axis = int(spec.attr("axis", 1))
    block_size = int(spec.attr("block_size", 0))
    saturate = bool(spec.attr("saturate", 1))
    output_dtype = int(spec.attr("output_dtype", 0))
    precision = int(spec.attr("precision", 0))
    work = None if not precision else np.dtype(onnx.helper.tensor_dtype_to_np_dtype(precision))

    def run(
        x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None = None
    ) -> tuple[np.ndarray]:
        to = output_dtype or onnx.TensorProto.UINT8
        if zero_point is not None:
            to = _tensor_type(zero_point.dtype)
            if output_dtype and output_dtype != to:
                raise ValueError(
                    f"QuantizeLinear: output_dtype {output_dtype} differs from the zero "
                    f"point's type {to}"
                )
        scale = _granular(scale, x.shape, axis, block_size)
        if work is not None:
            values = x.astype(work) / scale.astype(work)
        elif x.dtype.kind == "V" or scale.dtype.kind == "V":  # bfloat16 divides in float32
            values = (x.astype(np.float32) / scale.astype(np.float32)).astype(scale.dtype)
        else:
            values = x / scale
        if zero_point is not None:
            zero_point = _granular(zero_point, x.shape, axis, block_size)
        return (_quantize(values, zero_point, to, saturate),)

    return run


@kernel("DequantizeLinear", since=10)
def _dequantize_linear(spec: NodeSpec) -> Kernel:
    axis = int(spec.attr("axis", 1))
    block_size = int(spec.attr("block_size", 0))
    output_dtype = int(spec.attr("output_dtype", 0))

    def run(
        x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None = None
    ) -> tuple[np.ndarray]:
        out = (
            np.dtype(onnx.helper.tensor_dtype_to_np_dtype(output_dtype))
            if output_dtype
            else scale.dtype
        )
        work = np.float64 if out == np.float64 else np.float32
        values = x.astype(work)
        if zero_point is not None:
            values = values - _granular(zero_point, x.shape, axis, block_size).astype(work)
        values = values * _granular(scale, x.shape, axis, block_size).astype(work)
        return (values.astype(out),)

    return run


@kernel("DynamicQuantizeLinear", since=11)
def _dynamic_quantize_linear(spec: NodeSpec) -> Kernel:
    """uint8 quantization over the range of ``x`` extended to include 0."""

    def run(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        high = np.float32(max(0.0, float(np.max(x))))
        low = np.float32(min(0.0, float(np.min(x))))
        scale = np.float32(1.0 if high == low else high - low) / np.float32(255)
        zero_point = np.rint(np.clip(np.float32(0) - low / scale, 0, 255))
        y = np.clip(np.rint(x / scale) + zero_point, 0, 255).astype(np.uint8)
        return (y, np.array(scale, dtype=x.dtype), np.array(zero_point, dtype=np.uint8))

    return run


def _centered(x: np.ndarray, zero_point: np.ndarray | None) -> np.ndarray:
    """``x - zero_point`` exactly, in float64."""
    values = x.astype(np.float64)
    return values if zero_point is None else values - zero_point.astype(np.float64)


def _requantize(
    acc: np.ndarray, factor: np.ndarray, zero_point: np.ndarray | None, like: np.dtype
) -> np.ndarray:
    """An integer accumulator times ``factor`` (float32, as the scales), rounded and
    saturated to the output type (the zero point's, else ``like``)."""
    scaled = acc.astype(np.float32) * factor
    dtype = zero_point.dtype if zero_point is not None else like
    if zero_point is not None:
        scaled = scaled + zero_point.astype(np.float32)
    info = np.iinfo(dtype)
    return np.clip(np.rint(scaled), info.min, info.max).astype(dtype)


@kernel("QLinearMatMul", since=10)
def _qlinear_matmul(spec: NodeSpec) -> Kernel:
    def run(
        a: np.ndarray,
        a_scale: np.ndarray,
        a_zero_point: np.ndarray | None,
        b: np.ndarray,
        b_scale: np.ndarray,
        b_zero_point: np.ndarray | None,
        y_scale: np.ndarray,
        y_zero_point: np.ndarray | None,
    ) -> tuple[np.ndarray]:
        acc = np.rint(np.matmul(_centered(a, a_zero_point), _centered(b, b_zero_point)))
        factor = a_scale * b_scale / y_scale
        return (_requantize(acc, factor, y_zero_point, a.dtype),)

    return run


def _float_conv(spec: NodeSpec) -> Kernel:
    """The Conv kernel with ``spec``'s convolution attributes (operands given in float)."""
    names = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
    conv_spec = dataclasses.replace(
        spec,
        op_type="Conv",
        attrs={k: v for k, v in spec.attrs.items() if k in names},
        num_inputs=2,
        const_inputs=(),
    )
    return conv(conv_spec)


def _weight_zero_point(zero_point: np.ndarray | None, w: np.ndarray) -> np.ndarray | None:
    """A per-output-channel weight zero point shaped to broadcast over W."""
    if zero_point is None or zero_point.size == 1:
        return zero_point
    return zero_point.reshape((-1,) + (1,) * (w.ndim - 1))


@kernel("ConvInteger", since=10)
def _conv_integer(spec: NodeSpec) -> Kernel:
    convolve = _float_conv(spec)

    def run(
        x: np.ndarray,
        w: np.ndarray,
        x_zero_point: np.ndarray | None = None,
        w_zero_point: np.ndarray | None = None,
    ) -> tuple[np.ndarray]:
        wc = _centered(w, _weight_zero_point(w_zero_point, w))
        (y,) = convolve(_centered(x, x_zero_point), wc)
        return (np.rint(y).astype(np.int32),)

    return run


@kernel("QLinearConv", since=10)
def _qlinear_conv(spec: NodeSpec) -> Kernel:
    convolve = _float_conv(spec)

    def run(
        x: np.ndarray,
        x_scale: np.ndarray,
        x_zero_point: np.ndarray | None,
        w: np.ndarray,
        w_scale: np.ndarray,
        w_zero_point: np.ndarray | None,
        y_scale: np.ndarray,
        y_zero_point: np.ndarray | None,
        bias: np.ndarray | None = None,
    ) -> tuple[np.ndarray]:
        wc = _centered(w, _weight_zero_point(w_zero_point, w))
        (acc,) = convolve(_centered(x, x_zero_point), wc)
        if bias is not None:
            acc = acc + bias.astype(np.float64).reshape(-1, *(1,) * (acc.ndim - 2))
        factor = x_scale * w_scale / y_scale
        if np.size(factor) > 1:  # per output channel
            factor = factor.reshape(-1, *(1,) * (acc.ndim - 2))
        return (_requantize(np.rint(acc), factor, y_zero_point, x.dtype),)

    return run
