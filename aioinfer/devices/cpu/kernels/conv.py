"""Convolution kernels: Conv and ConvTranspose over 1-, 2- and 3-D (any rank) inputs.

Conv is im2col followed by one BLAS matmul (batched over groups); 1x1 stride-1 unpadded
convolutions skip im2col. Large ones of one group and few filters run in blocks of
output rows, each computed whole by one thread (:mod:`.conv_rows`). Other 1-D and 2-D
ones copy their columns from the phase-flattened padded input (:mod:`.conv_flat`),
depthwise ones multiply blocks of such columns by their channels' taps, and 3x3 stride-1
ones with many channels run as Winograd F(2x2, 3x3) (:mod:`.conv_winograd`); small ones
(and N-D ones) use the strided window view of the once-padded input. ConvTranspose is
one matmul producing columns and a col2im scatter-add that loops over kernel positions
only (with a kernel as large as its stride: one strided copy per tap). Weight matrices
are prepared at compile time when W is constant. The padding and window helpers are
shared with the pooling kernels.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from numpy.lib.stride_tricks import as_strided

from aioinfer.devices.cpu.kernels.conv_flat import (
    DepthwiseOperands,
    Epilogue,
    FlatGeometry,
    by_pixels,
    depthwise_operands,
    flat_conv,
    flat_depthwise,
    flat_geometry,
    product_by_pixels,
    scratch,
    scratch_columns,
    with_depthwise_bias,
)
from aioinfer.devices.cpu.kernels.conv_rows import ConvEpilogue, RowPlan, row_plan, rows_conv
from aioinfer.devices.cpu.kernels.conv_shift import ShiftPlan, shift_conv, shift_plan
from aioinfer.devices.cpu.kernels.conv_small import SmallConv
from aioinfer.devices.cpu.kernels.conv_winograd import (
    winograd_conv,
    winograd_fits,
    winograd_weights,
)
from aioinfer.devices.cpu.kernels.matmul import SPLIT_PRODUCT, gemm_2d, stacked_matmul
from aioinfer.devices.cpu.kernels.parallel import (
    MIN_PARALLEL_ELEMENTS,
    intra_op_threads,
    run_parallel,
)
from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, OutKernel, kernel, out_kernel

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def auto_pad_attr(spec: NodeSpec) -> str:
    """The node's ``auto_pad`` attribute, validated."""
    auto_pad = spec.attr("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if auto_pad == "":
        auto_pad = "NOTSET"
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"{spec.op_type}: auto_pad must be one of {AUTO_PADS}, got {auto_pad!r}")
    return str(auto_pad)


def per_axis(values: Sequence[int] | None, rank: int, default: int, name: str) -> tuple[int, ...]:
    """An attribute with one entry per spatial axis (``default`` when absent)."""
    if not values:
        return (default,) * rank
    if len(values) != rank:
        raise ValueError(f"{name} has {len(values)} entries, expected {rank} (one per axis)")
    return tuple(int(v) for v in values)


def explicit_pads(pads: Sequence[int] | None, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Split an ONNX ``pads`` list ``[b1, b2, ..., e1, e2, ...]`` into (begins, ends)."""
    if not pads:
        return (0,) * rank, (0,) * rank
    if len(pads) != 2 * rank:
        raise ValueError(f"pads has {len(pads)} entries, expected {2 * rank} (two per axis)")
    if min(pads) < 0:
        raise ValueError(f"pads must be non-negative, got {list(pads)}")
    return tuple(int(p) for p in pads[:rank]), tuple(int(p) for p in pads[rank:])


def same_pad_split(total: int, auto_pad: str) -> tuple[int, int]:
    """Split ``total`` padding between begin and end; the odd one goes to the end for UPPER."""
    small = total // 2
    return (small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small)


def pad_spatial(
    x: np.ndarray, begins: Sequence[int], ends: Sequence[int], value: float | int = 0
) -> np.ndarray:
    """``x`` with its spatial axes (2...) padded by ``value``; ``x`` itself when no padding."""
    if not any(begins) and not any(ends):
        return x
    shape = x.shape[:2] + tuple(
        n + b + e for n, b, e in zip(x.shape[2:], begins, ends, strict=True)
    )
    padded = np.empty(shape, dtype=x.dtype)
    inner = tuple(slice(b, b + n) for n, b in zip(x.shape[2:], begins, strict=True))
    padded[(slice(None), slice(None), *inner)] = x
    # Fill only the borders (corners are written twice), not the whole buffer.
    for axis, (n, b) in enumerate(zip(x.shape[2:], begins, strict=True)):
        lead = (slice(None),) * (2 + axis)
        padded[(*lead, slice(0, b))] = value
        padded[(*lead, slice(b + n, None))] = value
    return padded


def window_view(
    x: np.ndarray,
    kernel_shape: Sequence[int],
    out_shape: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
) -> np.ndarray:
    """Read-only view ``(N, C, *kernel_shape, *out_shape)`` of the windows of ``x``.

    ``view[n, c, k..., o...] == x[n, c, o * stride + k * dilation ...]``; the caller makes
    sure every window lies inside ``x`` (pad first).
    """
    spatial = x.strides[2:]
    shape = x.shape[:2] + tuple(kernel_shape) + tuple(out_shape)
    view_strides = (
        x.strides[:2]
        + tuple(s * d for s, d in zip(spatial, dilations, strict=True))
        + tuple(s * st for s, st in zip(spatial, strides, strict=True))
    )
    return as_strided(x, shape, view_strides, writeable=False)


PLAN_CACHE_SIZE = 32
"""Input shapes whose geometry a kernel remembers; dynamic shapes beyond that start over."""

K = TypeVar("K")
V = TypeVar("V")


def cached_plan(plans: dict[K, V], key: K, make: Callable[[], V]) -> V:
    """``plans[key]``, made by ``make()`` on a miss; a full cache is emptied first."""
    plan = plans.get(key)
    if plan is None:
        if len(plans) >= PLAN_CACHE_SIZE:
            plans.clear()
        plan = plans[key] = make()
    return plan


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype the matmuls run in: float16 has no BLAS, so it is widened to float32."""
    return np.dtype(np.float32) if dtype == np.float16 else dtype


# -- Conv -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ConvPlan:
    """The geometry of one Conv call, derived from the input and weight shapes."""

    kernel_shape: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begins: tuple[int, ...]
    ends: tuple[int, ...]
    out_shape: tuple[int, ...]
    pointwise: bool
    """1x1 kernel, stride 1, no padding: the input already is the column matrix."""
    pixels: int
    """Output positions per image and channel."""
    flat: FlatGeometry | None
    """1-D and 2-D kernels other than pointwise ones: their phase-flattened windows."""
    winograd: bool
    """A 3x3 stride-1 convolution with many channels: Winograd F(2x2, 3x3)."""
    small: bool
    """im2col columns of at most :data:`KEPT_COLUMNS_BYTES` (float32): kept per node,
    which costs a small convolution less than the phase-flattened columns."""
    rows: RowPlan | None
    """A large convolution of one group: computed in blocks of output rows
    (:mod:`.conv_rows`)."""
    shifted: ShiftPlan | None
    """A 1xk kernel keeping the width or a kx1 one without padding, of one group and
    not in blocks of rows: columns as shifted copies of the input (:mod:`.conv_shift`)."""


ConvCompute = Callable[
    [np.ndarray, np.ndarray, "np.ndarray | None", "np.ndarray | None", "ConvEpilogue | None"],
    tuple[np.ndarray, bool],
]
"""``compute(x, w, b, out, epilogue) -> (y, applied)``: a convolution written into
``out`` when it is given (a contiguous array of y's shape and dtype), else into a new
array; ``applied`` tells whether the ``epilogue`` was applied to all of ``y`` (depthwise
1-D and 2-D convolutions and those computed in blocks of rows apply it on each thread's
share of the output); when not, the caller applies it."""


def conv_compute(spec: NodeSpec) -> ConvCompute:
    """The convolution of a Conv (or FusedConv) node, bound at compile time."""
    group = int(spec.attr("group", 1))
    auto_pad = auto_pad_attr(spec)
    strides_attr = spec.attr("strides")
    dilations_attr = spec.attr("dilations")
    pads_attr = spec.attr("pads")
    kernel_shape_attr = spec.attr("kernel_shape")
    plans: dict[tuple[tuple[int, ...], tuple[int, ...]], _ConvPlan] = {}

    def plan_for(x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> _ConvPlan:
        rank = len(x_shape) - 2
        if rank < 1 or len(w_shape) != rank + 2:
            raise ValueError(f"Conv: input shape {x_shape} and weight shape {w_shape} mismatch")
        if x_shape[1] != w_shape[1] * group or w_shape[0] % group:
            raise ValueError(
                f"Conv: input channels {x_shape[1]} and weight shape {w_shape} do not fit "
                f"group={group} (expected W of shape (M, C/group, ...) with M % group == 0)"
            )
        kshape = tuple(w_shape[2:])
        if kernel_shape_attr and tuple(kernel_shape_attr) != kshape:
            raise ValueError(f"Conv: kernel_shape {kernel_shape_attr} but W has shape {w_shape}")
        strides = per_axis(strides_attr, rank, 1, "strides")
        dilations = per_axis(dilations_attr, rank, 1, "dilations")
        begins, ends = (list(p) for p in explicit_pads(pads_attr, rank))
        out = []
        for i, (size, k, s, d) in enumerate(
            zip(x_shape[2:], kshape, strides, dilations, strict=True)
        ):
            extent = (k - 1) * d + 1
            if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                out.append(-(-size // s))
                total = max(0, (out[-1] - 1) * s + extent - size)
                begins[i], ends[i] = same_pad_split(total, auto_pad)
            elif auto_pad == "VALID":
                begins[i], ends[i] = 0, 0
                out.append((size - extent) // s + 1)
            else:
                out.append((size + begins[i] + ends[i] - extent) // s + 1)
        if min(out) < 1:
            raise ValueError(f"Conv: input {x_shape} is smaller than the kernel {kshape}")
        pointwise = all(k == 1 for k in kshape) and not any(begins) and not any(ends)
        strided = any(s != 1 for s in strides)
        flat = (
            flat_geometry(
                x_shape[2:],
                kshape,
                strides,
                dilations,
                begins,
                ends,
                out,
                w_shape[0] // group,
                w_shape[1],
            )
            if rank <= 2 and not pointwise
            else None
        )
        winograd = winograd_fits(
            kshape, strides, dilations, group, x_shape[1], w_shape[0], tuple(out)
        )
        rows = None
        if group == 1 and not winograd and (rank == 2 or (pointwise and not strided)):
            rows = row_plan(
                None if pointwise else flat,
                strides,
                tuple(out),
                x_shape[0],
                x_shape[1],
                w_shape[0],
                intra_op_threads(),
            )
        columns = x_shape[0] * x_shape[1] * math.prod(kshape) * math.prod(out)
        small_columns = columns * 4 <= KEPT_COLUMNS_BYTES
        shifted = None
        # Where the window view copies whole channels (a kx1 kernel, or one output
        # row), small columns keep the kept-columns paths (openWakeWord's 96 3x1
        # filters over 96x10x2: 14.6 us a node, shifted 21.4; PP-OCR's 60 1x3 filters
        # over 480x1x40: 71, shifted 72-81); 1xk ones over several rows copy runs of one
        # output row there (96x12x4: 39.5, shifted 33.4 us).
        if group == 1 and rows is None and rank == 2:
            whole = kshape[1] == 1 or out[0] == 1
            if not (whole and small_columns):
                shifted = shift_plan(x_shape[2:], kshape, strides, dilations, begins, ends, out)
        return _ConvPlan(
            kshape,
            strides,
            dilations,
            tuple(begins),
            tuple(ends),
            tuple(out),
            pointwise,
            math.prod(out),
            flat,
            winograd,
            small_columns,
            rows,
            shifted,
        )

    def weight_matrix(w: np.ndarray) -> np.ndarray:
        # (M, C/g, *k) -> (g, M/g, C/g * prod(k)): one matrix per group.
        return np.ascontiguousarray(
            w.reshape(group, w.shape[0] // group, -1), dtype=compute_dtype(w.dtype)
        )

    w_const = spec.const(1)
    w_fixed = weight_matrix(w_const) if w_const is not None else None
    transformed: list[np.ndarray] = []
    """Constant weights transformed for Winograd, made at the first call that uses them."""
    ordered: dict[tuple[int, ...], np.ndarray] = {}
    """Constant weights with their taps in the order of a geometry's columns."""

    def tap_ordered(w: np.ndarray, wmat: np.ndarray, order: tuple[int, ...]) -> np.ndarray:
        """``wmat`` (or depthwise ``(C, taps)``) with the taps of ``order``, cached when
        ``w`` is constant."""
        if w_const is not None and order in ordered:
            return ordered[order]
        taps = math.prod(w.shape[2:])
        if group == w.shape[0] and w.shape[1] == 1:  # depthwise: (C, taps)
            matrix = wmat.reshape(group, taps)[:, order]
        else:
            shape = wmat.shape
            matrix = wmat.reshape(*shape[:2], -1, taps)[..., order].reshape(*shape[:2], -1)
        matrix = np.ascontiguousarray(matrix)
        if w_const is not None:
            cached_plan(ordered, order, lambda: matrix)
        return matrix

    b_const = spec.const(2)
    grouped: dict[int, tuple[FlatGeometry, DepthwiseOperands, DepthwiseOperands]] = {}
    """Constant depthwise weights as :func:`.conv_flat.flat_depthwise` takes them, by the
    id of their geometry: without a bias, and with the constant bias (the entry holds
    the geometry, so a reused id is not mistaken; a geometry is made for one input
    shape, so for one batch size)."""

    def depthwise_taps(
        w: np.ndarray, wmat: np.ndarray, b: np.ndarray | None, flat: FlatGeometry, images: int
    ) -> DepthwiseOperands:
        """The depthwise operands for ``flat``, cached when ``w`` is constant (a bias fed
        at run time is added to the cached taps)."""
        if w_const is None:
            bare = depthwise_operands(flat, tap_ordered(w, wmat, flat.order), images)
            return with_depthwise_bias(bare, b)
        entry = grouped.get(id(flat))
        if entry is None or entry[0] is not flat:
            if len(grouped) >= PLAN_CACHE_SIZE:
                grouped.clear()
            bare = depthwise_operands(flat, tap_ordered(w, wmat, flat.order), images)
            entry = grouped[id(flat)] = (flat, bare, with_depthwise_bias(bare, b_const))
        return entry[2] if b is b_const else with_depthwise_bias(entry[1], b)

    prepared: dict[tuple[tuple[int, ...], bool], np.ndarray] = {}
    """Constant weights as :func:`.conv_rows.rows_conv` takes them, per tap order."""

    def row_weights(w: np.ndarray, wmat: np.ndarray, plan: RowPlan) -> np.ndarray:
        """The weights of :func:`.conv_rows.rows_conv`, cached when ``w`` is constant."""
        if plan.geometry is None:
            return wmat[0]
        key = (plan.geometry.order, plan.implicit)
        if w_const is not None and key in prepared:
            return prepared[key]
        matrix = tap_ordered(w, wmat, plan.geometry.order)[0]
        if plan.implicit:  # (M, C * taps) -> (taps, M, C)
            taps = len(plan.geometry.order)
            matrix = np.ascontiguousarray(
                matrix.reshape(matrix.shape[0], -1, taps).transpose(2, 0, 1)
            )
        if w_const is not None:
            cached_plan(prepared, key, lambda: matrix)
        return matrix

    biased: dict[tuple[int, ...] | None, np.ndarray] = {}
    """Constant weight matrices with the constant bias as one more column, by the tap
    order of the matrix (None: ``wmat``'s own, row-major)."""
    foldable = b_const is not None and w_const is not None and group == 1

    def with_bias(
        order: tuple[int, ...] | None, matrix: np.ndarray, b: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """``(matrix, b)``, or when the weights and the bias are constant ``matrix``
        ``(M, K)`` or ``(1, M, K)`` (its taps in ``order``) with ``b`` as column ``K``
        and None (cached: the same for every path whose taps are in that order), for
        columns with a row of ones after their ``K`` rows: the product then adds the
        bias, and no pass over the output does (64 3x3 filters over 16x55x55: 277
        instead of 304 us, 64 1x1 filters over 16x55x55 45 instead of 70 us with the
        copy of the input under a row of ones)."""
        if not foldable or b is None or b is not b_const:
            return matrix, b
        found = biased.get(order)
        if found is None:
            rows = matrix.reshape(matrix.shape[-2:])
            column = b.astype(matrix.dtype, copy=False).reshape(-1, 1)
            found = np.ascontiguousarray(np.concatenate([rows, column], axis=1))
            cached_plan(biased, order, lambda: found)
        return found.reshape(*matrix.shape[:-1], found.shape[-1]), None

    local = _ConvThread()
    """This thread's kept columns (kernels are shared by requests running on several
    threads)."""

    def compute(
        x: np.ndarray,
        w: np.ndarray,
        b: np.ndarray | None,
        out: np.ndarray | None,
        epilogue: ConvEpilogue | None = None,
    ) -> tuple[np.ndarray, bool]:
        small = local.small.get((x.shape, x.dtype.char)) if w is w_const else None
        if small is not None:
            y = small(x, b, out)
            if epilogue is not None:
                epilogue.channels(0, y.shape[1], y[0])
            return y, epilogue is not None
        plan = cached_plan(plans, (x.shape, w.shape), lambda: plan_for(x.shape, w.shape))
        n, c = x.shape[:2]
        work = x.astype(compute_dtype(x.dtype), copy=False)
        if out is not None and (
            out.dtype != work.dtype or out.shape != (n, w.shape[0], *plan.out_shape)
        ):
            out = None  # another shape than when the memory plan was made
        wmat = w_fixed if w_fixed is not None else weight_matrix(w)
        flat = plan.flat
        depthwise = group == c and w.shape[:2] == (c, 1)
        if plan.winograd and n:
            y = out if out is not None else np.empty((n, w.shape[0], *plan.out_shape), work.dtype)
            if w_const is None:
                u = winograd_weights(w, work.dtype)
            else:
                if not transformed:
                    transformed.append(winograd_weights(w_const, work.dtype))
                u = transformed[0]
            winograd_conv(work, u, plan.begins, plan.out_shape, y)
            applied = _finish_channels(y, b, epilogue)
            return y.astype(x.dtype, copy=False), applied
        if plan.rows is not None and not depthwise and work.dtype == x.dtype:
            y = out if out is not None else np.empty((n, w.shape[0], *plan.out_shape), work.dtype)
            weights, bias = row_weights(w, wmat, plan.rows), b
            if plan.rows.geometry is not None and not plan.rows.implicit:
                # (a folded bias: the block columns get a row of ones)
                weights, bias = with_bias(plan.rows.geometry.order, weights, b)
            return y, rows_conv(plan.rows, work, weights, bias, y, epilogue)
        if plan.shifted is not None and n and not depthwise and work.dtype == x.dtype:
            y = out if out is not None else np.empty((n, w.shape[0], *plan.out_shape), work.dtype)
            weights, bias = with_bias(None, wmat[0], b)
            shift_conv(plan.shifted, work, weights, y)
            return y, _finish_channels(y, bias, epilogue)
        if flat is not None and n and (depthwise or not plan.small):
            y = out if out is not None else np.empty((n, w.shape[0], *plan.out_shape), work.dtype)
            if depthwise:
                then = None if epilogue is None else epilogue.channels
                operands = depthwise_taps(w, wmat, b, flat, n)
                flat_depthwise(flat, work, operands, y, then)
                return y.astype(x.dtype, copy=False), epilogue is not None
            # (a folded bias: the columns get a row of ones)
            weights, b = with_bias(flat.order, tap_ordered(w, wmat, flat.order), b)
            flat_conv(flat, work, weights, y)
            applied = _finish_channels(y, b, epilogue)
            return y.astype(x.dtype, copy=False), applied
        if depthwise and not plan.pointwise:
            return _depthwise(work, w, b, plan, out).astype(x.dtype, copy=False), False
        pixels = plan.pixels
        if (
            n == 1
            and group == 1
            and plan.small
            and w is w_const
            and work.dtype == x.dtype
            and wmat.size * pixels < SPLIT_PRODUCT
        ):
            kept = local.small
            if len(kept) >= PLAN_CACHE_SIZE:
                kept.clear()
            columns = _Columns(plan, x.shape, x.dtype)
            kept[x.shape, x.dtype.char] = SmallConv(
                columns.interior, columns.view, columns.cols, wmat[0], plan.out_shape, b_const
            )
            return compute(x, w, b, out, epilogue)
        if plan.pointwise:
            # 1x1 kernel without padding: the (strided) input is the column matrix.
            if any(s != 1 for s in plan.strides):
                every: tuple[Any, ...] = (..., *(slice(None, None, s) for s in plan.strides))
                work = work[every]
            cols = work.reshape(n, group, c // group, pixels)
        else:
            cols = _im2col(local, plan, work).reshape(n, group, wmat.shape[-1], pixels)
        m = w.shape[0]
        y = (
            np.empty((n, group, m // group, pixels), dtype=work.dtype)
            if out is None
            else out.reshape(n, group, m // group, pixels)
        )
        if group == 1 and pixels == 1:
            # One pixel per image (the 1x1 convolutions of a squeeze-and-excitation
            # block on pooled maps): the images are the rows of one product, not one
            # product each (PP-OCR's 6 images, 88 -> 22 filters: 9.6 instead of 18 us).
            np.matmul(cols.reshape(n, -1), wmat[0].T, out=y.reshape(n, m))
        elif group == 1 and plan.pointwise and by_pixels(m, c, pixels, work.dtype):
            for image in range(n):  # split between the threads by pixels
                product_by_pixels(wmat[0], cols[image, 0], y[image, 0].reshape(m, 1, pixels))
        elif group == 1:
            # Columns of at most half as many rows as filters: copied under a row of
            # ones, they cost less than a bias pass over the output.
            inner = wmat.shape[-1]
            weights, bias = with_bias(None, wmat[0], b) if 2 * inner <= m else (wmat[0], b)
            if bias is None and b is not None:  # folded: the input under a row of ones
                ones = scratch_columns("ones", inner, pixels, work.dtype, True)
                for image in range(n):
                    ones[:inner] = cols[image, 0]
                    gemm_2d(weights, ones, y[image, 0])
            else:
                for image in range(n):  # a large product is split between the threads
                    gemm_2d(weights, cols[image, 0], y[image, 0])
            b = bias
        else:
            stacked_matmul(wmat, cols, y)
        y = y.reshape((n, m, *plan.out_shape))
        applied = _finish_channels(y, b, epilogue)
        return y.astype(x.dtype, copy=False), applied

    return compute


def _bias_epilogue(
    b: np.ndarray | None, channels: int, dtype: np.dtype, rank: int
) -> Epilogue | None:
    """The epilogue adding ``b`` to blocks ``(count, *spatial)`` of ``rank`` spatial axes
    of a convolution's output."""
    if b is None:
        return None
    bias = b.astype(dtype, copy=False).reshape(-1, *(1,) * rank)

    def add(first: int, last: int, block: np.ndarray) -> None:
        channel = first % channels
        if channel + last - first <= channels:
            block += bias[channel : channel + last - first]
        else:
            block += bias[np.arange(first, last) % channels]

    return add


def _finish_channels(y: np.ndarray, b: np.ndarray | None, epilogue: ConvEpilogue | None) -> bool:
    """Add ``b`` to ``y`` ``(N, M, *out)`` and apply ``epilogue`` in one pass over blocks
    of its channels, split between the intra-op threads (not one thread's bias pass, then
    another pass for the epilogue); returns whether the epilogue was applied."""
    if 2 * y.size < MIN_PARALLEL_ELEMENTS:
        # Run whole in this thread anyway: the bias as one broadcast add (the same sums),
        # without the per-call closures and split (2 of silero's 9 us per convolution).
        if b is not None:
            y += b.astype(y.dtype, copy=False).reshape(-1, *(1,) * (y.ndim - 2))
        if epilogue is not None and y.size:
            epilogue.channels(0, y.shape[0] * y.shape[1], y.reshape(-1, *y.shape[2:]))
        return epilogue is not None
    channels = y.shape[1]
    then = None if epilogue is None else epilogue.channels
    finish = _chain(_bias_epilogue(b, channels, y.dtype, y.ndim - 2), then)
    if finish is None or y.size == 0:
        return False
    blocks = y.reshape(-1, *y.shape[2:])

    def part(start: int, stop: int) -> None:
        finish(start, stop, blocks[start:stop])

    run_parallel(part, blocks.shape[0], work=2 * y.size)
    return epilogue is not None


def _chain(first: Epilogue | None, then: Epilogue | None) -> Epilogue | None:
    """``first`` then ``then`` on each block (either may be None)."""
    if first is None or then is None:
        return first or then
    both = (first, then)

    def run(start: int, stop: int, block: np.ndarray) -> None:
        for epilogue in both:
            epilogue(start, stop, block)

    return run


KEPT_COLUMNS_BYTES = 1 << 18
"""im2col buffers up to this size are kept per node, input shape and thread, with the
zero-padded input whose borders are written once: a small convolution then costs one
copy into the padding, one into the columns and the product (43 -> 25 us for 16 3x3
filters on a 3x32x32 image). Larger columns are written into one buffer per thread that
all nodes share, so that no call pays for fresh pages of a new multi-megabyte array."""


class _Columns:
    """One thread's buffers for the im2col of one input shape: the padded input (its
    borders zero), the part of it the input goes to, and the columns with the window
    view of the padded input that fills them."""

    __slots__ = ("cols", "interior", "view")

    def __init__(self, plan: _ConvPlan, shape: tuple[int, ...], dtype: np.dtype) -> None:
        padded_shape = shape[:2] + tuple(
            size + b + e for size, b, e in zip(shape[2:], plan.begins, plan.ends, strict=True)
        )
        padded = np.zeros(padded_shape, dtype)
        inner: tuple[Any, ...] = (
            ...,
            *(slice(b, b + size) for size, b in zip(shape[2:], plan.begins, strict=True)),
        )
        self.interior = padded[inner]
        self.view = window_view(
            padded, plan.kernel_shape, plan.out_shape, plan.strides, plan.dilations
        )
        self.cols = np.empty(self.view.shape, dtype)


class _ConvThread(threading.local):
    """One Conv node's kept columns on this thread."""

    def __init__(self) -> None:
        self.small: dict[tuple[tuple[int, ...], str], SmallConv] = {}
        """:class:`.conv_small.SmallConv` by input shape and dtype."""
        self.columns: dict[tuple[int, ...], _Columns] = {}
        """:func:`_im2col`'s kept columns by input shape."""


def _im2col(local: _ConvThread, plan: _ConvPlan, x: np.ndarray) -> np.ndarray:
    """The columns ``(N, C, *kernel, *out)`` of ``x``'s windows, in a buffer reused by
    the next call on this thread (see :data:`KEPT_COLUMNS_BYTES`)."""
    kept = local.columns
    columns = kept.get(x.shape)
    if columns is not None and columns.cols.dtype == x.dtype:
        np.copyto(columns.interior, x)
        np.copyto(columns.cols, columns.view)
        return columns.cols
    entries = x.shape[0] * x.shape[1] * math.prod(plan.kernel_shape) * plan.pixels
    if entries * x.dtype.itemsize <= KEPT_COLUMNS_BYTES:
        if len(kept) >= PLAN_CACHE_SIZE:
            kept.clear()
        kept[x.shape] = _Columns(plan, x.shape, x.dtype)
        return _im2col(local, plan, x)
    padded = pad_spatial(x, plan.begins, plan.ends)
    view = window_view(padded, plan.kernel_shape, plan.out_shape, plan.strides, plan.dilations)
    cols = scratch("cols", view.shape, x.dtype)

    def copy(start: int, stop: int) -> None:  # split by input channel
        np.copyto(cols[:, start:stop], view[:, start:stop])

    run_parallel(copy, x.shape[1], work=cols.size)
    return cols


def _depthwise(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, plan: _ConvPlan, out: np.ndarray | None
) -> np.ndarray:
    """One filter per channel: a multiply-add per kernel tap, vectorised over batch,
    channels and pixels (N-D inputs and empty batches; 1-D and 2-D ones take
    :func:`.conv_flat.flat_depthwise`)."""
    n, c = x.shape[:2]
    padded = pad_spatial(x, plan.begins, plan.ends)
    view = window_view(padded, plan.kernel_shape, plan.out_shape, plan.strides, plan.dilations)
    weights = w.reshape(c, -1).astype(x.dtype, copy=False)
    lead = (1, c) + (1,) * len(plan.out_shape)
    y = out if out is not None else np.empty((n, c, *plan.out_shape), dtype=x.dtype)
    scratch = np.empty_like(y)
    for number, tap in enumerate(np.ndindex(*plan.kernel_shape)):
        taps = view[(slice(None), slice(None), *tap)]
        tap_weights = weights[:, number].reshape(lead)
        if number == 0:
            np.multiply(taps, tap_weights, out=y)
        else:
            np.multiply(taps, tap_weights, out=scratch)
            y += scratch
    if b is not None:
        y += b.reshape(lead)
    return y


@kernel("Conv", since=1)
def conv(spec: NodeSpec) -> Kernel:
    """Conv-1/11/22: N-D convolution with groups, dilations, strides and (auto) padding.

    im2col on a window view and one BLAS matmul; 1x1 unpadded kernels skip im2col
    (strided ones take a strided slice); depthwise kernels multiply-add per tap."""
    compute = conv_compute(spec)
    return lambda x, w, b=None: (compute(x, w, b, None, None)[0],)


@out_kernel(conv)
def conv_into(spec: NodeSpec) -> OutKernel:
    """Conv writing into a planned buffer."""
    compute = conv_compute(spec)

    return lambda out, x, w, b=None: (compute(x, w, b, out, None)[0],)


# -- ConvTranspose ----------------------------------------------------------------------


@dataclass(frozen=True)
class _TransposePlan:
    """The geometry of one ConvTranspose call.

    Kernel tap ``t`` adds input pixel ``i`` to full-output position ``i * s + t * d``. The
    scatter buffer holds the full output split into stride phases, ``(N, M, *s, *L)``
    with position ``q = a * s + r`` at ``[r, a]``, so each tap's target is a contiguous
    slice rather than a strided one; the output window is then gathered phase by phase.
    """

    phase_shape: tuple[int, ...]
    """Spatial shape of the scatter buffer: ``(*strides, *phase_lengths)``."""
    targets: tuple[tuple[Any, ...], ...]
    """Per kernel tap (``np.ndindex`` order): its index into the scatter buffer."""
    out_shape: tuple[int, ...]
    gathers: tuple[tuple[tuple[Any, ...], tuple[Any, ...]], ...]
    """Per stride phase: (index into the output, index into the scatter buffer)."""
    tiled: bool
    """Kernel as large as the stride, no dilation, the output the whole extent: every
    output pixel comes from one tap, and each tap's products go straight to their place
    (the 2x2 stride-2 upsampling of segmentation heads)."""


TransposeCompute = Callable[
    ["np.ndarray | None", np.ndarray, np.ndarray, "np.ndarray | None"], np.ndarray
]
"""``compute(out, x, w, b) -> y``: a transposed convolution, written into ``out`` when
it has y's shape and dtype."""


def _transpose_compute(spec: NodeSpec) -> TransposeCompute:
    """The transposed convolution of a ConvTranspose node, bound at compile time."""
    group = int(spec.attr("group", 1))
    auto_pad = auto_pad_attr(spec)
    strides_attr = spec.attr("strides")
    dilations_attr = spec.attr("dilations")
    pads_attr = spec.attr("pads")
    output_padding_attr = spec.attr("output_padding")
    output_shape_attr = spec.attr("output_shape")
    plans: dict[tuple[tuple[int, ...], tuple[int, ...]], _TransposePlan] = {}

    def plan_for(x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> _TransposePlan:
        rank = len(x_shape) - 2
        if rank < 1 or len(w_shape) != rank + 2:
            raise ValueError(
                f"ConvTranspose: input shape {x_shape} and weight shape {w_shape} mismatch"
            )
        if x_shape[1] != w_shape[0] or w_shape[0] % group:
            raise ValueError(
                f"ConvTranspose: input channels {x_shape[1]} and weight shape {w_shape} do "
                f"not fit group={group} (expected W of shape (C, M/group, ...))"
            )
        strides = per_axis(strides_attr, rank, 1, "strides")
        dilations = per_axis(dilations_attr, rank, 1, "dilations")
        out_pad = per_axis(output_padding_attr, rank, 0, "output_padding")
        begins, ends = explicit_pads(pads_attr, rank)
        # Old models sometimes give output_shape with the batch and channel dims.
        requested = list(output_shape_attr)[-rank:] if output_shape_attr else None
        if requested is not None and len(requested) != rank:
            raise ValueError(
                f"ConvTranspose: output_shape {output_shape_attr} does not fit input {x_shape}"
            )
        phase_lengths, offsets, crop_starts, out_shape = [], [], [], []
        for i, (size, k, s, d) in enumerate(
            zip(x_shape[2:], w_shape[2:], strides, dilations, strict=True)
        ):
            extent = (size - 1) * s + (k - 1) * d + 1
            natural = extent + out_pad[i]
            if requested is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                out = int(requested[i]) if requested is not None else size * s
                begin, _ = same_pad_split(natural - out, auto_pad)
            elif auto_pad == "VALID":
                begin, out = 0, natural
            else:
                begin, out = begins[i], natural - begins[i] - ends[i]
            if out < 1:
                raise ValueError(f"ConvTranspose: output size {out} along axis {i} < 1")
            # The buffer spans every tap's target and the output window.
            low, high = min(0, begin), max(extent, begin + out)
            phase_lengths.append(-(-(high - low) // s))
            offsets.append(-low)
            crop_starts.append(begin - low)
            out_shape.append(out)
        targets = []
        for tap in np.ndindex(*w_shape[2:]):
            where = [o + t * d for o, t, d in zip(offsets, tap, dilations, strict=True)]
            phases = tuple(q % s for q, s in zip(where, strides, strict=True))
            spans = tuple(
                slice(q // s, q // s + n)
                for q, s, n in zip(where, strides, x_shape[2:], strict=True)
            )
            targets.append((slice(None), slice(None), *phases, *spans))
        gathers = []
        for phases in np.ndindex(*strides):
            # Output j holds buffer position q = start + j: phase q % s, index q // s.
            firsts = [(r - c) % s for r, c, s in zip(phases, crop_starts, strides, strict=True)]
            if any(j >= n for j, n in zip(firsts, out_shape, strict=True)):
                continue
            dest = tuple(slice(j, None, s) for j, s in zip(firsts, strides, strict=True))
            source = tuple(
                slice((c + j) // s, (c + j) // s + len(range(j, n, s)))
                for c, j, s, n in zip(crop_starts, firsts, strides, out_shape, strict=True)
            )
            head = (slice(None), slice(None))
            gathers.append(((*head, *dest), (*head, *phases, *source)))
        tiled = all(
            k == s and d == 1 and out == size * s and start == 0
            for k, s, d, out, size, start in zip(
                w_shape[2:], strides, dilations, out_shape, x_shape[2:], crop_starts, strict=True
            )
        )
        return _TransposePlan(
            (*strides, *phase_lengths), tuple(targets), tuple(out_shape), tuple(gathers), tiled
        )

    def weight_columns(w: np.ndarray) -> np.ndarray:
        # (C, M/g, *k) -> (g, M/g * prod(k), C/g): one transposed matrix per group.
        per_group = w.reshape(group, w.shape[0] // group, -1).transpose(0, 2, 1)
        return np.ascontiguousarray(per_group, dtype=compute_dtype(w.dtype))

    w_const = spec.const(1)
    w_fixed = weight_columns(w_const) if w_const is not None else None

    def compute(
        out: np.ndarray | None, x: np.ndarray, w: np.ndarray, b: np.ndarray | None
    ) -> np.ndarray:
        plan = cached_plan(plans, (x.shape, w.shape), lambda: plan_for(x.shape, w.shape))
        wcols = w_fixed if w_fixed is not None else weight_columns(w)
        n, c = x.shape[:2]
        in_shape = x.shape[2:]
        kshape = w.shape[2:]
        m = w.shape[1] * group
        work = x.astype(compute_dtype(x.dtype), copy=False)
        if work.size == 0 or wcols.size == 0:
            cols = np.matmul(wcols, work.reshape(n, group, c // group, math.prod(in_shape)))
        else:  # split between the intra-op threads, into this thread's scratch buffer
            # (a fresh one of several megabytes faults its pages in: 1.4 of 1.7 ms for
            # 96 x 24 x 19200)
            positions = math.prod(in_shape)
            products = scratch("transpose-cols", (n, group, wcols.shape[1], positions), work.dtype)
            cols = stacked_matmul(wcols, work.reshape(n, group, c // group, positions), products)
        cols = cols.reshape((n, m, *kshape, *in_shape))
        shape = (n, m, *plan.out_shape)
        if out is None or out.shape != shape or out.dtype != work.dtype:
            out = np.empty(shape, dtype=work.dtype)  # (a planned buffer saves page faults)
        y = out
        if plan.tiled:
            # y[..., a * s + t, ...] = cols[..., t, ..., a, ...]: one strided copy per
            # tap (a transposed view of y as (n, m, *kernel, *input) is 4x slower: its
            # innermost runs are one stride long).
            for tap in np.ndindex(*kshape):
                pixels = tuple(slice(t, None, s) for t, s in zip(tap, kshape, strict=True))
                y[(slice(None), slice(None), *pixels)] = cols[(slice(None), slice(None), *tap)]
            if b is not None:  # (added on the way, into the strided places: 4x slower)
                y += b.reshape((-1,) + (1,) * len(in_shape))
            return y.astype(x.dtype, copy=False)
        buffer = scratch("transpose-sums", (n, m, *plan.phase_shape), work.dtype)
        buffer.fill(0)
        for tap, target in zip(np.ndindex(*kshape), plan.targets, strict=True):
            buffer[target] += cols[(slice(None), slice(None), *tap)]
        for dest, source in plan.gathers:
            y[dest] = buffer[source]
        if b is not None:
            y += b.reshape((-1,) + (1,) * len(in_shape))
        return y.astype(x.dtype, copy=False)

    return compute


@kernel("ConvTranspose", since=1)
def conv_transpose(spec: NodeSpec) -> Kernel:
    """ConvTranspose-1/11/22: N-D transposed convolution (columns matmul + col2im)."""
    compute = _transpose_compute(spec)
    return lambda x, w, b=None: (compute(None, x, w, b),)


@out_kernel(conv_transpose)
def conv_transpose_into(spec: NodeSpec) -> OutKernel:
    """ConvTranspose writing into a planned buffer."""
    compute = _transpose_compute(spec)
    return lambda out, x, w, b=None: (compute(out, x, w, b),)
