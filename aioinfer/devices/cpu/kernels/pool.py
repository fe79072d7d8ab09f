"""Pooling kernels: MaxPool, AveragePool, LpPool and their global forms.

Windowed pools pad the input once (``-inf`` for max, 0 for sums) and reduce the windows
one spatial axis at a time (max and sum are separable), one vectorised ufunc pass per
kernel tap of that axis over strided views of the padded input. Average pooling divides
by a per-output count map when padding is excluded or ``ceil_mode`` produces partial
windows. MaxPool's Indices output walks the full window view tap by tap instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from aioinfer.devices.cpu.kernels.conv import (
    auto_pad_attr,
    cached_plan,
    explicit_pads,
    pad_spatial,
    per_axis,
    same_pad_split,
    window_view,
)
from aioinfer.devices.cpu.kernels.parallel import (
    MIN_PARALLEL_ELEMENTS,
    intra_op_threads,
    run_parallel,
)
from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel


@dataclass(frozen=True)
class _PoolPlan:
    """The geometry of one pooling call, derived from the input shape."""

    begins: tuple[int, ...]
    pad_ends: tuple[int, ...]
    """End padding including the extra that ``ceil_mode`` windows reach into."""
    out_shape: tuple[int, ...]
    counts: np.ndarray | float
    """Average pooling divisor: taps per window that count (scalar when uniform)."""
    inside: bool = False
    """Every window lies inside the input (no padding to read): the windows are reduced
    on strided views of the input itself, without the padded copy."""


class _PoolGeometry:
    """The window attributes of a pooling node and the per-input-shape plans they give."""

    def __init__(self, spec: NodeSpec, count_include_pad: bool = False) -> None:
        kernel_shape = spec.attr("kernel_shape")
        if not kernel_shape:
            raise ValueError(f"{spec.op_type}: the kernel_shape attribute is required")
        self.kernel_shape = tuple(int(k) for k in kernel_shape)
        rank = len(self.kernel_shape)
        self.rank = rank
        self.strides = per_axis(spec.attr("strides"), rank, 1, "strides")
        self.dilations = per_axis(spec.attr("dilations"), rank, 1, "dilations")
        self.auto_pad = auto_pad_attr(spec)
        self.pads = explicit_pads(spec.attr("pads"), rank)
        self.ceil_mode = bool(spec.attr("ceil_mode", 0))
        self.count_include_pad = count_include_pad
        self.taps = list(np.ndindex(*self.kernel_shape))
        self._plans: dict[tuple[int, ...], _PoolPlan] = {}

    def plan(self, x_shape: tuple[int, ...]) -> _PoolPlan:
        """The padding, output shape and divisor for an input of ``x_shape``."""
        return cached_plan(self._plans, x_shape, lambda: self._make_plan(x_shape))

    def _make_plan(self, x_shape: tuple[int, ...]) -> _PoolPlan:
        if len(x_shape) != self.rank + 2:
            raise ValueError(
                f"input of shape {x_shape} does not fit kernel_shape {list(self.kernel_shape)}"
                f" (expected rank {self.rank + 2})"
            )
        begins, pad_ends, out_shape, counts = [], [], [], []
        inside = True
        for i, size in enumerate(x_shape[2:]):
            k, s, d = self.kernel_shape[i], self.strides[i], self.dilations[i]
            extent = (k - 1) * d + 1
            if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                out = -(-size // s)
                begin, end = same_pad_split(max(0, (out - 1) * s + extent - size), self.auto_pad)
            elif self.auto_pad == "VALID":
                begin, end = 0, 0
                out = (size - extent) // s + 1
            else:
                begin, end = self.pads[0][i], self.pads[1][i]
                span = size + begin + end - extent
                out = (-(-span // s) if self.ceil_mode else span // s) + 1
                if self.ceil_mode and (out - 1) * s >= size + begin:
                    out -= 1  # a window may not start in the end padding
            if out < 1:
                raise ValueError(f"input of shape {x_shape} is smaller than the pooling window")
            begins.append(begin)
            out_shape.append(out)
            inside = inside and begin == 0 and (out - 1) * s + extent <= size
            pad_end = max(end, (out - 1) * s + extent - size - begin)
            if i == self.rank - 1:
                # The last axis is split into stride phases: make it a whole number of them.
                pad_end += -(size + begin + pad_end) % s
            pad_ends.append(pad_end)
            # Window taps that land on counted positions, per output index along the axis.
            where = np.arange(out)[:, None] * s + np.arange(k)[None, :] * d
            low, high = (0, size + begin + end) if self.count_include_pad else (begin, begin + size)
            counts.append(((where >= low) & (where < high)).sum(axis=1))
        divisor: np.ndarray | float = float(len(self.taps))
        if any(np.any(c != k) for c, k in zip(counts, self.kernel_shape, strict=True)):
            divisor = np.ones((), dtype=np.float64)
            for axis_counts in counts:
                divisor = np.multiply.outer(divisor, axis_counts)
        return _PoolPlan(tuple(begins), tuple(pad_ends), tuple(out_shape), divisor, inside)

    def windows(self, x: np.ndarray, plan: _PoolPlan, fill: float | int) -> np.ndarray:
        """The ``(N, C, *kernel, *out)`` window view of ``x`` padded with ``fill``."""
        padded = pad_spatial(x, plan.begins, plan.pad_ends, fill)
        return window_view(padded, self.kernel_shape, plan.out_shape, self.strides, self.dilations)

    def reduce(self, x: np.ndarray, plan: _PoolPlan, fill: float | int, op: np.ufunc) -> np.ndarray:
        """Pad ``x`` with ``fill`` and reduce every window with ``op`` into a new array.

        Max and sum are separable, so the windows are reduced one axis at a time: k
        passes per axis instead of prod(k) passes in all. Every pass reads a slice whose
        innermost axis is contiguous (numpy's fast loops): the last axis, where a stride
        would break that, is first regrouped into its stride phases.

        When every window lies inside ``x`` (:attr:`_PoolPlan.inside`), the passes read
        strided views of ``x`` itself, the first axis first (it shrinks the data the
        strided passes of the last axis read): no padded copy, no regrouping copy.
        SqueezeNet's 3x3 stride-2 pools on 64x111x111, 128x55x55 and 256x27x27 took
        0.33, 0.18 and 0.10 ms instead of 0.42, 0.25 and 0.16 (one thread).
        """
        if plan.inside:
            return self._reduce_inside(x, plan, op)
        y = pad_spatial(x, plan.begins, plan.pad_ends, fill)
        for axis in range(self.rank):
            k, s, d = self.kernel_shape[axis], self.strides[axis], self.dilations[axis]
            out = plan.out_shape[axis]
            if axis == self.rank - 1 and s > 1:
                # (..., L) -> (..., s, L / s): tap t of output o is y[..., t % s, o + t // s].
                y = np.ascontiguousarray(np.swapaxes(y.reshape(*y.shape[:-1], -1, s), -1, -2))
                taps: list[tuple[Any, ...]] = [
                    (..., t * d % s, slice(t * d // s, t * d // s + out)) for t in range(k)
                ]
            else:
                lead = (slice(None),) * (2 + axis)
                taps = [(*lead, slice(t * d, t * d + (out - 1) * s + 1, s)) for t in range(k)]
            y = _reduce_taps(y, taps, op)
        return y.copy() if np.may_share_memory(y, x) else y

    def _reduce_inside(self, x: np.ndarray, plan: _PoolPlan, op: np.ufunc) -> np.ndarray:
        """:meth:`reduce` of windows that all lie inside ``x``: the same passes, in the
        same order (so the same sums), over strided views of ``x``."""
        y = x
        for axis in range(self.rank):
            k, s, d = self.kernel_shape[axis], self.strides[axis], self.dilations[axis]
            span = (plan.out_shape[axis] - 1) * s + 1
            lead = (slice(None),) * (2 + axis)
            taps = [(*lead, slice(t * d, t * d + span, s)) for t in range(k)]
            y = _reduce_taps(y, taps, op)
        return y.copy() if np.may_share_memory(y, x) else y


def _reduce_taps(y: np.ndarray, taps: list[tuple[Any, ...]], op: np.ufunc) -> np.ndarray:
    """``op`` over the slices ``taps`` of ``y`` (one pass per tap after the first two; a
    single tap is its slice, a view of ``y``)."""
    if len(taps) == 1:
        return y[taps[0]]
    acc = op(y[taps[0]], y[taps[1]])
    for tap in taps[2:]:
        op(acc, y[tap], out=acc)
    return acc


def _split_by_channels(
    geometry: _PoolGeometry, x: np.ndarray, plan: _PoolPlan, fill: float | int, op: np.ufunc
) -> np.ndarray:
    """:meth:`_PoolGeometry.reduce` of ``x``, blocks of its channels split between the
    intra-op threads (each block padded and reduced on its own) when the windows' passes
    are worth it; else on the calling thread. ResNet's 3x3 stride-2 max pool over
    64x112x112 is most of a millisecond of one thread."""
    n, c = x.shape[:2]
    work = x.size * len(geometry.taps)
    if c < 2 or intra_op_threads() < 2 or work < MIN_PARALLEL_ELEMENTS:
        return geometry.reduce(x, plan, fill, op)
    y = np.empty((n, c, *plan.out_shape), x.dtype)

    def part(first: int, last: int) -> None:
        y[:, first:last] = geometry.reduce(x[:, first:last], plan, fill, op)

    run_parallel(part, c, work=work, least=MIN_PARALLEL_ELEMENTS)
    return y


def _float_work(x: np.ndarray) -> np.ndarray:
    """``x`` for summing pools: float16 is summed in float32."""
    return x.astype(np.float32) if x.dtype == np.float16 else x


def _lowest(dtype: np.dtype) -> float | int:
    return -np.inf if dtype.kind == "f" else int(np.iinfo(dtype).min)


def _max_indices(
    geometry: _PoolGeometry,
    windows: np.ndarray,
    plan: _PoolPlan,
    x_shape: tuple[int, ...],
    storage_order: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Max values and their flat input indices (first maximum in row-major tap order)."""
    head = (slice(None), slice(None))
    best = windows[(*head, *geometry.taps[0])].copy()
    which = np.zeros(best.shape, dtype=np.int64)
    for number, tap in enumerate(geometry.taps[1:], start=1):
        values = windows[(*head, *tap)]
        better = values > best
        np.copyto(best, values, where=better)
        np.copyto(which, number, where=better)
    spatial = x_shape[2:]
    # Element strides of the spatial axes: row-major, or column-major for storage_order 1.
    order = range(geometry.rank) if storage_order == 0 else range(geometry.rank - 1, -1, -1)
    steps = [0] * geometry.rank
    step = 1
    for axis in reversed(list(order)):
        steps[axis] = step
        step *= spatial[axis]
    plane = int(np.prod(spatial))
    n, c = x_shape[:2]
    index = (np.arange(n * c, dtype=np.int64) * plane).reshape(n, c, *([1] * geometry.rank))
    tap_of_axis = np.unravel_index(which, geometry.kernel_shape)
    for axis in range(geometry.rank):
        grid_shape = [1] * geometry.rank
        grid_shape[axis] = plan.out_shape[axis]
        start = (
            np.arange(plan.out_shape[axis], dtype=np.int64) * geometry.strides[axis]
            - plan.begins[axis]
        ).reshape(grid_shape)
        coordinate = start + tap_of_axis[axis] * geometry.dilations[axis]
        index = index + coordinate * steps[axis]
    return best, index


@kernel("MaxPool", since=1)
def max_pool(spec: NodeSpec) -> Kernel:
    """MaxPool-1/8/10/11/12/22, with the optional int64 Indices output (from 8)."""
    geometry = _PoolGeometry(spec)
    storage_order = int(spec.attr("storage_order", 0))
    want_indices = spec.num_outputs > 1

    def run(x: np.ndarray) -> tuple[np.ndarray, ...]:
        plan = geometry.plan(x.shape)
        if want_indices:
            windows = geometry.windows(x, plan, _lowest(x.dtype))
            return _max_indices(geometry, windows, plan, x.shape, storage_order)
        # fmax skips NaN like the definition's comparisons; integers have no NaN.
        op = np.fmax if x.dtype.kind == "f" else np.maximum
        return (_split_by_channels(geometry, x, plan, _lowest(x.dtype), op),)

    return run


@kernel("AveragePool", since=1)
def average_pool(spec: NodeSpec) -> Kernel:
    """AveragePool-1/7/10/11/19/22 (count_include_pad from 7, ceil_mode 10, dilations 19)."""
    geometry = _PoolGeometry(spec, count_include_pad=bool(spec.attr("count_include_pad", 0)))

    def run(x: np.ndarray) -> tuple[np.ndarray]:
        plan = geometry.plan(x.shape)
        total = geometry.reduce(_float_work(x), plan, 0, np.add)
        total /= plan.counts
        return (total.astype(x.dtype, copy=False),)

    return run


def _p_attr(spec: NodeSpec) -> float:
    """The ``p`` attribute: a float in version 1, an int from version 2."""
    p = spec.attr("p", 2)
    if p <= 0:
        raise ValueError(f"{spec.op_type}: p must be positive, got {p}")
    return float(p)


def _power_sum_root(p: float) -> tuple[Callable[[np.ndarray], np.ndarray], Callable]:
    """The ``|x| ** p`` and ``s ** (1 / p)`` halves of an Lp norm, exact for p = 1 and 2."""
    if p == 1.0:
        return np.abs, lambda s: s
    if p == 2.0:
        return np.square, np.sqrt
    return (lambda x: np.abs(x) ** x.dtype.type(p)), (lambda s: s ** s.dtype.type(1.0 / p))


@kernel("LpPool", since=1)
def lp_pool(spec: NodeSpec) -> Kernel:
    """LpPool-1/2/11/18/22: ``(sum |x| ** p) ** (1 / p)`` over each window; padding adds 0."""
    geometry = _PoolGeometry(spec)
    power, root = _power_sum_root(_p_attr(spec))

    def run(x: np.ndarray) -> tuple[np.ndarray]:
        plan = geometry.plan(x.shape)
        total = geometry.reduce(power(_float_work(x)), plan, 0, np.add)
        return (root(total).astype(x.dtype, copy=False),)

    return run


def _spatial_axes(x: np.ndarray) -> tuple[int, ...]:
    return tuple(range(2, x.ndim))


SUM_BY_PRODUCT = 4096
"""Maps up to this many pixels are summed by a matrix-vector product with ones (BLAS),
larger ones by numpy's pairwise sum, whose rounding error grows with the logarithm of
the count rather than the count. The product is 4-5 times as fast on squeeze-and-excite
blocks' maps: 6x200x192 in 9 instead of 45 us, 1x512x49 in 2 instead of 11 us."""


@kernel("GlobalAveragePool", since=1)
def global_average_pool(spec: NodeSpec) -> Kernel:
    """GlobalAveragePool-1/22: mean over all spatial axes, kept as size-1 dims."""

    ones: dict[tuple[int, np.dtype], np.ndarray] = {}
    """Vectors of ones by length and dtype (a few per model)."""

    def run(x: np.ndarray) -> tuple[np.ndarray]:
        if x.dtype.kind == "f" and x.dtype.itemsize >= 4 and x.ndim > 2:
            # A sum in x's dtype, then a division (what np.mean computes), without
            # np.mean's Python wrapper.
            n, c = x.shape[:2]
            size = math.prod(x.shape[2:])
            if 0 < size <= SUM_BY_PRODUCT:
                dtype = x.dtype
                vector = cached_plan(ones, (size, dtype), lambda: np.ones(size, dtype))
                total = np.matmul(x.reshape(n * c, size), vector)
            else:
                total = np.add.reduce(x.reshape(n, c, -1), axis=2)
            np.divide(total, size, out=total)
            return (total.reshape(n, c, *(1,) * (x.ndim - 2)),)
        return (np.mean(x, axis=_spatial_axes(x), keepdims=True).astype(x.dtype, copy=False),)

    return run


@kernel("GlobalMaxPool", since=1)
def global_max_pool(spec: NodeSpec) -> Kernel:
    """GlobalMaxPool-1/22: max over all spatial axes, kept as size-1 dims."""

    def run(x: np.ndarray) -> tuple[np.ndarray]:
        return (np.max(x, axis=_spatial_axes(x), keepdims=True),)

    return run


@kernel("GlobalLpPool", since=1)
def global_lp_pool(spec: NodeSpec) -> Kernel:
    """GlobalLpPool-1/2/22: ``(sum |x| ** p) ** (1 / p)`` over all spatial axes."""
    power, root = _power_sum_root(_p_attr(spec))

    def run(x: np.ndarray) -> tuple[np.ndarray]:
        total = np.sum(power(_float_work(x)), axis=_spatial_axes(x), keepdims=True)
        return (root(total).astype(x.dtype, copy=False),)

    return run
