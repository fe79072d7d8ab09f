"""ConvTranspose over 1-, 2- and 3-D (any rank) inputs: one matmul producing columns and
a col2im scatter-add that loops over kernel positions only (with a kernel as large as its
stride: one strided copy per tap). The padding helpers are Conv's (:mod:`.conv`).
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
    compute_dtype,
    explicit_pads,
    per_axis,
    same_pad_split,
)
from aioinfer.devices.cpu.kernels.conv_flat import scratch
from aioinfer.devices.cpu.kernels.matmul import stacked_matmul
from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, OutKernel, kernel, out_kernel


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
