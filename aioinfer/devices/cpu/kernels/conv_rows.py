"""Convolutions computed in blocks of output rows, each block whole on one thread.

A block of output rows (of pixels, for a 1x1 convolution) is computed start to finish
by the intra-op thread that claims it: its columns, its products, the bias, a fused
residual and activation, while the block is in the cache. Nothing runs on one thread
between the parts, and no pass over the whole output follows the product.

Before, a large convolution ran as three or four hand-offs: the columns of the whole
image (split by input channel, 9x the input for a 3x3 kernel, far beyond the cache), one
product split by pixels or filters, a transposition, then the bias and activation. On
PP-OCRv4's detector (96 -> 24 filters, 3x3, 120x160) the second thread was busy less
than half the time and the product ran at ~40 multiply-adds per ns, its columns read
from memory.

- 1x1 convolutions without padding: the input is the column matrix; a block of pixels
  is one product of the weights and a slice of it (strided: of a copy of its rows).
- Other 1-D and 2-D convolutions: a part of the blocks fills its own zero-padded copy of
  the phases of the input rows it reads (see :mod:`.conv_flat`), where every kernel tap's
  columns are one contiguous slice per channel. With many input channels each tap is
  one product of its ``(M, C)`` weights and that slice, read in place, summed over the
  taps ("implicit GEMM", no column copy: the detector's convolution above takes 6.0-6.3
  instead of 10.3-11 ms of one thread, 18.7 ms on two threads of a loaded machine before,
  6.7 ms after); with few, the block's columns are copied into a buffer that
  stays in the cache and multiplied in one product.

Block bounds depend only on the convolution's shapes, so the result is bit for bit the
same whatever the number of threads (every block is the same products on the same
values).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided

from aioinfer.devices.cpu.kernels.conv_flat import FlatGeometry, scratch, scratch_columns
from aioinfer.devices.cpu.kernels.parallel import MIN_PARALLEL_MACS, run_parallel

InPlace = Callable[[np.ndarray], object]
"""An activation applied in place to a float array (what it returns is ignored)."""

BLOCK_ELEMENTS = 1 << 19
"""Elements of a block's source (its columns of one tap) and result together: both stay
in the cache. 32 1x1 filters over 16x400x304 take 2.1 instead of 3.3 ms of one thread
in blocks of this size, products written straight into the output 3.1-3.3 ms (their
bias and activation passes then miss the cache)."""
IMPLICIT_CHANNELS = 32
"""Input channels from which each tap is multiplied in place rather than copied."""
MIN_BLOCKS = 8
"""Blocks a large image is cut into at least: enough for two threads to share evenly."""
MAX_FILTERS = 96
"""Filters from which one product over the whole image, split by filters, is faster."""
ONE_THREAD_FILTERS = 48
ONE_THREAD_POINTWISE_CHANNELS = 32
"""On one thread, more filters than this (or, 1x1, more input channels) run faster as
one product over the image (BLAS's own blocking, no per-block numpy calls): 64 3x3
filters over 16x55x55 take 0.37 instead of 0.45 ms, 48 1x1 ones over 48x120x160 0.58
instead of 0.67 ms. On two threads the blocks are as fast or faster (no pass on one
thread; 64 1x1 filters over 32x200x152 take 1.0 instead of 2.0 ms on a loaded machine)."""
FLAT_COLUMNS = 1_950_000
"""On two or more threads, a convolution with a kernel larger than 1x1 whose columns of
one image (input channels x taps x output pixels) are at most this many (7.8 MB of
float32) runs faster as one product over the whole image (its columns copied once, the
product split between the threads by :func:`.matmul.gemm_2d`); beyond, blocks of rows,
whose columns stay in the cache, win. The bound lies between the largest columns
measured faster as one product (1.84M) and the smallest measured faster in blocks
(2.07M). Medians of alternating processes, Conv+Relu on two threads of a 2-core Zen 5, blocks vs one
product: ResNet's 64 -> 64 3x3 on 56x56 (1.8M) 1.12 vs 0.92 ms, its 7x7 stem 3 -> 64 /2
on 224x224 (1.8M) 1.35 vs 1.12 ms, 48 -> 48 on 52x52 (1.2M) 0.72 vs 0.54 ms,
SqueezeNet's 16 -> 64 on 55x55 (0.4M) 0.36 vs 0.33 ms; but 64 -> 64 on 80x80 (3.7M)
1.84 vs 2.02 ms, 3 -> 16 /2 on 480x640 (2.1M) 1.39 vs 1.81 ms, 96 -> 24 on 120x160
(16.6M) 3.4 vs 7.2 ms. For one image only: a batch keeps the blocks, which span its
images (8 images of 16 -> 64 on 55x55: 2.60 ms in blocks, 2.97 ms as one product per
image; 4 images of 48 -> 48 on 52x52 went the other way, 3.03 vs 2.55 ms)."""
MIN_BLOCK_WORK = 1 << 23
"""Multiply-adds a block has at least: a block costs ~20 numpy calls (~30 us)."""
PARTS_PER_THREAD = 4
"""Parts of the blocks per thread: a thread the OS does not run for a while holds the
call up by at most the part it has begun, the others take the rest."""


@dataclass(frozen=True)
class RowPlan:
    """How one convolution's output is cut into blocks of rows."""

    geometry: FlatGeometry | None
    """The phase-flattened windows; None for a 1x1 convolution without padding."""
    strides: tuple[int, ...]
    out_shape: tuple[int, ...]
    rows: int
    """Units the output of one image is cut into: rows, or pixels (1x1, stride 1)."""
    block_rows: int
    """Rows (pixels) per block."""
    taps: tuple[tuple[int, int], ...]
    """Per tap (in ``geometry.order``): its phase and its offset into the phase."""
    reach: int
    """Phase rows a block of output rows reads past its own (the last one partly)."""
    implicit: bool
    """Each tap multiplied in place (else the columns are copied)."""


def row_plan(
    geometry: FlatGeometry | None,
    strides: tuple[int, ...],
    out_shape: tuple[int, ...],
    batch: int,
    channels: int,
    filters: int,
    threads: int,
) -> RowPlan | None:
    """The plan of a convolution with one group (``geometry`` for a 1-D or 2-D one, None
    for a 1x1 one without padding) of ``batch`` images run on ``threads`` intra-op
    threads, or None when it runs better as one product (many filters, columns that fit
    the cache on two threads (:data:`FLAT_COLUMNS`), too little work for two blocks; on
    one thread, see :data:`ONE_THREAD_FILTERS`)."""
    if filters >= MAX_FILTERS:
        return None
    if (
        threads > 1
        and batch == 1
        and geometry is not None
        and channels * len(geometry.order) * math.prod(out_shape) <= FLAT_COLUMNS
    ):
        return None
    if threads <= 1 and (
        filters > ONE_THREAD_FILTERS
        or (geometry is None and channels > ONE_THREAD_POINTWISE_CHANNELS)
    ):
        return None
    if geometry is None:
        taps: tuple[tuple[int, int], ...] = ((0, 0),)
        reach = 0
        width = out_shape[-1] if any(s != 1 for s in strides) else 1
        implicit = True
    else:
        sw = geometry.strides[1]
        wq = geometry.grid[1]
        offsets = []
        for group in geometry.groups:
            for u in range(group.rows):
                for v in range(group.cols):
                    offset = group.start + u * group.row_step + v * group.col_step
                    offsets.append((group.phase_row * sw + group.phase_col, offset))
        taps = tuple(offsets)
        reach = max(offset // wq for _, offset in taps) + 1
        width = wq
        implicit = channels >= IMPLICIT_CHANNELS
    per_row = width * ((channels if implicit else channels * len(taps)) + filters)
    rows = out_shape[0] if len(out_shape) == 2 and width > 1 else math.prod(out_shape)
    least = max(
        -(-MIN_BLOCK_WORK // (width * channels * len(taps) * filters)), -(-rows // MIN_BLOCKS)
    )
    block_rows = max(1, min(BLOCK_ELEMENTS // per_row, least))
    per_image = math.prod(out_shape) * channels * len(taps) * filters
    # Blocks never span images: images smaller than a block would make blocks of less
    # work than a block's numpy calls pay for (16 images of the bundled CNN's 32 3x3
    # filters over 16x16x16, 1.2M multiply-adds each: 1.18 instead of 0.83 ms).
    if per_image < MIN_BLOCK_WORK:
        return None
    if batch * -(-rows // block_rows) < 2 or batch * per_image < 2 * MIN_BLOCK_WORK:
        return None
    return RowPlan(geometry, strides, out_shape, rows, block_rows, taps, reach, implicit)


class ConvEpilogue:
    """A fused convolution's residual ``z`` (of its output's batch and channels) and
    activation, applied in place to the blocks of the output a kernel computes.
    ``bounds``: the activation is a clip to these bounds (Relu, Clip), which
    :func:`rows_conv` applies while it copies a block into place."""

    def __init__(
        self,
        residual: np.ndarray | None,
        activation: InPlace | None,
        bounds: tuple[float, float] | None = None,
    ) -> None:
        self.residual = residual
        self.activation = activation
        self.bounds = bounds

    def channels(self, first: int, last: int, block: np.ndarray) -> None:
        """Apply to channels ``first:last`` of the flattened batch and channels, ``block``
        ``(last - first, *out)`` (see :data:`.conv_flat.Epilogue`).

        Raises:
            ValueError: the residual does not broadcast to the block.
        """
        z = self.residual
        if z is not None:
            part = z.reshape(-1, *z.shape[2:])[first:last]
            if part.ndim < block.ndim:  # a 1-D convolution's blocks have one row
                part = part.reshape(
                    part.shape[0], *(1,) * (block.ndim - part.ndim), *part.shape[1:]
                )
            if np.broadcast_shapes(part.shape, block.shape) != block.shape:
                raise ValueError(
                    f"FusedConv: Z of shape {z.shape} does not broadcast to the output's "
                    f"channels {block.shape}"
                )
            block += part
        if self.activation is not None:
            self.activation(block)

    def pixel_residual(self, out_shape: tuple[int, ...]) -> np.ndarray | bool | None:
        """The residual as ``(N, M, pixels)`` (or ``(N, M, 1)``), None without one, False
        when it does not have the output's spatial shape (nor ones)."""
        z = self.residual
        if z is None:
            return None
        if z.shape[2:] == out_shape:
            return z.reshape(*z.shape[:2], -1)
        if all(size == 1 for size in z.shape[2:]):
            return z.reshape(*z.shape[:2], 1)
        return False


def rows_conv(
    plan: RowPlan,
    x: np.ndarray,
    weights: np.ndarray,
    bias: np.ndarray | None,
    y: np.ndarray,
    epilogue: ConvEpilogue | None,
) -> bool:
    """``y`` ``(N, M, *out)`` = the convolution of ``x`` ``(N, C, *in)`` plus ``bias``,
    then ``epilogue`` when its residual fits blocks of pixels; returns whether it was
    applied. ``weights``: ``(taps, M, C)`` when ``plan.implicit``, else ``(M, C * taps)``
    (channel-major, taps in ``geometry.order``), or ``(M, C * taps + 1)`` with the bias
    as the last column (the block columns then get a row of ones; ``bias`` None)."""
    n, c = x.shape[:2]
    m = y.shape[1]
    residual = None if epilogue is None else epilogue.pixel_residual(plan.out_shape)
    applied = epilogue is not None and residual is not False
    act = epilogue.activation if applied and epilogue is not None else None
    bounds = epilogue.bounds if applied and epilogue is not None else None
    z = residual if isinstance(residual, np.ndarray) else None
    pixels = math.prod(plan.out_shape)
    outputs = y.reshape(n, m, pixels)
    b = None if bias is None else bias.astype(y.dtype, copy=False).reshape(m, 1)
    rows = plan.rows
    per_image = -(-rows // plan.block_rows)
    span = pixels // rows  # output pixels per row

    def finish(image: int, first: int, last: int, full: np.ndarray) -> None:
        """Bias, residual and activation on the block ``full`` ``(M, rows, width)``
        (contiguous and in the cache: numpy's passes over it take half the time of those
        over the block's strided place in ``y``), then its first ``span`` columns of each
        row into ``y``."""
        rows = full.shape[1]
        if b is not None:
            full += b.reshape(m, 1, 1)
        if z is not None:
            whole = z.shape[2] > 1
            part = z[image, :, first:last] if whole else z[image]
            full[:, :, :span] += part.reshape(m, rows, span) if whole else part.reshape(m, 1, 1)
        placed = outputs[image, :, first:last].reshape(m, rows, span)
        kept = full[:, :, :span] if full.shape[2] != span else full
        if bounds is not None and kept is full:  # the activation and the copy in one pass
            np.clip(kept, *bounds, out=placed)
            return
        if bounds is not None:
            # Rows cropped: the clip in place over the contiguous block, then the copy
            # (one clip over the short rows of both took 1.45x as long: 64 x 44 rows of
            # 111 of 112 columns, 84 instead of 58 us).
            np.clip(full, *bounds, out=full)
            np.copyto(placed, kept)
            return
        if act is not None:
            act(full)
        np.copyto(placed, kept)

    if plan.geometry is None:
        inputs = x.reshape(n, c, -1)
        strided = any(s != 1 for s in plan.strides)

        def part(start: int, stop: int) -> None:
            for index in range(start, stop):
                image, number = divmod(index, per_image)
                r0 = number * plan.block_rows
                r1 = min(rows, r0 + plan.block_rows)
                full = scratch("rows-full", (m, (r1 - r0) * span), y.dtype)
                if strided:
                    sh, sw = plan.strides
                    source = scratch("rows-cols", (c, r1 - r0, span), x.dtype)
                    np.copyto(source, x[image, :, r0 * sh : r1 * sh : sh, ::sw])
                    np.matmul(weights, source.reshape(c, -1), out=full)
                else:
                    np.matmul(weights, inputs[image, :, r0:r1], out=full)
                finish(image, r0 * span, r1 * span, full.reshape(m, r1 - r0, span))

    else:
        geometry = plan.geometry
        wq = geometry.grid[1]
        taps = plan.taps
        phases = geometry.strides[0] * geometry.strides[1]

        def part(start: int, stop: int) -> None:
            index = start
            while index < stop:
                image, number = divmod(index, per_image)
                # This part's rows of this image, and a copy of the phase rows they read.
                count = min(stop - index, per_image - number)
                first = number * plan.block_rows
                last = min(rows, (number + count) * plan.block_rows)
                height = last - first + plan.reach
                slab = scratch("rows-slab", (phases, c, height * wq), x.dtype)
                _fill(geometry, x[image], first, height, slab)
                views = [] if plan.implicit else _column_views(geometry, slab, height * wq)
                for r0 in range(first, last, plan.block_rows):
                    r1 = min(last, r0 + plan.block_rows)
                    length = (r1 - r0) * wq
                    full = scratch("rows-full", (m, length), y.dtype)
                    base = (r0 - first) * wq
                    if plan.implicit:
                        term = scratch("rows-term", (m, length), y.dtype)
                        for tap, (phase, offset) in enumerate(taps):
                            source = slab[phase, :, base + offset : base + offset + length]
                            if tap == 0:
                                np.matmul(weights[0], source, out=full)
                            else:
                                np.matmul(weights[tap], source, out=term)
                                full += term
                    else:
                        inner = c * len(taps)
                        whole = scratch_columns(  # (the bias: a row of ones)
                            "rows-cols", inner, length, x.dtype, weights.shape[1] > inner
                        )
                        cols = whole[: c * len(taps)].reshape(c, len(taps), length)
                        done = 0
                        for view in views:
                            group_taps = view.shape[1] * view.shape[2]
                            into = cols[:, done : done + group_taps]
                            np.copyto(
                                into.reshape(*view.shape[:3], length),
                                view[..., base : base + length],
                            )
                            done += group_taps
                        np.matmul(weights, whole, out=full)
                    finish(image, r0 * span, r1 * span, full.reshape(m, r1 - r0, wq))
                index += count

    total = n * per_image
    work = n * m * pixels * c * len(plan.taps)
    run_parallel(part, total, work=work, parts_per_thread=PARTS_PER_THREAD, least=MIN_PARALLEL_MACS)
    return applied


def _column_views(geometry: FlatGeometry, slab: np.ndarray, size: int) -> list[np.ndarray]:
    """Per tap group, the read-only view ``(C, rows, cols, run)`` of the columns of its
    taps in ``slab`` (see :func:`_fill`): tap ``(u, v)``'s column ``i`` of channel ``c`` at
    ``[c, u, v, i]``, ``run`` as long as the slab allows."""
    item = slab.itemsize
    sw = geometry.strides[1]
    views = []
    for group in geometry.groups:
        source = slab[group.phase_row * sw + group.phase_col, :, group.start :]
        last = (group.rows - 1) * group.row_step + (group.cols - 1) * group.col_step
        views.append(
            as_strided(
                source,
                (source.shape[0], group.rows, group.cols, size - group.start - last),
                (source.strides[0], group.row_step * item, group.col_step * item, item),
                writeable=False,
            )
        )
    return views


def _fill(
    geometry: FlatGeometry, image: np.ndarray, first: int, height: int, slab: np.ndarray
) -> None:
    """``slab`` ``(phases, C, height * wq)`` = rows ``first:first + height`` of the
    zero-padded phases of ``image`` ``(C, hx, wx)`` (1-D: one row)."""
    sh, sw = geometry.strides
    bh, bw = geometry.begins
    hx, wx = geometry.in_shape
    wq = geometry.grid[1]
    c = image.shape[0]
    planes = image.reshape(c, hx, wx)
    for a in range(sh):
        # Phase row p holds input row p * sh + a - bh.
        top = max(first, -(-(bh - a) // sh))
        bottom = min(first + height, (hx - 1 + bh - a) // sh + 1)
        for b in range(sw):
            grid = slab[a * sw + b].reshape(c, height, wq)
            left = max(0, -(-(bw - b) // sw))
            right = min(wq, (wx - 1 + bw - b) // sw + 1)
            if bottom <= top or right <= left:
                grid.fill(0)
                continue
            grid[:, : top - first] = 0
            grid[:, bottom - first :] = 0
            inner = grid[:, top - first : bottom - first]
            inner[:, :, :left] = 0
            inner[:, :, right:] = 0
            row0, col0 = top * sh + a - bh, left * sw + b - bw
            inner[:, :, left:right] = planes[
                :,
                row0 : row0 + (bottom - top - 1) * sh + 1 : sh,
                col0 : col0 + (right - left - 1) * sw + 1 : sw,
            ]
