"""Normalization kernels: batch, layer, instance and group norms, LRN, MVN, Lp, softmax family.

Statistics (means, variances) of half-precision inputs are accumulated in float32 and the
results cast back, so every output keeps the input's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel


def _accumulator(dtype: np.dtype) -> np.dtype:
    """The dtype statistics of ``dtype`` data are computed in: at least float32."""
    return np.promote_types(dtype, np.float32)


def _stash_dtype(spec: NodeSpec) -> np.dtype:
    """The precision the ``stash_type`` attribute asks for (float32 by default)."""
    return np.dtype(ir.DataType(spec.attr("stash_type", 1)).numpy())


def _positive_axis(axis: int, ndim: int, what: str) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"{what}: axis {axis} is out of range for a rank-{ndim} input")
    return axis + ndim if axis < 0 else axis


def _center_rows(x: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Statistics of each row of ``x`` (its last axis) for standardization.

    Returns ``x`` minus the row means (a fresh array), the means, and the inverse standard
    deviations ``1 / sqrt(var + epsilon)`` (both with a trailing axis of size 1); the
    caller multiplies, possibly by a scale folded into the inverse deviations.
    """
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    variance = np.einsum("...i,...i->...", centered, centered)[..., None]
    variance /= max(x.shape[-1], 1)
    return centered, mean, 1.0 / np.sqrt(variance + epsilon)


# --- BatchNormalization -------------------------------------------------------------------


@kernel("BatchNormalization")
def batch_normalization(spec: NodeSpec) -> Kernel:
    """BatchNormalization 1-15.

    Training mode is chosen by ``training_mode`` from opset 14, by the number of outputs in
    opsets 7-13 (the spec's output cases), and by ``is_test == 0`` with more than one
    output before 7: a single-output node has nowhere to put updated statistics and is
    run as inference, which is what models exported for inference expect.
    ``spatial=0`` (before opset 9) takes per-activation parameters shaped like ``X[0]``.
    """
    epsilon = float(spec.attr("epsilon", 1e-5))
    momentum = float(spec.attr("momentum", 0.9))
    per_activation = spec.opset < 9 and spec.attr("spatial", 1) == 0
    if spec.opset >= 14:
        training = bool(spec.attr("training_mode", 0))
    elif spec.opset >= 7:
        training = spec.num_outputs > 1
    else:
        training = spec.attr("is_test", 0) == 0 and spec.num_outputs > 1

    def param_shape(x: np.ndarray) -> tuple[int, ...]:
        if x.ndim < 2:
            raise ValueError(f"BatchNormalization: X must have rank >= 2, got shape {x.shape}")
        if per_activation:
            return x.shape[1:]
        return (x.shape[1],) + (1,) * (x.ndim - 2)

    if training:
        return _batch_norm_training(spec, epsilon, momentum, per_activation, param_shape)

    params = [spec.const(i) for i in range(1, 5)]
    if all(p is not None for p in params):
        # Fold the four constant parameters into one multiply and one add, in float64.
        scale, bias, mean, var = (np.asarray(p, dtype=np.float64) for p in params)
        mul64 = scale / np.sqrt(var + epsilon)
        add64 = bias - mean * mul64
        folded: dict[np.dtype, tuple[np.ndarray, np.ndarray]] = {}
        x_dtype = spec.input_dtypes[0] if spec.input_dtypes else None
        if x_dtype is not None:
            folded[x_dtype] = (mul64.astype(x_dtype), add64.astype(x_dtype))

        def run_folded(x: np.ndarray, *_: np.ndarray | None) -> tuple[np.ndarray]:
            if x.dtype not in folded:
                folded[x.dtype] = (mul64.astype(x.dtype), add64.astype(x.dtype))
            mul, add = folded[x.dtype]
            shape = param_shape(x)
            y = x * mul.reshape(shape)
            y += add.reshape(shape)
            return (y,)

        return run_folded

    def run(
        x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray
    ) -> tuple[np.ndarray]:
        shape = param_shape(x)
        mul = scale.reshape(shape) / np.sqrt(var.reshape(shape) + epsilon)
        add = bias.reshape(shape) - mean.reshape(shape) * mul
        y = x * mul.astype(x.dtype, copy=False)
        y += add.astype(x.dtype, copy=False)
        return (y,)

    return run


def _batch_norm_training(
    spec: NodeSpec,
    epsilon: float,
    momentum: float,
    per_activation: bool,
    param_shape: Callable[[np.ndarray], tuple[int, ...]],
) -> Kernel:
    """Normalize with the batch statistics and update the running ones.

    Opsets 14+ return ``Y, running_mean, running_var``; older ones add the batch
    statistics as ``saved_mean, saved_var``.
    """
    num_outputs = spec.num_outputs
    with_saved = spec.opset < 14

    def run(
        x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray
    ) -> tuple[np.ndarray, ...]:
        shape = param_shape(x)
        axes = (0,) if per_activation else (0, *range(2, x.ndim))
        acc = _accumulator(x.dtype)
        batch_mean = x.mean(axis=axes, dtype=acc)
        batch_var = x.var(axis=axes, dtype=acc)
        mul = scale.reshape(shape) / np.sqrt(batch_var.reshape(shape) + epsilon)
        add = bias.reshape(shape) - batch_mean.reshape(shape) * mul
        y = x * mul.astype(x.dtype, copy=False)
        y += add.astype(x.dtype, copy=False)
        running_mean = mean * momentum + batch_mean.reshape(mean.shape) * (1.0 - momentum)
        running_var = var * momentum + batch_var.reshape(var.shape) * (1.0 - momentum)
        outputs = [y, running_mean.astype(mean.dtype), running_var.astype(var.dtype)]
        if with_saved:
            outputs.append(batch_mean.reshape(mean.shape).astype(mean.dtype))
            outputs.append(batch_var.reshape(var.shape).astype(var.dtype))
        return tuple(outputs[:num_outputs])

    return run


# --- Layer, instance and group normalization ----------------------------------------------


@kernel("LayerNormalization", since=17)
def layer_normalization(spec: NodeSpec) -> Kernel:
    """LayerNormalization 17: standardize over ``[axis, rank)`` then scale and shift.

    The statistics are computed in at least the ``stash_type`` precision; ``Mean`` and
    ``InvStdDev`` take the dtype the graph declares for them, else the stash type (as ONNX
    type inference does).
    """
    axis = int(spec.attr("axis", -1))
    epsilon = float(spec.attr("epsilon", 1e-5))
    stash = _stash_dtype(spec)
    declared = tuple(spec.output_dtypes) + (None,) * 3
    mean_dtype = declared[1] if declared[1] is not None else stash
    inv_std_dtype = declared[2] if declared[2] is not None else stash

    def run(
        x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None
    ) -> tuple[np.ndarray, ...]:
        start = _positive_axis(axis, x.ndim, "LayerNormalization")
        rows = math.prod(x.shape[:start])
        calc = np.promote_types(x.dtype, stash)
        flat = x.reshape(rows, math.prod(x.shape[start:])).astype(calc, copy=False)
        normalized, mean, inv_std = _center_rows(flat, epsilon)
        normalized *= inv_std
        y = normalized.astype(x.dtype, copy=False).reshape(x.shape)
        np.multiply(y, scale, out=y)
        if bias is not None:
            y += bias
        reduced = x.shape[:start] + (1,) * (x.ndim - start)
        return (
            y,
            mean.reshape(reduced).astype(mean_dtype, copy=False),
            inv_std.reshape(reduced).astype(inv_std_dtype, copy=False),
        )

    return run


@kernel("RMSNormalization", since=23)
def rms_normalization(spec: NodeSpec) -> Kernel:
    """RMSNormalization 23: ``x / sqrt(mean(x², [axis, rank)) + epsilon) * scale``, the
    statistics in the ``stash_type`` precision."""
    axis = int(spec.attr("axis", -1))
    epsilon = float(spec.attr("epsilon", 1e-5))
    stash = _stash_dtype(spec)

    def run(x: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray]:
        start = _positive_axis(axis, x.ndim, "RMSNormalization")
        wide = x.astype(stash, copy=False)
        axes = tuple(range(start, x.ndim))
        mean_square = np.mean(np.square(wide), axis=axes, keepdims=True)
        normalized = (wide / np.sqrt(mean_square + stash.type(epsilon))).astype(x.dtype)
        return ((normalized * scale).astype(x.dtype, copy=False),)

    return run


def _per_channel(param: np.ndarray, channels: int) -> np.ndarray:
    return param.reshape(1, channels, 1)


@kernel("InstanceNormalization")
def instance_normalization(spec: NodeSpec) -> Kernel:
    """InstanceNormalization 1-22: per sample and channel over the spatial axes."""
    epsilon = float(spec.attr("epsilon", 1e-5))

    def run(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray]:
        if x.ndim < 2:
            raise ValueError(f"InstanceNormalization: input must have rank >= 2, got {x.shape}")
        n, c = x.shape[:2]
        flat = x.reshape(n, c, math.prod(x.shape[2:]))
        flat = flat.astype(_accumulator(x.dtype), copy=False)
        normalized, _, inv_std = _center_rows(flat, epsilon)
        normalized *= inv_std * _per_channel(scale, c)
        normalized += _per_channel(bias, c)
        return (normalized.astype(x.dtype, copy=False).reshape(x.shape),)

    return run


@kernel("GroupNormalization", since=18)
def group_normalization(spec: NodeSpec) -> Kernel:
    """GroupNormalization 18 (scale and bias per group) and 21 (per channel, stash_type)."""
    groups = int(spec.attr("num_groups"))
    epsilon = float(spec.attr("epsilon", 1e-5))
    stash = _stash_dtype(spec) if spec.opset >= 21 else np.dtype(np.float32)
    per_group = spec.opset < 21

    def run(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray]:
        if x.ndim < 2:
            raise ValueError(f"GroupNormalization: input must have rank >= 2, got {x.shape}")
        n, c = x.shape[:2]
        if groups <= 0 or c % groups:
            raise ValueError(
                f"GroupNormalization: {c} channels cannot be split into {groups} groups"
            )
        calc = np.promote_types(x.dtype, stash)
        grouped = x.reshape(n, groups, x.size // max(n * groups, 1)).astype(calc, copy=False)
        normalized, _, inv_std = _center_rows(grouped, epsilon)
        normalized *= inv_std
        y = normalized.astype(x.dtype, copy=False)
        if not per_group:
            y = y.reshape(n, c, math.prod(x.shape[2:]))
        width = groups if per_group else c
        y *= _per_channel(scale, width).astype(x.dtype, copy=False)
        y += _per_channel(bias, width).astype(x.dtype, copy=False)
        return (y.reshape(x.shape),)

    return run


# --- LRN, MeanVarianceNormalization, LpNormalization --------------------------------------


@kernel("LRN")
def lrn(spec: NodeSpec) -> Kernel:
    """LRN 1-13: ``x / (bias + alpha / size * sum of squares over a channel window) ** beta``."""
    size = int(spec.attr("size"))
    alpha = float(spec.attr("alpha", 1e-4))
    beta = float(spec.attr("beta", 0.75))
    bias = float(spec.attr("bias", 1.0))
    if size < 1:
        raise ValueError(f"LRN: size must be positive, got {size}")
    before = (size - 1) // 2

    def run(x: np.ndarray) -> tuple[np.ndarray]:
        if x.ndim < 2:
            raise ValueError(f"LRN: input must have rank >= 2, got shape {x.shape}")
        c = x.shape[1]
        padded = np.zeros((x.shape[0], c + size - 1, *x.shape[2:]), dtype=x.dtype)
        np.square(x, out=padded[:, before : before + c])
        window_sum = padded[:, :c].copy()
        for offset in range(1, size):
            window_sum += padded[:, offset : offset + c]
        window_sum *= alpha / size
        window_sum += bias
        if beta == 0.75:
            # The common AlexNet/GoogLeNet exponent: two square roots are ~5x faster than pow.
            root = np.sqrt(window_sum)
            np.sqrt(root, out=window_sum)
            window_sum *= root
        else:
            np.power(window_sum, beta, out=window_sum)
        np.divide(x, window_sum, out=window_sum)
        return (window_sum,)

    return run


@kernel("MeanVarianceNormalization", since=9)
def mean_variance_normalization(spec: NodeSpec) -> Kernel:
    """MeanVarianceNormalization 9-13: ``(X - E[X]) / (sqrt(Var[X]) + 1e-9)`` over ``axes``."""
    axes = tuple(spec.attr("axes", [0, 2, 3]))

    def run(x: np.ndarray) -> tuple[np.ndarray]:
        acc = _accumulator(x.dtype)
        mean = x.mean(axis=axes, keepdims=True, dtype=acc)
        centered = x - mean
        std = np.sqrt(np.mean(np.square(centered), axis=axes, keepdims=True))
        std += 1e-9
        centered /= std
        return (centered.astype(x.dtype, copy=False),)

    return run


@kernel("LpNormalization")
def lp_normalization(spec: NodeSpec) -> Kernel:
    """LpNormalization 1-22: divide by the L1 or L2 norm along ``axis``; zero norms give 0."""
    axis = int(spec.attr("axis", -1))
    p = int(spec.attr("p", 2))
    if p not in (1, 2):
        raise ValueError(f"LpNormalization: p must be 1 or 2, got {p}")

    def run(x: np.ndarray) -> tuple[np.ndarray]:
        if p == 1:
            norm = np.abs(x).sum(axis=axis, keepdims=True)
        else:
            norm = np.sqrt(np.square(x).sum(axis=axis, keepdims=True))
        # An infinite divisor turns the all-zero slices into zeros without a 0/0 warning.
        norm[norm == 0] = np.inf
        return (x / norm,)

    return run


# --- Softmax, LogSoftmax, Hardmax ---------------------------------------------------------


_BLAS_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def row_sums(x: np.ndarray) -> np.ndarray:
    """Sums over the last axis, keeping it (size 1). For float32/float64 a product with
    a vector of ones (BLAS): 4x faster than ``np.add.reduce`` on rows of 128 (attention
    scores), which numpy sums row by row."""
    if x.dtype in _BLAS_FLOATS and x.shape[-1] > 0:
        return np.matmul(x, np.ones(x.shape[-1], x.dtype))[..., None]
    return np.add.reduce(x, axis=-1, keepdims=True)


def softmax_last_axis(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Softmax over the last axis, into ``out`` when given (it may be ``x``).

    The shift is ``np.fmax.reduce``'s row maximum: 3.5x faster than ``np.max``, whose
    loop checks for NaN, and the same rows of results (a NaN in a row makes the whole
    row NaN either way, through its sum). See :func:`row_sums` for the sums.
    """
    top = np.fmax.reduce(x, axis=-1, keepdims=True)
    y = np.subtract(x, top, out=out)
    np.exp(y, out=y)
    total = row_sums(y)
    np.reciprocal(total, out=total)
    y *= total
    return y


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    if axis in (-1, x.ndim - 1):
        return softmax_last_axis(x)
    y = x - x.max(axis=axis, keepdims=True)
    np.exp(y, out=y)
    y /= y.sum(axis=axis, keepdims=True)
    return y


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    if axis in (-1, x.ndim - 1):  # as softmax_last_axis
        y = x - np.fmax.reduce(x, axis=-1, keepdims=True)
        y -= np.log(row_sums(np.exp(y)))
        return y
    y = x - x.max(axis=axis, keepdims=True)
    y -= np.log(np.exp(y).sum(axis=axis, keepdims=True))
    return y


def _hardmax(x: np.ndarray, axis: int) -> np.ndarray:
    y = np.zeros_like(x)
    np.put_along_axis(y, np.argmax(x, axis=axis, keepdims=True), 1, axis=axis)
    return y


def _along_axis(spec: NodeSpec, fn: Callable[[np.ndarray, int], np.ndarray]) -> Kernel:
    """Apply ``fn`` per slice along ``axis``; before opset 13 along the flattened tail.

    Opsets 1-12 coerce the input to 2-D ``[prod(shape[:axis]), prod(shape[axis:])]``
    (default axis 1) and normalize each row; from 13 on only ``axis`` (default -1) is used.
    """
    if spec.opset >= 13:
        axis = int(spec.attr("axis", -1))

        def run(x: np.ndarray) -> tuple[np.ndarray]:
            if x.size == 0:
                return (x,)
            return (fn(x, axis),)

        return run

    coerce_axis = int(spec.attr("axis", 1))

    def run_coerced(x: np.ndarray) -> tuple[np.ndarray]:
        if x.size == 0:
            return (x,)
        start = _positive_axis(coerce_axis, x.ndim, spec.op_type)
        rows = math.prod(x.shape[:start])
        return (fn(x.reshape(rows, x.size // rows), 1).reshape(x.shape),)

    return run_coerced


@kernel("Softmax")
def softmax(spec: NodeSpec) -> Kernel:
    """Softmax 1-13, numerically stable (the maximum is subtracted first)."""
    return _along_axis(spec, _softmax)


@kernel("LogSoftmax")
def log_softmax(spec: NodeSpec) -> Kernel:
    """LogSoftmax 1-13: ``x - max - log(sum(exp(x - max)))``."""
    return _along_axis(spec, _log_softmax)


@kernel("Hardmax")
def hardmax(spec: NodeSpec) -> Kernel:
    """Hardmax 1-13: one at the first maximum of each slice, zero elsewhere."""
    return _along_axis(spec, _hardmax)
