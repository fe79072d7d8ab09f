"""Convolutions with a one-row or one-column kernel, columns as shifted copies.

openWakeWord's speech embedding is a stack of 1x3 convolutions along the mel axis
(padded to keep its width) and 3x1 ones along time (unpadded), on maps of 74x32 down to
8x2. With stride 1 and the output as wide as the input, tap ``(i, j)`` of output pixel
``p = h * W + q`` reads input pixel ``p + i * W + j - begin``: the columns of one tap are
the flattened input shifted by a constant, one contiguous copy per tap, and only the
``|j - begin|`` entries of each row that fall into the padding are zeroed after it. No
padded copy of the input is made, the columns are exactly the output's pixels (no
dropped columns to crop) and the product writes the output.

The general paths copy 1x3 windows through a view whose runs are one output row long
(8 floats on 72x30x8: the columns took 37 us, as long as the product) or compute two
dropped columns per row and crop them (74x32: fill 11, columns 10, crop 9 us around a
53 us product).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aioinfer.devices.cpu.kernels.conv_flat import scratch_columns
from aioinfer.devices.cpu.kernels.matmul import gemm_2d


@dataclass(frozen=True)
class ShiftPlan:
    """Where each tap's columns come from in the flattened input."""

    out_shape: tuple[int, int]
    copies: tuple[tuple[int, int, int], ...]
    """Per tap (row-major kernel order): columns ``first:last`` are the input from
    ``first + shift`` on."""
    zeros: tuple[tuple[int, int], ...]
    """Per tap: the output columns ``q`` of every row that read the padding."""

    @property
    def taps(self) -> int:
        """Kernel taps: rows of columns per input channel."""
        return len(self.copies)

    @property
    def length(self) -> int:
        """Columns per channel and tap: the output's pixels."""
        return self.out_shape[0] * self.out_shape[1]


def shift_plan(
    in_shape: Sequence[int],
    kernel_shape: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    begins: Sequence[int],
    ends: Sequence[int],
    out_shape: Sequence[int],
) -> ShiftPlan | None:
    """The plan of a 2-D convolution (spatial shapes and attributes, the output's as Conv
    derives it) whose columns are shifted copies, or None: a kernel of one row or one
    column (not 1x1), stride and dilation 1, no padding along the rows and the output
    as wide as the input."""
    if len(kernel_shape) != 2 or len(in_shape) != 2:
        return None
    kh, kw = (int(k) for k in kernel_shape)
    hx, wx = (int(s) for s in in_shape)
    oh, ow = (int(s) for s in out_shape)
    if (kh != 1 and kw != 1) or kh == kw == 1:
        return None
    if any(s != 1 for s in strides) or any(d != 1 for d in dilations):
        return None
    if begins[0] or ends[0] or ow != wx:
        return None
    length, size = oh * wx, hx * wx
    copies, zeros = [], []
    for i in range(kh):
        for j in range(kw):
            across = j - begins[1]
            shift = i * wx + across
            copies.append((max(0, -shift), min(length, size - shift), shift))
            if across < 0:
                zeros.append((0, min(wx, -across)))
            else:
                zeros.append((max(0, wx - across), wx))
    return ShiftPlan((oh, ow), tuple(copies), tuple(zeros))


def fill_columns(plan: ShiftPlan, x: np.ndarray, cols: np.ndarray) -> None:
    """Write the columns ``(C, taps, length)`` of one image ``x`` ``(C, H * W)``."""
    oh, width = plan.out_shape
    for tap, ((first, last, shift), (left, right)) in enumerate(
        zip(plan.copies, plan.zeros, strict=True)
    ):
        if first < last:
            np.copyto(cols[:, tap, first:last], x[:, first + shift : last + shift])
        if left < right:
            cols[:, tap].reshape(-1, oh, width)[:, :, left:right] = 0


def shift_conv(plan: ShiftPlan, x: np.ndarray, wmat: np.ndarray, y: np.ndarray) -> None:
    """``y`` ``(N, M, *out)`` = the convolution of ``x`` ``(N, C, *in)`` with ``wmat``
    ``(M, C * taps)`` (taps in row-major kernel order), or ``(M, C * taps + 1)`` whose
    last column is the bias (the columns then get a row of ones)."""
    n, c = x.shape[:2]
    m = y.shape[1]
    inner = c * plan.taps
    rows = scratch_columns("cols", inner, plan.length, x.dtype, wmat.shape[1] == inner + 1)
    cols = rows[:inner].reshape(c, plan.taps, plan.length)
    for image in range(n):
        fill_columns(plan, x[image].reshape(c, -1), cols)
        gemm_2d(wmat, rows, y[image].reshape(m, plan.length))
