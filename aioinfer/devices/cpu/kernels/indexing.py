"""Indexing kernels: gathering, scattering, slicing and index-producing operators.

Index inputs follow ONNX's conventions: negative indices count from the end of their
axis; out-of-range indices raise ``IndexError``. Scatter reductions use numpy's
unbuffered ``ufunc.at`` so repeated indices accumulate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel
from aioinfer.devices.cpu.kernels.shape import int_list, normalize_axis

_REDUCTIONS: dict[str, np.ufunc | None] = {
    "none": None,
    "add": np.add,
    "mul": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
}


def _reduction(spec: NodeSpec) -> np.ufunc | None:
    name = spec.attr("reduction", "none")
    if name not in _REDUCTIONS:
        raise ValueError(f"{spec.op_type}: reduction {name!r} is not one of {list(_REDUCTIONS)}")
    return _REDUCTIONS[name]


def _scatter(
    out: np.ndarray, key: tuple, updates: np.ndarray, reduce: np.ufunc | None
) -> np.ndarray:
    if reduce is None:
        out[key] = updates
    else:
        reduce.at(out, key, updates)
    return out


@kernel("Gather")
def _gather(spec: NodeSpec) -> Kernel:
    axis = int(spec.attr("axis", 0))
    const = spec.const(1)
    if const is not None and const.ndim == 0:
        # A constant scalar index (exported models pick one dimension or one state out
        # of a stack): basic indexing, a view, in a sixth of np.take's time. The
        # trailing ``...`` keeps a 0-d result an array.
        index = int(const)

        def run_scalar(data: np.ndarray, _indices: Any = None) -> tuple:
            ax = normalize_axis(axis, data.ndim, "Gather axis")
            key: tuple[Any, ...] = (*(slice(None),) * ax, index, Ellipsis)
            return (data[key],)

        return run_scalar

    def run(data: np.ndarray, indices: np.ndarray) -> tuple:
        ax = normalize_axis(axis, data.ndim, "Gather axis")
        if indices.ndim == 0:
            # A scalar index known at run time only (inside a branch that specialisation
            # inlined, it is a folded constant): basic indexing as above.
            key: tuple[Any, ...] = (*(slice(None),) * ax, int(indices), Ellipsis)
            return (data[key],)
        out = np.take(data, indices, axis=ax)
        # A scalar index into a vector gives a numpy scalar: outputs are arrays.
        return (out if type(out) is np.ndarray else np.asarray(out),)

    return run


def _crop_to(data: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """``data`` cut down to ``shape`` on every axis but ``axis`` (indices may be smaller)."""
    if all(d == s for i, (d, s) in enumerate(zip(data.shape, shape, strict=True)) if i != axis):
        return data
    if any(s > d for i, (d, s) in enumerate(zip(data.shape, shape, strict=True)) if i != axis):
        raise ValueError(f"indices of shape {shape} exceed data of shape {data.shape}")
    return data[tuple(slice(None) if i == axis else slice(0, s) for i, s in enumerate(shape))]


def _check_same_rank(data: np.ndarray, indices: np.ndarray, op: str) -> None:
    if data.ndim != indices.ndim:
        raise ValueError(f"{op}: indices rank {indices.ndim} differs from data rank {data.ndim}")


@kernel("GatherElements", since=11)
def _gather_elements(spec: NodeSpec) -> Kernel:
    axis = int(spec.attr("axis", 0))

    def run(data: np.ndarray, indices: np.ndarray) -> tuple:
        _check_same_rank(data, indices, "GatherElements")
        ax = normalize_axis(axis, data.ndim, "GatherElements axis")
        source = _crop_to(data, indices.shape, ax)
        return (np.take_along_axis(source, indices, axis=ax),)

    return run


@kernel("GatherND", since=11)
def _gather_nd(spec: NodeSpec) -> Kernel:
    b = int(spec.attr("batch_dims", 0))

    def run(data: np.ndarray, indices: np.ndarray) -> tuple:
        k = indices.shape[-1]
        if data.shape[:b] != indices.shape[:b] or k > data.ndim - b:
            raise ValueError(
                f"GatherND: indices {indices.shape} do not fit data {data.shape} "
                f"with batch_dims={b}"
            )
        batch = int(np.prod(data.shape[:b], dtype=np.int64))
        count = int(np.prod(indices.shape[b:-1], dtype=np.int64))
        rest = data.shape[b + k :]
        flat = data.reshape((batch, *data.shape[b:]))
        idx = indices.reshape(batch, count, k)
        if k == 0:
            picked = np.broadcast_to(flat[:, None], (batch, count, *rest))
        else:
            key = (np.arange(batch)[:, None], *(idx[..., i] for i in range(k)))
            picked = flat[key]
        return (picked.reshape(indices.shape[:-1] + rest),)

    return run


@kernel("ScatterND", since=11)
def _scatter_nd(spec: NodeSpec) -> Kernel:
    reduce = _reduction(spec)

    def run(data: np.ndarray, indices: np.ndarray, updates: np.ndarray) -> tuple:
        k = indices.shape[-1]
        want = indices.shape[:-1] + data.shape[k:]
        if k > data.ndim or updates.shape != want:
            raise ValueError(
                f"ScatterND: updates {updates.shape} and indices {indices.shape} do not fit "
                f"data {data.shape} (updates should be {want})"
            )
        idx = indices.reshape(-1, k)
        key = tuple(idx[:, i] for i in range(k))
        flat_updates = updates.reshape((idx.shape[0], *data.shape[k:]))
        return (_scatter(data.copy(), key, flat_updates, reduce),)

    return run


def _scatter_elements_kernel(axis: int, reduce: np.ufunc | None, op: str) -> Kernel:
    def run(data: np.ndarray, indices: np.ndarray, updates: np.ndarray) -> tuple:
        _check_same_rank(data, indices, op)
        if updates.shape != indices.shape:
            raise ValueError(f"{op}: updates {updates.shape} differ from indices {indices.shape}")
        ax = normalize_axis(axis, data.ndim, f"{op} axis")
        key: list[Any] = list(np.indices(indices.shape, sparse=True))
        key[ax] = indices
        return (_scatter(data.copy(), tuple(key), updates, reduce),)

    return run


@kernel("ScatterElements", since=11)
def _scatter_elements(spec: NodeSpec) -> Kernel:
    return _scatter_elements_kernel(int(spec.attr("axis", 0)), _reduction(spec), spec.op_type)


@kernel("Scatter", since=9)
def _scatter_legacy(spec: NodeSpec) -> Kernel:
    return _scatter_elements_kernel(int(spec.attr("axis", 0)), None, spec.op_type)


_KEYS_KEPT = 64
"""Input shapes a Slice with constant operands remembers its numpy index for."""


def _slice_key(
    shape: tuple[int, ...],
    starts: Sequence[int],
    ends: Sequence[int],
    axes: Sequence[int] | None,
    steps: Sequence[int] | None,
) -> tuple[slice, ...]:
    """The numpy index of an ONNX Slice, clamped as the specification says."""
    rank = len(shape)
    count = len(starts)
    axes = range(count) if axes is None else axes
    steps = [1] * count if steps is None else steps
    if not len(ends) == len(axes) == len(steps) == count:
        raise ValueError(
            f"Slice: starts, ends, axes and steps differ in length "
            f"({count}, {len(ends)}, {len(axes)}, {len(steps)})"
        )
    key = [slice(None)] * rank
    seen: set[int] = set()
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        a = normalize_axis(axis, rank, "Slice axis")
        if a in seen:
            raise ValueError(f"Slice: axis {a} is repeated")
        seen.add(a)
        if step == 0:
            raise ValueError("Slice: steps must not be 0")
        dim = shape[a]
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if dim == 0:
            key[a] = slice(0, 0)
        elif step > 0:
            key[a] = slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
        else:
            # Negative steps: start in [0, dim-1]; end in [-1, dim-1], where -1 means
            # "past the first element" and so becomes numpy's open end.
            end = min(max(end, -1), dim - 1)
            key[a] = slice(min(max(start, 0), dim - 1), None if end < 0 else end, step)
    return tuple(key)


@kernel("Slice")
def _slice(spec: NodeSpec) -> Kernel:
    if spec.opset < 10:
        starts, ends, axes = spec.attr("starts"), spec.attr("ends"), spec.attr("axes")
        if starts is None or ends is None:
            raise ValueError("Slice-1 needs the 'starts' and 'ends' attributes")
        fixed: tuple[Any, ...] | None = (
            int_list(starts),
            int_list(ends),
            None if axes is None else int_list(axes),
            None,
        )
    else:
        consts = [spec.const(i) for i in range(1, 5)]
        present = [i < spec.num_inputs for i in range(1, 5)]
        if all(c is not None or not p for c, p in zip(consts, present, strict=True)):
            fixed = tuple(None if c is None else int_list(c) for c in consts)
        else:
            fixed = None
    if fixed is not None:
        operands = fixed
        by_shape: dict[tuple[int, ...], tuple[slice, ...]] = {}  # the key, once per shape

        def run_fixed(data: np.ndarray, *_: Any) -> tuple:
            shape = data.shape
            key = by_shape.get(shape)
            if key is None:
                if len(by_shape) >= _KEYS_KEPT:
                    by_shape.clear()
                key = by_shape[shape] = _slice_key(shape, *operands)
            return (data[key],)

        return run_fixed

    def run(
        data: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        axes: np.ndarray | None = None,
        steps: np.ndarray | None = None,
    ) -> tuple:
        key = _slice_key(
            data.shape,
            int_list(starts),
            int_list(ends),
            None if axes is None else int_list(axes),
            None if steps is None else int_list(steps),
        )
        return (data[key],)

    return run


@kernel("NonZero", since=9)
def _non_zero(spec: NodeSpec) -> Kernel:
    def run(x: np.ndarray) -> tuple:
        if x.ndim == 0:
            return (np.zeros((0, int(np.count_nonzero(x))), dtype=np.int64),)
        return (np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1),)

    return run


@kernel("OneHot", since=9)
def _one_hot(spec: NodeSpec) -> Kernel:
    axis = int(spec.attr("axis", -1))
    columns: dict[tuple[int, int], np.ndarray] = {}

    def run(indices: np.ndarray, depth: np.ndarray, values: np.ndarray) -> tuple:
        d = int(np.asarray(depth).reshape(-1)[0])
        if values.size != 2:
            raise ValueError(f"OneHot: values must hold [off, on], not {values.size} elements")
        off, on = values.reshape(-1)
        idx = indices.astype(np.int64, copy=False)
        idx = np.where(idx < 0, idx + d, idx)
        ax = normalize_axis(axis, indices.ndim + 1, "OneHot axis")
        # The class column, kept per depth and trailing rank (a decoding Loop asks for
        # the same one every step); a reshape instead of np.expand_dims's Python.
        key = (d, indices.ndim - ax)
        classes = columns.get(key)
        if classes is None:
            if len(columns) >= _KEYS_KEPT:
                columns.clear()
            classes = columns[key] = np.arange(d).reshape((d,) + (1,) * (indices.ndim - ax))
        hit = idx.reshape((*idx.shape[:ax], 1, *idx.shape[ax:])) == classes
        return (np.where(hit, on, off).astype(values.dtype, copy=False),)

    return run


@kernel("Compress", since=9)
def _compress(spec: NodeSpec) -> Kernel:
    axis = spec.attr("axis")

    def run(x: np.ndarray, condition: np.ndarray) -> tuple:
        cond = condition.reshape(-1).astype(bool, copy=False)
        if axis is None:
            return (np.compress(cond, x.reshape(-1)),)
        ax = normalize_axis(int(axis), x.ndim, "Compress axis")
        return (np.compress(cond, x, axis=ax),)

    return run


@kernel("ReverseSequence", since=10)
def _reverse_sequence(spec: NodeSpec) -> Kernel:
    batch_axis = int(spec.attr("batch_axis", 1))
    time_axis = int(spec.attr("time_axis", 0))
    if {batch_axis, time_axis} != {0, 1}:
        raise ValueError(
            f"ReverseSequence: batch_axis {batch_axis} and time_axis {time_axis} must be 0 and 1"
        )

    def run(x: np.ndarray, sequence_lens: np.ndarray) -> tuple:
        steps = x.shape[time_axis]
        lens = sequence_lens.astype(np.int64, copy=False).reshape(-1, 1)
        if lens.shape[0] != x.shape[batch_axis]:
            raise ValueError(
                f"ReverseSequence: {lens.shape[0]} sequence lengths for a batch of "
                f"{x.shape[batch_axis]}"
            )
        t = np.arange(steps)[None, :]
        source = np.where(t < lens, lens - 1 - t, t)
        if time_axis == 0:
            source = source.T
        source = source.reshape(source.shape + (1,) * (x.ndim - 2))
        return (np.take_along_axis(x, source, axis=time_axis),)

    return run


@kernel("Unique", since=11)
def _unique(spec: NodeSpec) -> Kernel:
    axis = spec.attr("axis")
    keep_sorted = bool(spec.attr("sorted", 1))

    def run(x: np.ndarray) -> tuple:
        if axis is None:
            data, ax = x.reshape(-1), 0
            y, first, inverse, counts = np.unique(
                data, return_index=True, return_inverse=True, return_counts=True
            )
        else:
            ax = normalize_axis(int(axis), x.ndim, "Unique axis")
            y, first, inverse, counts = np.unique(
                x, return_index=True, return_inverse=True, return_counts=True, axis=ax
            )
        inverse = inverse.reshape(-1)
        if not keep_sorted:
            order = np.argsort(first, kind="stable")
            position = np.empty_like(order)
            position[order] = np.arange(order.size)
            y, first, counts = np.take(y, order, axis=ax), first[order], counts[order]
            inverse = position[inverse]
        return (
            y,
            first.astype(np.int64, copy=False),
            inverse.astype(np.int64, copy=False),
            counts.astype(np.int64, copy=False),
        )

    return run


@kernel("EyeLike", since=9)
def _eye_like(spec: NodeSpec) -> Kernel:
    dtype_attr = spec.attr("dtype")
    dtype = None if dtype_attr is None else np.dtype(ir.DataType(int(dtype_attr)).numpy())
    k = int(spec.attr("k", 0))

    def run(data: np.ndarray) -> tuple:
        if data.ndim != 2:
            raise ValueError(f"EyeLike: input must have rank 2, not {data.ndim}")
        return (
            np.eye(data.shape[0], data.shape[1], k=k, dtype=data.dtype if dtype is None else dtype),
        )

    return run
