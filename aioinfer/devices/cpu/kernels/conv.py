"""Conv over 1-, 2- and 3-D (any rank) inputs, and the padding and window helpers it
shares with the pooling kernels and ConvTranspose (:mod:`.conv_transpose`).

:func:`conv_compute` binds a node at compile time; for each call's shapes its chooser
takes the first strategy that fits: Winograd F(2x2, 3x3) for 3x3 stride-1 ones with
many channels (:mod:`.conv_winograd`); blocks of output rows, each computed whole by one
thread, for large ones of one group (:mod:`.conv_rows`); columns as shifted copies of
the input for 1xk and kx1 kernels (:mod:`.conv_shift`); for other 1-D and 2-D ones,
columns copied from the phase-flattened padded input (:mod:`.conv_flat`), multiplied by
their channels' taps when depthwise; else im2col on the strided window view of the
once-padded input (none for 1x1 stride-1 unpadded kernels) and one BLAS matmul (batched
over groups). Weight layouts are made once when W is constant (:class:`_ConvWeights`).
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
    """The convolution of a Conv (or FusedConv) node, bound at compile time: a chooser
    that takes, for each call's shapes, the first strategy below that fits."""
    attrs = _ConvAttributes.of(spec)
    group = attrs.group
    weights = _ConvWeights(spec, group)
    plans: dict[tuple[tuple[int, ...], tuple[int, ...]], _ConvPlan] = {}
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
        small = local.small.get((x.shape, x.dtype.char)) if w is weights.const else None
        if small is not None:
            y = small(x, b, out)
            if epilogue is not None:
                epilogue.channels(0, y.shape[1], y[0])
            return y, epilogue is not None
        plan = cached_plan(plans, (x.shape, w.shape), lambda: _conv_plan(attrs, x.shape, w.shape))
        n, c = x.shape[:2]
        work = x.astype(compute_dtype(x.dtype), copy=False)
        if out is not None and (
            out.dtype != work.dtype or out.shape != (n, w.shape[0], *plan.out_shape)
        ):
            out = None  # another shape than when the memory plan was made
        wmat = weights.matrix(w)
        depthwise = group == c and w.shape[:2] == (c, 1)
        unwidened = work.dtype == x.dtype  # not float16 computed in float32
        if plan.winograd and n:
            return _winograd(weights, plan, x, work, w, b, out, epilogue)
        if plan.rows is not None and not depthwise and unwidened:
            return _in_rows(weights, plan, plan.rows, work, w, wmat, b, out, epilogue)
        if plan.shifted is not None and n and not depthwise and unwidened:
            return _shifted(weights, plan, plan.shifted, work, w, wmat, b, out, epilogue)
        if plan.flat is not None and n and depthwise:
            return _flat_depthwise(weights, plan, plan.flat, x, work, w, wmat, b, out, epilogue)
        if plan.flat is not None and n and not plan.small:
            return _flat_columns(weights, plan, plan.flat, x, work, w, wmat, b, out, epilogue)
        if depthwise and not plan.pointwise:
            return _depthwise(work, w, b, plan, out).astype(x.dtype, copy=False), False
        if (
            n == 1
            and group == 1
            and plan.small
            and w is weights.const
            and unwidened
            and wmat.size * plan.pixels < SPLIT_PRODUCT
        ):
            _keep_small(local, plan, x, wmat, weights.bias)
            return compute(x, w, b, out, epilogue)  # now through the kept SmallConv
        return _im2col_conv(local, weights, plan, x, work, w, wmat, b, out, epilogue)

    return compute


@dataclass(frozen=True)
class _ConvAttributes:
    """The attributes of a Conv node that its geometry depends on."""

    group: int
    auto_pad: str
    strides: Sequence[int] | None
    dilations: Sequence[int] | None
    pads: Sequence[int] | None
    kernel_shape: Sequence[int] | None

    @classmethod
    def of(cls, spec: NodeSpec) -> _ConvAttributes:
        return cls(
            int(spec.attr("group", 1)),
            auto_pad_attr(spec),
            spec.attr("strides"),
            spec.attr("dilations"),
            spec.attr("pads"),
            spec.attr("kernel_shape"),
        )


def _conv_plan(
    attrs: _ConvAttributes, x_shape: tuple[int, ...], w_shape: tuple[int, ...]
) -> _ConvPlan:
    """The geometry of a call with these shapes, and the strategies it fits.

    Raises:
        ValueError: shapes that do not fit each other or the attributes.
    """
    group = attrs.group
    rank = len(x_shape) - 2
    if rank < 1 or len(w_shape) != rank + 2:
        raise ValueError(f"Conv: input shape {x_shape} and weight shape {w_shape} mismatch")
    if x_shape[1] != w_shape[1] * group or w_shape[0] % group:
        raise ValueError(
            f"Conv: input channels {x_shape[1]} and weight shape {w_shape} do not fit "
            f"group={group} (expected W of shape (M, C/group, ...) with M % group == 0)"
        )
    kshape = tuple(w_shape[2:])
    if attrs.kernel_shape and tuple(attrs.kernel_shape) != kshape:
        raise ValueError(f"Conv: kernel_shape {attrs.kernel_shape} but W has shape {w_shape}")
    strides = per_axis(attrs.strides, rank, 1, "strides")
    dilations = per_axis(attrs.dilations, rank, 1, "dilations")
    begins, ends = (list(p) for p in explicit_pads(attrs.pads, rank))
    out = []
    for i, (size, k, s, d) in enumerate(zip(x_shape[2:], kshape, strides, dilations, strict=True)):
        extent = (k - 1) * d + 1
        if attrs.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out.append(-(-size // s))
            total = max(0, (out[-1] - 1) * s + extent - size)
            begins[i], ends[i] = same_pad_split(total, attrs.auto_pad)
        elif attrs.auto_pad == "VALID":
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
    winograd = winograd_fits(kshape, strides, dilations, group, x_shape[1], w_shape[0], tuple(out))
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


class _ConvWeights:
    """One Conv node's weights in the layouts its strategies read; when they are
    constant, each layout is made once, at the first call that reads it."""

    def __init__(self, spec: NodeSpec, group: int) -> None:
        self.group = group
        self.const = spec.const(1)
        """The constant weights, None when they are fed at run time."""
        self.bias = spec.const(2)
        """The constant bias, None when there is none or it is fed at run time."""
        self._fixed = None if self.const is None else self._weight_matrix(self.const)
        self._winograd: list[np.ndarray] = []
        """The constant weights transformed for Winograd."""
        self._ordered: dict[tuple[int, ...], np.ndarray] = {}
        """The constant weights with their taps in the order of a geometry's columns."""
        self._grouped: dict[int, tuple[FlatGeometry, DepthwiseOperands, DepthwiseOperands]]
        self._grouped = {}
        """Constant depthwise weights as :func:`.conv_flat.flat_depthwise` takes them, by
        the id of their geometry: without a bias, and with the constant bias (the entry
        holds the geometry, so a reused id is not mistaken; a geometry is made for one
        input shape, so for one batch size)."""
        self._prepared: dict[tuple[tuple[int, ...], bool], np.ndarray] = {}
        """The constant weights as :func:`.conv_rows.rows_conv` takes them, per tap
        order."""
        self._biased: dict[tuple[int, ...] | None, np.ndarray] = {}
        """Constant weight matrices with the constant bias as one more column, by the
        tap order of the matrix (None: the weight matrix's own, row-major)."""
        self._foldable = self.bias is not None and self.const is not None and group == 1

    def _weight_matrix(self, w: np.ndarray) -> np.ndarray:
        # (M, C/g, *k) -> (g, M/g, C/g * prod(k)): one matrix per group.
        group = self.group
        return np.ascontiguousarray(
            w.reshape(group, w.shape[0] // group, -1), dtype=compute_dtype(w.dtype)
        )

    def matrix(self, w: np.ndarray) -> np.ndarray:
        """``w`` as one matrix per group, ``(g, M/g, C/g * prod(k))``."""
        return self._fixed if self._fixed is not None else self._weight_matrix(w)

    def winograd(self, w: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """``w`` transformed for :func:`.conv_winograd.winograd_conv`."""
        if self.const is None:
            return winograd_weights(w, dtype)
        if not self._winograd:
            self._winograd.append(winograd_weights(self.const, dtype))
        return self._winograd[0]

    def tap_ordered(self, w: np.ndarray, wmat: np.ndarray, order: tuple[int, ...]) -> np.ndarray:
        """``wmat`` (or depthwise ``(C, taps)``) with the taps of ``order``."""
        if self.const is not None and order in self._ordered:
            return self._ordered[order]
        taps = math.prod(w.shape[2:])
        if self.group == w.shape[0] and w.shape[1] == 1:  # depthwise: (C, taps)
            matrix = wmat.reshape(self.group, taps)[:, order]
        else:
            shape = wmat.shape
            matrix = wmat.reshape(*shape[:2], -1, taps)[..., order].reshape(*shape[:2], -1)
        matrix = np.ascontiguousarray(matrix)
        if self.const is not None:
            cached_plan(self._ordered, order, lambda: matrix)
        return matrix

    def depthwise(
        self, w: np.ndarray, wmat: np.ndarray, b: np.ndarray | None, flat: FlatGeometry, images: int
    ) -> DepthwiseOperands:
        """The depthwise operands for ``flat`` (a bias fed at run time is added to the
        kept taps)."""
        if self.const is None:
            bare = depthwise_operands(flat, self.tap_ordered(w, wmat, flat.order), images)
            return with_depthwise_bias(bare, b)
        entry = self._grouped.get(id(flat))
        if entry is None or entry[0] is not flat:
            if len(self._grouped) >= PLAN_CACHE_SIZE:
                self._grouped.clear()
            bare = depthwise_operands(flat, self.tap_ordered(w, wmat, flat.order), images)
            entry = (flat, bare, with_depthwise_bias(bare, self.bias))
            self._grouped[id(flat)] = entry
        return entry[2] if b is self.bias else with_depthwise_bias(entry[1], b)

    def rows(self, w: np.ndarray, wmat: np.ndarray, plan: RowPlan) -> np.ndarray:
        """The weights of :func:`.conv_rows.rows_conv`."""
        if plan.geometry is None:
            return wmat[0]
        key = (plan.geometry.order, plan.implicit)
        if self.const is not None and key in self._prepared:
            return self._prepared[key]
        matrix = self.tap_ordered(w, wmat, plan.geometry.order)[0]
        if plan.implicit:  # (M, C * taps) -> (taps, M, C)
            taps = len(plan.geometry.order)
            matrix = np.ascontiguousarray(
                matrix.reshape(matrix.shape[0], -1, taps).transpose(2, 0, 1)
            )
        if self.const is not None:
            cached_plan(self._prepared, key, lambda: matrix)
        return matrix

    def with_bias(
        self, order: tuple[int, ...] | None, matrix: np.ndarray, b: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """``(matrix, b)``, or when the weights and the bias are constant ``matrix``
        ``(M, K)`` or ``(1, M, K)`` (its taps in ``order``) with ``b`` as column ``K``
        and None (kept: the same for every strategy whose taps are in that order), for
        columns with a row of ones after their ``K`` rows: the product then adds the
        bias, and no pass over the output does (64 3x3 filters over 16x55x55: 277
        instead of 304 us, 64 1x1 filters over 16x55x55 45 instead of 70 us with the
        copy of the input under a row of ones)."""
        if not self._foldable or b is None or b is not self.bias:
            return matrix, b
        found = self._biased.get(order)
        if found is None:
            rows = matrix.reshape(matrix.shape[-2:])
            column = b.astype(matrix.dtype, copy=False).reshape(-1, 1)
            found = np.ascontiguousarray(np.concatenate([rows, column], axis=1))
            cached_plan(self._biased, order, lambda: found)
        return found.reshape(*matrix.shape[:-1], found.shape[-1]), None


# The strategies the chooser of conv_compute takes, each for the calls its test there
# lets through: ``x`` the input, ``work`` it in the dtype of the products, ``wmat``
# the weights as one matrix per group, ``out`` the planned output or None.


def _output(plan: _ConvPlan, work: np.ndarray, w: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """``out``, else a new array of the output's shape."""
    if out is not None:
        return out
    return np.empty((work.shape[0], w.shape[0], *plan.out_shape), work.dtype)


def _winograd(
    weights: _ConvWeights,
    plan: _ConvPlan,
    x: np.ndarray,
    work: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    out: np.ndarray | None,
    epilogue: ConvEpilogue | None,
) -> tuple[np.ndarray, bool]:
    """3x3, stride 1, many channels: Winograd F(2x2, 3x3) (:mod:`.conv_winograd`)."""
    y = _output(plan, work, w, out)
    winograd_conv(work, weights.winograd(w, work.dtype), plan.begins, plan.out_shape, y)
    applied = _finish_channels(y, b, epilogue)
    return y.astype(x.dtype, copy=False), applied


def _in_rows(
    weights: _ConvWeights,
    plan: _ConvPlan,
    rows: RowPlan,
    work: np.ndarray,
    w: np.ndarray,
    wmat: np.ndarray,
    b: np.ndarray | None,
    out: np.ndarray | None,
    epilogue: ConvEpilogue | None,
) -> tuple[np.ndarray, bool]:
    """A large convolution of one group, in blocks of output rows (:mod:`.conv_rows`)."""
    y = _output(plan, work, w, out)
    matrix, bias = weights.rows(w, wmat, rows), b
    if rows.geometry is not None and not rows.implicit:
        # (a folded bias: the block columns get a row of ones)
        matrix, bias = weights.with_bias(rows.geometry.order, matrix, b)
    return y, rows_conv(rows, work, matrix, bias, y, epilogue)


def _shifted(
    weights: _ConvWeights,
    plan: _ConvPlan,
    shifted: ShiftPlan,
    work: np.ndarray,
    w: np.ndarray,
    wmat: np.ndarray,
    b: np.ndarray | None,
    out: np.ndarray | None,
    epilogue: ConvEpilogue | None,
) -> tuple[np.ndarray, bool]:
    """Columns as shifted copies of the input (:mod:`.conv_shift`)."""
    y = _output(plan, work, w, out)
    matrix, bias = weights.with_bias(None, wmat[0], b)
    shift_conv(shifted, work, matrix, y)
    return y, _finish_channels(y, bias, epilogue)


def _flat_depthwise(
    weights: _ConvWeights,
    plan: _ConvPlan,
    flat: FlatGeometry,
    x: np.ndarray,
    work: np.ndarray,
    w: np.ndarray,
    wmat: np.ndarray,
    b: np.ndarray | None,
    out: np.ndarray | None,
    epilogue: ConvEpilogue | None,
) -> tuple[np.ndarray, bool]:
    """A 1-D or 2-D depthwise convolution: blocks of phase-flattened columns times their
    channels' taps (:func:`.conv_flat.flat_depthwise`)."""
    y = _output(plan, work, w, out)
    then = None if epilogue is None else epilogue.channels
    operands = weights.depthwise(w, wmat, b, flat, work.shape[0])
    flat_depthwise(flat, work, operands, y, then)
    return y.astype(x.dtype, copy=False), epilogue is not None


def _flat_columns(
    weights: _ConvWeights,
    plan: _ConvPlan,
    flat: FlatGeometry,
    x: np.ndarray,
    work: np.ndarray,
    w: np.ndarray,
    wmat: np.ndarray,
    b: np.ndarray | None,
    out: np.ndarray | None,
    epilogue: ConvEpilogue | None,
) -> tuple[np.ndarray, bool]:
    """A 1-D or 2-D convolution with large columns, copied from the phase-flattened
    padded input (:func:`.conv_flat.flat_conv`)."""
    y = _output(plan, work, w, out)
    # (a folded bias: the columns get a row of ones)
    matrix, bias = weights.with_bias(flat.order, weights.tap_ordered(w, wmat, flat.order), b)
    flat_conv(flat, work, matrix, y)
    applied = _finish_channels(y, bias, epilogue)
    return y.astype(x.dtype, copy=False), applied


def _keep_small(
    local: _ConvThread, plan: _ConvPlan, x: np.ndarray, wmat: np.ndarray, bias: np.ndarray | None
) -> None:
    """Keep, on this thread, a :class:`.conv_small.SmallConv` for ``x``'s shape and dtype:
    the next calls take it before any plan."""
    kept = local.small
    if len(kept) >= PLAN_CACHE_SIZE:
        kept.clear()
    columns = _Columns(plan, x.shape, x.dtype)
    kept[x.shape, x.dtype.char] = SmallConv(
        columns.interior, columns.view, columns.cols, wmat[0], plan.out_shape, bias
    )


def _im2col_conv(
    local: _ConvThread,
    weights: _ConvWeights,
    plan: _ConvPlan,
    x: np.ndarray,
    work: np.ndarray,
    w: np.ndarray,
    wmat: np.ndarray,
    b: np.ndarray | None,
    out: np.ndarray | None,
    epilogue: ConvEpilogue | None,
) -> tuple[np.ndarray, bool]:
    """im2col (none for a pointwise kernel) and one product per image, or one per group."""
    n, c = x.shape[:2]
    group, pixels = weights.group, plan.pixels
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
        matrix, bias = weights.with_bias(None, wmat[0], b) if 2 * inner <= m else (wmat[0], b)
        if bias is None and b is not None:  # folded: the input under a row of ones
            ones = scratch_columns("ones", inner, pixels, work.dtype, True)
            for image in range(n):
                ones[:inner] = cols[image, 0]
                gemm_2d(matrix, ones, y[image, 0])
        else:
            for image in range(n):  # a large product is split between the threads
                gemm_2d(matrix, cols[image, 0], y[image, 0])
        b = bias
    else:
        stacked_matmul(wmat, cols, y)
    y = y.reshape((n, m, *plan.out_shape))
    applied = _finish_channels(y, b, epilogue)
    return y.astype(x.dtype, copy=False), applied


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
