"""Reduction kernels: the Reduce* family, ArgMax/ArgMin, CumSum and TopK.

The Reduce* operators take ``axes`` as an attribute until ReduceSum 13 and the others 18,
then as an optional input together with ``noop_with_empty_axes``. Missing or empty axes
reduce everything, unless ``noop_with_empty_axes`` is set: then the reduction runs over no
axis, which leaves the data as is apart from the operator's elementwise part (ReduceL1
gives ``|x|``, ReduceSumSquare ``x*x``), as the onnx reference does. Results keep the
input's dtype, integers included (ReduceMean of int32 is the truncated int32 mean).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from aioinfer.devices.cpu.kernels.registry import Kernel, KernelFactory, NodeSpec, kernel

Axes = tuple[int, ...] | None
"""Axes to reduce, as numpy takes them: None for all, ``()`` for none."""

Reducer = Callable[[np.ndarray, Axes, bool], np.ndarray]


def _lowest(dtype: np.dtype) -> bool | int | float:
    """The identity of max: the smallest value of ``dtype`` (``-inf`` for floats)."""
    if dtype == np.bool_:
        return False
    if np.issubdtype(dtype, np.integer):
        return int(np.iinfo(dtype).min)
    return -np.inf


def _highest(dtype: np.dtype) -> bool | int | float:
    """The identity of min: the largest value of ``dtype`` (``+inf`` for floats)."""
    if dtype == np.bool_:
        return True
    if np.issubdtype(dtype, np.integer):
        return int(np.iinfo(dtype).max)
    return np.inf


def _as_float(x: np.ndarray) -> np.ndarray:
    return x if np.issubdtype(x.dtype, np.inexact) else x.astype(np.float64)


# The ufuncs' own reduce, not np.sum/np.max: the same computation without their Python
# wrappers (1-2 us a call, most of the time on the small tensors of exported models).
_add_reduce: Callable[..., Any] = np.add.reduce
_maximum_reduce: Callable[..., Any] = np.maximum.reduce
_minimum_reduce: Callable[..., Any] = np.minimum.reduce


def _reduce_sum(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    return _add_reduce(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _reduce_mean(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    count = x.size if axes is None else math.prod(x.shape[a] for a in axes)
    is_float = np.issubdtype(x.dtype, np.inexact)
    if count == 0:
        shape = np.sum(x, axis=axes, keepdims=keepdims).shape
        return np.full(shape, np.nan if is_float else 0, dtype=x.dtype)
    # Like np.mean: half floats accumulate in float32, integers in their own dtype.
    acc = np.promote_types(x.dtype, np.float32) if is_float else x.dtype
    total = _add_reduce(x, axis=axes, keepdims=keepdims, dtype=acc)
    mean = total / count  # the operator: np.true_divide with a Python int is slower
    return mean if mean.dtype == x.dtype else mean.astype(x.dtype, copy=False)


def _reduce_max(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    return _maximum_reduce(x, axis=axes, keepdims=keepdims, initial=_lowest(x.dtype))


def _reduce_min(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    return _minimum_reduce(x, axis=axes, keepdims=keepdims, initial=_highest(x.dtype))


def _reduce_prod(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    return np.prod(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _reduce_l1(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    return np.sum(np.abs(x), axis=axes, keepdims=keepdims, dtype=x.dtype)


def _reduce_l2(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    total = np.sum(np.square(x), axis=axes, keepdims=keepdims, dtype=x.dtype)
    return np.sqrt(total).astype(x.dtype, copy=False)


def _reduce_sum_square(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    return np.sum(np.square(x), axis=axes, keepdims=keepdims, dtype=x.dtype)


def _reduce_log_sum(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    total = np.sum(_as_float(x), axis=axes, keepdims=keepdims)
    with np.errstate(divide="ignore"):
        return np.log(total).astype(x.dtype, copy=False)


def _reduce_log_sum_exp(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    data = _as_float(x)
    shift = np.max(data, axis=axes, keepdims=True, initial=-np.inf)
    # Infinite maxima (all -inf, or a +inf) would make x - shift NaN; they need no shift.
    shift[~np.isfinite(shift)] = 0
    total = np.sum(np.exp(data - shift), axis=axes, keepdims=keepdims)
    with np.errstate(divide="ignore"):
        result = np.log(total)
    result += shift if keepdims else shift.reshape(np.shape(result))
    return result.astype(x.dtype, copy=False)


def _axes_tuple(values: np.ndarray | list[int]) -> tuple[int, ...]:
    return tuple(int(a) for a in np.asarray(values, dtype=np.int64).reshape(-1))


def _reduce(spec: NodeSpec, reducer: Reducer, axes_input_since: int) -> Kernel:
    """The kernel of one Reduce* operator: resolve the axes, then apply ``reducer``."""
    keepdims = bool(spec.attr("keepdims", 1))
    if spec.opset < axes_input_since:
        # An absent or empty ``axes`` attribute reduces over all axes.
        fixed: Axes = _axes_tuple(spec.attr("axes", [])) or None

        def run_attr(x: np.ndarray) -> tuple[np.ndarray]:
            return (np.asarray(reducer(x, fixed, keepdims)),)

        return run_attr

    empty: Axes = () if spec.attr("noop_with_empty_axes", 0) else None
    const_axes = spec.const(1)
    if spec.num_inputs < 2 or const_axes is not None:
        axes = _axes_tuple(const_axes) if const_axes is not None else ()
        resolved: Axes = axes or empty

        def run_fixed(x: np.ndarray, _axes: np.ndarray | None = None) -> tuple[np.ndarray]:
            return (np.asarray(reducer(x, resolved, keepdims)),)

        return run_fixed

    def run(x: np.ndarray, axes: np.ndarray | None = None) -> tuple[np.ndarray]:
        given = _axes_tuple(axes) if axes is not None else ()
        return (np.asarray(reducer(x, given or empty, keepdims)),)

    return run


# Each Reduce* operator: its reducer, and the opset from which ``axes`` is an input.
# Empty reductions give the identity (-inf for Max and the logs, +inf for Min); half
# floats accumulate in float32 and integers truncate (Mean).
REDUCTIONS: dict[str, tuple[Reducer, int]] = {
    "ReduceSum": (_reduce_sum, 13),
    "ReduceMean": (_reduce_mean, 18),
    "ReduceMax": (_reduce_max, 18),
    "ReduceMin": (_reduce_min, 18),
    "ReduceProd": (_reduce_prod, 18),
    "ReduceL1": (_reduce_l1, 18),
    "ReduceL2": (_reduce_l2, 18),
    "ReduceSumSquare": (_reduce_sum_square, 18),
    "ReduceLogSum": (_reduce_log_sum, 18),
    "ReduceLogSumExp": (_reduce_log_sum_exp, 18),
}


def _register_reduction(op_type: str, reducer: Reducer, axes_input_since: int) -> None:
    kernel(op_type)(lambda spec: _reduce(spec, reducer, axes_input_since))


for _op_type, (_reducer, _since) in REDUCTIONS.items():
    _register_reduction(_op_type, _reducer, _since)


# --- ArgMax, ArgMin -----------------------------------------------------------------------


def _arg_reduce(spec: NodeSpec, find: Callable[..., np.ndarray]) -> Kernel:
    """ArgMax/ArgMin: int64 indices along ``axis``; ties go to the first index, or the last
    with ``select_last_index`` (opset 12+)."""
    axis = int(spec.attr("axis", 0))
    keepdims = bool(spec.attr("keepdims", 1))
    last = spec.opset >= 12 and bool(spec.attr("select_last_index", 0))

    def run(x: np.ndarray) -> tuple[np.ndarray]:
        if not last:
            return (find(x, axis=axis, keepdims=keepdims).astype(np.int64, copy=False),)
        flipped = find(np.flip(x, axis), axis=axis, keepdims=keepdims)
        return ((x.shape[axis] - 1 - flipped).astype(np.int64, copy=False),)

    return run


@kernel("ArgMax")
def arg_max(spec: NodeSpec) -> Kernel:
    """ArgMax 1-13."""
    return _arg_reduce(spec, np.argmax)


@kernel("ArgMin")
def arg_min(spec: NodeSpec) -> Kernel:
    """ArgMin 1-13."""
    return _arg_reduce(spec, np.argmin)


# --- CumSum -------------------------------------------------------------------------------


def _scalar_int(value: np.ndarray | None, what: str) -> int:
    if value is None:
        raise ValueError(f"{what} is missing")
    value = np.asarray(value)
    if value.size != 1:
        raise ValueError(f"{what} must hold one integer, got shape {value.shape}")
    return int(value.reshape(-1)[0])


def _along(ndim: int, axis: int, index: slice) -> tuple[slice, ...]:
    return (slice(None),) * axis + (index,) + (slice(None),) * (ndim - axis - 1)


def _cumulative(
    op_type: str, accumulate: Callable[..., np.ndarray], identity: int
) -> KernelFactory:
    """The factory of CumSum / CumProd: ``exclusive`` and ``reverse``; the axis is an input."""

    def factory(spec: NodeSpec) -> Kernel:
        exclusive = bool(spec.attr("exclusive", 0))
        reverse = bool(spec.attr("reverse", 0))
        const_axis = spec.const(1)
        what = f"{op_type} axis"
        fixed_axis = _scalar_int(const_axis, what) if const_axis is not None else None

        def run(x: np.ndarray, axis_input: np.ndarray) -> tuple[np.ndarray]:
            axis = fixed_axis if fixed_axis is not None else _scalar_int(axis_input, what)
            if not -x.ndim <= axis < x.ndim:
                raise ValueError(f"{op_type}: axis {axis} is out of range for shape {x.shape}")
            axis %= x.ndim
            data = np.flip(x, axis) if reverse else x
            if exclusive:
                y = np.empty(x.shape, dtype=x.dtype)
                y[_along(x.ndim, axis, slice(0, 1))] = identity
                accumulate(
                    data[_along(x.ndim, axis, slice(0, -1))],
                    axis=axis,
                    dtype=x.dtype,
                    out=y[_along(x.ndim, axis, slice(1, None))],
                )
            else:
                y = accumulate(data, axis=axis, dtype=x.dtype)
            return (np.flip(y, axis) if reverse else y,)

        return run

    return factory


cum_sum = kernel("CumSum", since=11)(_cumulative("CumSum", np.cumsum, 0))
cum_prod = kernel("CumProd", since=26)(_cumulative("CumProd", np.cumprod, 1))


# --- TopK ---------------------------------------------------------------------------------

_PARTITION_MIN_LENGTH = 1024
"""Rows at least this long, with k at most an eighth of them, select by partition first."""


def _sorted_order(x: np.ndarray, largest: bool) -> np.ndarray:
    """Indices that sort ``x`` along its last axis, best first, ties by lower index.

    For the largest first, a stable ascending sort of the reversed rows, read backwards,
    puts equal values in increasing original index (and NaN first, as the reference does).
    """
    if not largest:
        return np.argsort(x, axis=-1, kind="stable")
    n = x.shape[-1]
    return (n - 1) - np.argsort(x[..., ::-1], axis=-1, kind="stable")[..., ::-1]


def _top_k_rows(x: np.ndarray, k: int, largest: bool) -> np.ndarray:
    """Indices of the ``k`` best elements of each row of ``x`` (last axis), in order."""
    n = x.shape[-1]
    nan_free = not np.issubdtype(x.dtype, np.inexact) or not np.isnan(x).any()
    if n < _PARTITION_MIN_LENGTH or 8 * k > n or k == 0 or not nan_free:
        return _sorted_order(x, largest)[..., :k]
    # The k-th best value of each row; take everything better, then the lowest-index ties.
    kth = np.partition(x, n - k if largest else k - 1, axis=-1)
    threshold = kth[..., n - k : n - k + 1] if largest else kth[..., k - 1 : k]
    better = x > threshold if largest else x < threshold
    tied = x == threshold
    missing = k - np.count_nonzero(better, axis=-1, keepdims=True)
    chosen = better | (tied & (np.cumsum(tied, axis=-1) <= missing))
    candidates = np.nonzero(chosen)[-1].reshape(*x.shape[:-1], k)
    order = _sorted_order(np.take_along_axis(x, candidates, axis=-1), largest)
    return np.take_along_axis(candidates, order, axis=-1)


@kernel("TopK")
def top_k(spec: NodeSpec) -> Kernel:
    """TopK 1-24: the k largest (or smallest, opset 11+) along ``axis``, sorted, ties by
    lower index; ``k`` is an attribute before opset 10 and an input after."""
    axis = int(spec.attr("axis", -1))
    largest = spec.opset < 11 or bool(spec.attr("largest", 1))
    if spec.opset < 10:
        fixed_k: int | None = int(spec.attr("k"))
    else:
        const_k = spec.const(1)
        fixed_k = _scalar_int(const_k, "TopK K") if const_k is not None else None

    def run(x: np.ndarray, k_input: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        k = fixed_k if fixed_k is not None else _scalar_int(k_input, "TopK K")
        if not -x.ndim <= axis < x.ndim:
            raise ValueError(f"TopK: axis {axis} is out of range for shape {x.shape}")
        rows = np.moveaxis(x, axis, -1)
        if not 0 <= k <= rows.shape[-1]:
            raise ValueError(f"TopK: k={k} is out of range for axis of size {rows.shape[-1]}")
        indices = _top_k_rows(rows, k, largest)
        values = np.take_along_axis(rows, indices, axis=-1)
        return (
            np.moveaxis(values, -1, axis),
            np.moveaxis(indices.astype(np.int64, copy=False), -1, axis),
        )

    return run
