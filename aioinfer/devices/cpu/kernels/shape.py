"""Shape-manipulation kernels: reshaping, reordering, joining, splitting and padding.

Operators whose ``shape``/``axes``/``pads`` operand moved from an attribute to an input
across opset versions read the attribute in old versions and the input in new ones; a
constant operand is normalised once in the factory. Resize and Upsample live in
:mod:`.resize`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, cast

import numpy as np

from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel


def int_list(value: Any) -> list[int]:
    """A 1-D integer operand (attribute list or tensor) as a list of Python ints."""
    # tolist() makes the Python numbers in one call (iterating an array makes numpy
    # scalars one by one: three times the time for a shape of four).
    return [int(v) for v in np.asarray(value).reshape(-1).tolist()]


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    """``axis`` in ``[-rank, rank-1]`` as a non-negative axis.

    Raises:
        ValueError: the axis is out of range.
    """
    if not -rank <= axis < rank:
        raise ValueError(f"{what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _resolve_reshape(data_shape: tuple[int, ...], shape: Sequence[int], allowzero: bool) -> tuple:
    if allowzero:
        return tuple(shape)
    out = []
    for i, dim in enumerate(shape):
        if dim == 0:
            if i >= len(data_shape):
                raise ValueError(
                    f"Reshape: shape {list(shape)} copies dimension {i} (0) but the input "
                    f"has rank {len(data_shape)}"
                )
            dim = data_shape[i]
        out.append(dim)
    return tuple(out)


@kernel("Reshape")
def _reshape(spec: NodeSpec) -> Kernel:
    allowzero = bool(spec.attr("allowzero", 0))
    if spec.opset < 5:
        const = spec.attr("shape")
        if const is None:
            raise ValueError("Reshape-1 needs the 'shape' attribute")
    else:
        const = spec.const(1)
    if const is not None:
        shape = int_list(const)
        if allowzero or 0 not in shape:
            fixed = tuple(shape)

            def run_fixed(data: np.ndarray, _shape: Any = None) -> tuple:
                return (data.reshape(fixed),)

            return run_fixed

        def run_copying(data: np.ndarray, _shape: Any = None) -> tuple:
            return (data.reshape(_resolve_reshape(data.shape, shape, allowzero)),)

        return run_copying

    def run(data: np.ndarray, shape_in: np.ndarray) -> tuple:
        return (data.reshape(_resolve_reshape(data.shape, int_list(shape_in), allowzero)),)

    return run


@kernel("Flatten")
def _flatten(spec: NodeSpec) -> Kernel:
    axis = int(spec.attr("axis", 1))

    def run(data: np.ndarray) -> tuple:
        rank = data.ndim
        if not -rank <= axis <= rank:
            raise ValueError(f"Flatten: axis {axis} is out of range for rank {rank}")
        split = axis + rank if axis < 0 else axis
        shape = data.shape  # math.prod: np.prod costs 2 us per call
        return (data.reshape(math.prod(shape[:split]), math.prod(shape[split:])),)

    return run


@kernel("Transpose")
def _transpose(spec: NodeSpec) -> Kernel:
    perm = spec.attr("perm")
    axes = None if perm is None else tuple(int(p) for p in perm)

    def run(data: np.ndarray) -> tuple:
        return (np.transpose(data, axes),)

    return run


def _axes_operand(spec: NodeSpec, since_input: int) -> tuple[bool, list[int] | None]:
    """(known at compile time, axes) for ops whose ``axes`` attribute became input 1."""
    if spec.opset < since_input:
        axes = spec.attr("axes")
        return True, None if axes is None else int_list(axes)
    if spec.num_inputs < 2:
        return True, None
    const = spec.const(1)
    return const is not None, None if const is None else int_list(const)


def _squeeze(data: np.ndarray, axes: list[int] | None) -> np.ndarray:
    if axes is None or len(axes) == 0:
        return np.squeeze(data)
    norm = tuple(normalize_axis(a, data.ndim, "Squeeze axis") for a in axes)
    for a in norm:
        if data.shape[a] != 1:
            raise ValueError(f"Squeeze: dimension {a} of shape {data.shape} is not 1")
    return np.squeeze(data, axis=norm)


def _squeeze_index(rank: int, axes: list[int]) -> tuple[tuple[Any, ...], tuple[int, ...]]:
    """For squeezing ``axes`` of a rank-``rank`` array: the numpy index that drops them
    (ending in ``...``, so that dropping every axis still gives a 0-d array, not a
    scalar), and the axes, non-negative."""
    norm = tuple(normalize_axis(a, rank, "Squeeze axis") for a in axes)
    index = tuple(0 if a in norm else slice(None) for a in range(rank))
    return (*index, Ellipsis), norm


@kernel("Squeeze")
def _squeeze_kernel(spec: NodeSpec) -> Kernel:
    known, axes = _axes_operand(spec, since_input=13)
    if known and axes:
        # Constant axes: the index that drops them, made once per input rank (an index
        # with 0 on each axis is a view, a third of np.squeeze's time on small arrays).
        by_rank: dict[int, tuple[tuple[Any, ...], tuple[int, ...]]] = {}

        def run_indexed(data: np.ndarray, _axes: Any = None) -> tuple:
            shape = data.shape
            found = by_rank.get(len(shape))
            if found is None:
                found = by_rank[len(shape)] = _squeeze_index(len(shape), axes)
            index, norm = found
            for a in norm:
                if shape[a] != 1:
                    raise ValueError(f"Squeeze: dimension {a} of shape {shape} is not 1")
            return (data[index],)

        return run_indexed
    if known:

        def run_fixed(data: np.ndarray, _axes: Any = None) -> tuple:
            return (_squeeze(data, axes),)

        return run_fixed

    def run(data: np.ndarray, axes_in: np.ndarray | None = None) -> tuple:
        return (_squeeze(data, None if axes_in is None else int_list(axes_in)),)

    return run


def _unsqueeze(data: np.ndarray, axes: list[int]) -> np.ndarray:
    return data[_unsqueeze_index(data.ndim, axes)]


def _unsqueeze_index(rank: int, axes: list[int]) -> tuple[Any, ...]:
    """The numpy index that inserts unit ``axes`` into a rank-``rank`` array (a view)."""
    out_rank = rank + len(axes)
    norm = {normalize_axis(a, out_rank, "Unsqueeze axis") for a in axes}
    if len(norm) != len(axes):
        raise ValueError(f"Unsqueeze: axes {axes} repeat an axis")
    return tuple(None if a in norm else slice(None) for a in range(out_rank))


@kernel("Unsqueeze")
def _unsqueeze_kernel(spec: NodeSpec) -> Kernel:
    known, axes = _axes_operand(spec, since_input=13)
    if known:
        if axes is None:
            raise ValueError("Unsqueeze needs axes")
        fixed = axes
        by_rank: dict[int, tuple[Any, ...]] = {}  # the index, made once per input rank

        def run_fixed(data: np.ndarray, _axes: Any = None) -> tuple:
            index = by_rank.get(data.ndim)
            if index is None:
                index = by_rank[data.ndim] = _unsqueeze_index(data.ndim, fixed)
            return (data[index],)

        return run_fixed

    def run(data: np.ndarray, axes_in: np.ndarray) -> tuple:
        return (_unsqueeze(data, int_list(axes_in)),)

    return run


@kernel("Concat")
def _concat(spec: NodeSpec) -> Kernel:
    axis = int(spec.attr("axis", 1))

    def run(*inputs: np.ndarray) -> tuple:
        rank = inputs[0].ndim
        return (np.concatenate(inputs, axis=normalize_axis(axis, rank, "Concat axis")),)

    return run


def _split_sizes(dim: int, parts: int) -> list[int]:
    """Equal chunks of ``ceil(dim / parts)``; the last one takes what is left."""
    chunk = -(-dim // parts)
    last = dim - chunk * (parts - 1)
    if last < 0:
        raise ValueError(f"Split: a dimension of {dim} cannot be split into {parts} outputs")
    return [chunk] * (parts - 1) + [last]


def _split(data: np.ndarray, axis: int, sizes: list[int] | None, parts: int) -> tuple:
    ax = normalize_axis(axis, data.ndim, "Split axis")
    dim = data.shape[ax]
    if sizes is None:
        sizes = _split_sizes(dim, parts)
    if sum(sizes) != dim or len(sizes) != parts:
        raise ValueError(f"Split: sizes {sizes} do not split dimension {dim} into {parts} outputs")
    # Basic slices, views as np.split makes them, without its Python (10 us a call).
    lead = (slice(None),) * ax
    parts_out = []
    start = 0
    for size in sizes:
        parts_out.append(data[(*lead, slice(start, start + size))])
        start += size
    return tuple(parts_out)


@kernel("Split")
def _split_kernel(spec: NodeSpec) -> Kernel:
    axis = int(spec.attr("axis", 0))
    parts = int(spec.attr("num_outputs", spec.num_outputs))
    sizes_attr = spec.attr("split") if spec.opset < 13 else None
    if sizes_attr is not None and len(sizes_attr) > 0:
        fixed: list[int] | None = int_list(sizes_attr)
    elif (spec.opset == 1 or spec.opset >= 13) and spec.num_inputs > 1:
        const = spec.const(1)
        if const is None:

            def run_dynamic(data: np.ndarray, split: np.ndarray | None = None) -> tuple:
                sizes = None if split is None or split.size == 0 else int_list(split)
                return _split(data, axis, sizes, parts)

            return run_dynamic
        fixed = int_list(const) if const.size else None
    else:
        fixed = None

    def run(data: np.ndarray, _split_in: Any = None) -> tuple:
        return _split(data, axis, fixed, parts)

    return run


_SHAPES_KEPT = 64
"""Input shapes an Expand remembers its output shape for."""
_EXPAND_COPY_ELEMENTS = 4096
"""Expand copies outputs up to this many elements, and returns a broadcast view of
larger ones (no copy of a large mask or bias)."""


@kernel("Expand", since=8)
def _expand(spec: NodeSpec) -> Kernel:
    const = spec.const(1)
    fixed = None if const is None else tuple(int_list(const))

    shapes: dict[tuple[Any, ...], tuple[int, ...]] = {}  # the output shape, once per shapes

    def run(data: np.ndarray, shape: np.ndarray) -> tuple:
        target = fixed if fixed is not None else tuple(int_list(shape))
        key = (data.shape, target)
        out_shape = shapes.get(key)
        if out_shape is None:
            if len(shapes) >= _SHAPES_KEPT:
                shapes.clear()
            out_shape = shapes[key] = np.broadcast_shapes(data.shape, target)
        if math.prod(out_shape) > _EXPAND_COPY_ELEMENTS:
            return (np.broadcast_to(data, out_shape),)
        out = np.empty(out_shape, data.dtype)
        out[...] = data  # a small copy costs less than np.broadcast_to's Python
        return (out,)

    return run


@kernel("Tile", since=6)
def _tile(spec: NodeSpec) -> Kernel:
    const = spec.const(1)
    fixed = None if const is None else int_list(const)

    def run(data: np.ndarray, repeats: np.ndarray) -> tuple:
        reps = fixed if fixed is not None else int_list(repeats)
        if len(reps) != data.ndim:
            raise ValueError(f"Tile: {len(reps)} repeats for an input of rank {data.ndim}")
        shape = data.shape
        if all(r == 1 or n == 1 for n, r in zip(shape, reps)) and min(reps, default=1) >= 0:
            # Only unit axes repeat: a broadcast copy, without np.tile's Python.
            out = np.empty([n * r for n, r in zip(shape, reps)], data.dtype)
            out[...] = data
            return (out,)
        return (np.tile(data, reps),)

    return run


PadMode = Literal["constant", "reflect", "edge", "wrap"]
_PAD_MODES = {"constant", "reflect", "edge", "wrap"}


def _pad(
    data: np.ndarray, pads: list[int], axes: list[int] | None, mode: PadMode, value: Any
) -> np.ndarray:
    rank = data.ndim
    axes_n = list(range(rank)) if axes is None else [normalize_axis(a, rank) for a in axes]
    if len(pads) != 2 * len(axes_n):
        raise ValueError(f"Pad: {len(pads)} pads for {len(axes_n)} axes (want twice as many)")
    width = [(0, 0)] * rank
    for i, a in enumerate(axes_n):
        width[a] = (pads[i], pads[i + len(axes_n)])
    if any(b < 0 or e < 0 for b, e in width):
        crop = tuple(
            slice(max(-b, 0), data.shape[a] - max(-e, 0)) for a, (b, e) in enumerate(width)
        )
        data = data[crop]
        width = [(max(b, 0), max(e, 0)) for b, e in width]
    if not any(b or e for b, e in width):
        return data
    if mode == "wrap" or (
        mode != "constant"
        and any(
            (b or e) and (n == 0 or (mode == "reflect" and max(b, e) >= n))
            for (b, e), n in zip(width, data.shape)
        )
    ):
        return np.pad(data, width, mode=mode)
    return _pad_sliced(data, width, mode, value)


def _pad_sliced(
    data: np.ndarray, width: list[tuple[int, int]], mode: PadMode, value: Any
) -> np.ndarray:
    """Constant, edge and reflect padding (reflect pads shorter than the axis) by slice
    assignments: the interior, then the borders axis by axis, each spanning the axes
    padded before it. np.pad's generality costs ~10 us a call, most of a small model's
    Pad (Silero VAD's reflect Pad of 512 samples: 12.7 -> 5.6 us)."""
    shape = tuple(n + b + e for n, (b, e) in zip(data.shape, width))
    if mode == "constant":
        out = np.full(shape, value, dtype=data.dtype)
        out[tuple(slice(b, b + n) for n, (b, _) in zip(data.shape, width))] = data
        return out
    out = np.empty(shape, dtype=data.dtype)
    out[tuple(slice(b, b + n) for n, (b, _) in zip(data.shape, width))] = data
    for axis, (n, (b, e)) in enumerate(zip(data.shape, width)):
        lead = (slice(None),) * axis
        if mode == "edge":
            out[(*lead, slice(0, b))] = out[(*lead, slice(b, b + 1))]
            out[(*lead, slice(b + n, b + n + e))] = out[(*lead, slice(b + n - 1, b + n))]
        else:  # reflect: out[b - 1 - k] = out[b + 1 + k], out[b + n + k] = out[b + n - 2 - k]
            if b:
                out[(*lead, slice(0, b))] = out[(*lead, slice(2 * b, b, -1))]
            if e:
                stop = b + n - 2 - e
                out[(*lead, slice(b + n, b + n + e))] = out[
                    (*lead, slice(b + n - 2, stop if stop >= 0 else None, -1))
                ]
    return out


@kernel("Pad")
def _pad_kernel(spec: NodeSpec) -> Kernel:
    mode_name = spec.attr("mode", "constant")
    if mode_name not in _PAD_MODES:
        raise ValueError(f"Pad: mode {mode_name!r} is not one of {sorted(_PAD_MODES)}")
    mode = cast(PadMode, mode_name)
    if spec.opset < 11:
        pads_attr = spec.attr("paddings" if spec.opset < 2 else "pads")
        if pads_attr is None:
            raise ValueError("Pad needs the 'pads' attribute")
        fixed_pads = int_list(pads_attr)
        value = float(spec.attr("value", 0.0))

        def run_attr(data: np.ndarray) -> tuple:
            return (_pad(data, fixed_pads, None, mode, value),)

        return run_attr

    const_pads = spec.const(1)
    const_axes = spec.const(3)
    pads_c = None if const_pads is None else int_list(const_pads)
    axes_c = None if const_axes is None else int_list(const_axes)

    def run(
        data: np.ndarray,
        pads: np.ndarray,
        constant_value: np.ndarray | None = None,
        axes: np.ndarray | None = None,
    ) -> tuple:
        p = pads_c if pads_c is not None else int_list(pads)
        ax = axes_c if axes_c is not None else (None if axes is None else int_list(axes))
        v = 0 if constant_value is None or constant_value.size == 0 else constant_value.item()
        return (_pad(data, p, ax, mode, v),)

    return run


@kernel("Shape")
def _shape(spec: NodeSpec) -> Kernel:
    start = int(spec.attr("start", 0))
    end = spec.attr("end")

    def run(data: np.ndarray) -> tuple:
        return (np.array(data.shape[start:end], dtype=np.int64),)

    return run


@kernel("Size")
def _size(spec: NodeSpec) -> Kernel:
    def run(data: np.ndarray) -> tuple:
        return (np.array(data.size, dtype=np.int64),)

    return run


@kernel("ConstantOfShape", since=9)
def _constant_of_shape(spec: NodeSpec) -> Kernel:
    value = spec.attr("value")
    fill = np.zeros((), np.float32) if value is None else np.asarray(value)
    if fill.size != 1:
        raise ValueError(f"ConstantOfShape: 'value' must hold one element, not {fill.size}")
    scalar, dtype = fill.reshape(-1)[0], fill.dtype
    const = spec.const(0)
    fixed = None if const is None else tuple(int_list(const))

    def run(shape: np.ndarray) -> tuple:
        target = fixed if fixed is not None else tuple(int_list(shape))
        return (np.full(target, scalar, dtype=dtype),)

    return run


@kernel("Range", since=11)
def _range(spec: NodeSpec) -> Kernel:
    def run(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> tuple:
        if delta.item() == 0:
            raise ValueError("Range: delta must not be 0")
        return (np.arange(start.item(), limit.item(), delta.item()).astype(start.dtype),)

    return run


def _check_blocks(data: np.ndarray, op: str) -> None:
    if data.ndim != 4:
        raise ValueError(f"{op}: input must have rank 4, not {data.ndim}")


@kernel("DepthToSpace")
def _depth_to_space(spec: NodeSpec) -> Kernel:
    bs = int(spec.attr("blocksize"))
    mode = spec.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise ValueError(f"DepthToSpace: mode {mode!r} is not 'DCR' or 'CRD'")

    def run(data: np.ndarray) -> tuple:
        _check_blocks(data, "DepthToSpace")
        n, c, h, w = data.shape
        if c % (bs * bs):
            raise ValueError(f"DepthToSpace: {c} channels not divisible by blocksize² {bs * bs}")
        oc = c // (bs * bs)
        if mode == "DCR":
            x = data.reshape(n, bs, bs, oc, h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            x = data.reshape(n, oc, bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
        return (x.reshape(n, oc, h * bs, w * bs),)

    return run


@kernel("SpaceToDepth")
def _space_to_depth(spec: NodeSpec) -> Kernel:
    bs = int(spec.attr("blocksize"))
    mode = spec.attr("mode", "DCR")  # an attribute from opset 28 on
    if mode not in ("DCR", "CRD"):
        raise ValueError(f"SpaceToDepth: mode {mode!r} is not 'DCR' or 'CRD'")
    # DCR: output channel (block row, block column, channel); CRD: (channel, row, column).
    order = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)

    def run(data: np.ndarray) -> tuple:
        _check_blocks(data, "SpaceToDepth")
        n, c, h, w = data.shape
        if h % bs or w % bs:
            raise ValueError(f"SpaceToDepth: spatial size {h}x{w} not divisible by {bs}")
        x = data.reshape(n, c, h // bs, bs, w // bs, bs).transpose(order)
        return (x.reshape(n, c * bs * bs, h // bs, w // bs),)

    return run


@kernel("Trilu", since=14)
def _trilu(spec: NodeSpec) -> Kernel:
    upper = bool(spec.attr("upper", 1))
    const = spec.const(1)
    fixed = None if const is None else int(const.item())
    op = np.triu if upper else np.tril

    def run(data: np.ndarray, k: np.ndarray | None = None) -> tuple:
        diag = fixed if fixed is not None else (0 if k is None else int(k.item()))
        return (op(data, diag),)

    return run
