"""1-D and 2-D convolutions on phase-flattened windows.

The padded input is split into its ``stride x stride`` phases (one phase for stride 1),
each stored per channel as a flat run of rows of a common width ``wq``. Kernel tap
``(i, j)`` of output pixel ``(r, q)`` reads phase ``(i*dh % sh, j*dw % sw)`` at row
``r + i*dh // sh``, column ``q + j*dw // sw``: over all output pixels, one contiguous
slice of that phase shifted by a constant. The columns of a tap are therefore one
contiguous run of ``oh * wq`` elements (the ``wq - ow`` entries past each output row are
computed and dropped), and the taps of one phase form a regular grid of such runs: one
strided view copies them all. Copying the columns of a 3x3 convolution on 64x56x56 this
way takes a quarter of the time of the 6-D window view whose inner runs are one output
row long (an eighth on 7x7 maps).

Taps that read only padding for every output pixel (the outer rows of a 5x5 kernel on a
2-pixel-high map) are left out: their products are zeros.

- General convolutions: the columns of one image, ``(C * taps, oh * wq)``, times the
  weight matrix (BLAS, split between the intra-op threads), then the ``ow`` valid
  columns of each output row are kept.
- Depthwise convolutions: per block of channels whose columns fit the L2 cache (per
  piece of whole output rows of a channel whose columns do not), the columns
  ``(block, taps, oh * wq)`` and a stack of vector-matrix products (BLAS) with
  the channels' taps; the blocks are split between the intra-op threads. PP-LCNet's 5x5
  depthwise convolution on 256x14x14 takes 0.25-0.39 instead of 0.53-0.75 ms of one
  thread (one multiply and one add per tap over the whole map before).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from numpy.lib.stride_tricks import as_strided

from aioinfer.devices.cpu.kernels.matmul import (
    ROW_ALIGN,
    SPLIT_PRODUCT,
    columns_split_exactly,
    gemm_2d,
    stacked_matmul,
)
from aioinfer.devices.cpu.kernels.parallel import (
    MIN_PARALLEL_MACS,
    intra_op_threads,
    run_parallel,
)


class _Arena(threading.local):
    """This thread's scratch buffers (each thread gets its own empty ones)."""

    def __init__(self) -> None:
        self.buffers: dict[str, np.ndarray] = {}
        """Byte buffers by slot (grown on demand)."""


_arena = _Arena()


def scratch(slot: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array of ``shape`` in this thread's scratch buffer ``slot`` (valid
    until the next use of that slot on this thread). Fresh arrays of several megabytes
    would fault in new pages on every call."""
    nbytes = math.prod(shape) * dtype.itemsize
    buffers = _arena.buffers
    buffer = buffers.get(slot)
    if buffer is None or buffer.nbytes < nbytes:
        buffer = buffers[slot] = np.empty(nbytes, np.uint8)
    return buffer[:nbytes].view(dtype).reshape(shape)


def scratch_columns(slot: str, rows: int, width: int, dtype: np.dtype, ones: bool) -> np.ndarray:
    """:func:`scratch` for ``rows`` columns of ``width``, under a row of ones when ``ones``
    (for weights whose last column is the bias): ``(rows + ones, width)``."""
    buffer = scratch(slot, (rows + ones, width), dtype)
    if ones:
        buffer[rows] = 1
    return buffer


def _slots(names: tuple[str, ...]) -> tuple[np.ndarray | None, ...]:
    """This thread's scratch buffers of ``names`` (None for a slot not made yet)."""
    buffers = _arena.buffers
    return tuple(buffers.get(name) for name in names)


def _same(first: tuple[object, ...], second: tuple[object, ...]) -> bool:
    return all(a is b for a, b in zip(first, second, strict=True))


_Made = TypeVar("_Made")


def _kept_on_scratch(
    store: dict[Any, tuple[FlatGeometry, Any, tuple[object, ...]]],
    key: object,
    geometry: FlatGeometry,
    names: tuple[str, ...],
    make: Callable[[], _Made],
) -> _Made:
    """``make()``, views of this thread's scratch slots ``names``, kept in ``store``
    under ``key`` until one of those slots is replaced (grown). Then every entry whose
    views are of scratch buffers other than the current ones (kept buffers have none)
    is dropped: a grown slot's old buffer is freed even if the kernel of those views
    never runs again. The entry holds ``geometry``, so that a key made of a reused id is
    not mistaken."""
    entry = store.get(key)
    current = _slots(names)
    if entry is None or entry[0] is not geometry or not _same(entry[2], current):
        for old in [k for k, e in store.items() if e[2] and not _same(e[2], current)]:
            del store[old]
        if len(store) >= KEPT_GEOMETRIES:
            store.clear()
        made = make()
        entry = store[key] = (geometry, made, _slots(names))
    return entry[1]


@dataclass(frozen=True)
class TapGroup:
    """Taps of one phase whose offsets form a regular grid: ``rows x cols`` taps, tap
    ``(u, v)`` of the grid at flat offset ``start + u * row_step + v * col_step`` of
    phase ``(phase_row, phase_col)``."""

    phase_row: int
    phase_col: int
    start: int
    rows: int
    row_step: int
    cols: int
    col_step: int


@dataclass(frozen=True)
class FlatGeometry:
    """Where the windows of a 1-D (as one row) or 2-D convolution lie in the phases."""

    strides: tuple[int, int]
    begins: tuple[int, int]
    in_shape: tuple[int, int]
    grid: tuple[int, int]
    """Rows and width ``wq`` of each phase (one more row is allocated: slack for the
    dropped columns of the last output row)."""
    out_shape: tuple[int, int]
    groups: tuple[TapGroup, ...]
    order: tuple[int, ...]
    """The taps used (indices into the row-major kernel), in the order of the columns."""
    exact: bool
    """Columns only for the output pixels (``oh * ow`` per tap, copied in runs of ``ow``)
    rather than ``oh * wq`` in one run: for products so large that the dropped columns
    cost the matmul more than the short runs cost the copy."""

    @property
    def length(self) -> int:
        """Columns per channel and tap: ``oh * ow`` when exact, else ``oh * wq``."""
        return self.out_shape[0] * (self.out_shape[1] if self.exact else self.grid[1])

    @property
    def phase_size(self) -> int:
        """Elements per channel and phase, slack row included."""
        return (self.grid[0] + 1) * self.grid[1]


def _used(size: int, begin: int, out: int, stride: int, kernel: int, dilation: int) -> list[int]:
    """Kernel positions along one axis that read the input (not only padding) for some
    output position."""
    return [
        k
        for k in range(kernel)
        if any(0 <= o * stride + k * dilation - begin < size for o in range(out))
    ]


def _runs(values: list[int]) -> list[list[int]]:
    """``values`` (ascending) split into maximal runs with a constant step."""
    runs: list[list[int]] = []
    for value in values:
        run = runs[-1] if runs else None
        if run is not None and (len(run) == 1 or value - run[-1] == run[1] - run[0]):
            run.append(value)
        else:
            runs.append([value])
    return runs


EXACT_RUN_COST = 100
"""What copying the exact columns costs per run of ``ow`` elements, in copies of one
element within a long run (see :func:`flat_geometry`)."""


def flat_geometry(
    in_shape: Sequence[int],
    kernel_shape: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    begins: Sequence[int],
    ends: Sequence[int],
    out_shape: Sequence[int],
    filters: int = 1,
    channels: int = 1,
) -> FlatGeometry:
    """The geometry of a 1-D or 2-D convolution (spatial shapes and attributes; 1-D is
    lifted to one row) with ``filters`` output and ``channels`` input channels per group
    (1 and 1: depthwise)."""
    lift = (1,) * (2 - len(kernel_shape))
    zero = (0,) * (2 - len(kernel_shape))
    hx, wx = lift + tuple(in_shape)
    kh, kw = lift + tuple(kernel_shape)
    sh, sw = lift + tuple(strides)
    dh, dw = lift + tuple(dilations)
    bh, bw = zero + tuple(begins)
    eh, ew = zero + tuple(ends)
    oh, ow = lift + tuple(out_shape)
    hq, wq = -(-(hx + bh + eh) // sh), -(-(wx + bw + ew) // sw)
    rows = _used(hx, bh, oh, sh, kh, dh)
    cols = _used(wx, bw, ow, sw, kw, dw)
    groups: list[TapGroup] = []
    order: list[int] = []
    for a in range(sh):
        row_offsets = [i * dh // sh for i in rows if i * dh % sh == a]
        for b in range(sw):
            col_offsets = [j * dw // sw for j in cols if j * dw % sw == b]
            for row_run in _runs(row_offsets):
                for col_run in _runs(col_offsets):
                    row_step = row_run[1] - row_run[0] if len(row_run) > 1 else 0
                    col_step = col_run[1] - col_run[0] if len(col_run) > 1 else 0
                    groups.append(
                        TapGroup(
                            a,
                            b,
                            row_run[0] * wq + col_run[0],
                            len(row_run),
                            row_step * wq,
                            len(col_run),
                            col_step,
                        )
                    )
                    # Tap (i, j) with i*dh = a + sh*offset: recover i and j.
                    order += [
                        (a + sh * ro) // dh * kw + (b + sw * co) // dw
                        for ro in row_run
                        for co in col_run
                    ]
    # Costs per output row, in copies of one element within a long run (measured with
    # OpenBLAS on AVX-512 and numpy 2.4): the matmul spends about 0.3 of them per
    # multiply-add on the dropped columns, and dropping them (the crop) about 2 per kept
    # element; exact columns cost about 100 per run of ow elements instead (200 before:
    # SqueezeNet's 3x3 expands over 13x13 and 27x27, at 0.5-0.8 of that bound, took
    # 0.90-0.96x the time with exact columns).
    inner = channels * len(order)
    # Depthwise convolutions (one filter) always take the long runs.
    dropped = 0.3 * filters * inner * (wq - ow) + 2 * filters * ow
    exact = filters > 1 and ow < wq and dropped > EXACT_RUN_COST * inner
    return FlatGeometry(
        (sh, sw), (bh, bw), (hx, wx), (hq, wq), (oh, ow), tuple(groups), tuple(order), exact
    )


def fill_phases(geometry: FlatGeometry, images: np.ndarray, phases: np.ndarray) -> None:
    """Write ``images`` ``(B, hx, wx)`` into ``phases`` ``(sh, sw, B, phase_size)``, whose
    other entries (the padding) are zero."""
    sh, sw = geometry.strides
    bh, bw = geometry.begins
    hq, wq = geometry.grid
    hx, wx = geometry.in_shape
    count = images.shape[0]
    for a in range(sh):
        first_row = (a - bh) % sh
        if first_row >= hx:
            continue
        for b in range(sw):
            first_col = (b - bw) % sw
            if first_col >= wx:
                continue
            part = images[:, first_row::sh, first_col::sw]
            top, left = (first_row + bh) // sh, (first_col + bw) // sw
            grid = phases[a, b, :, : hq * wq].reshape(count, hq, wq)
            grid[:, top : top + part.shape[1], left : left + part.shape[2]] = part


def column_views(geometry: FlatGeometry, phases: np.ndarray) -> list[np.ndarray]:
    """Per tap group, the read-only view ``(B, rows, cols, *runs)`` of its columns in
    ``phases`` (see :func:`fill_phases`); ``runs`` is ``(oh, ow)`` when exact, else
    ``(length,)``. Made once per call (``as_strided`` costs microseconds), sliced per
    block of channels."""
    item = phases.itemsize
    oh, ow = geometry.out_shape
    runs = (oh, ow) if geometry.exact else (geometry.length,)
    run_strides = (geometry.grid[1] * item, item) if geometry.exact else (item,)
    views = []
    for group in geometry.groups:
        source = phases[group.phase_row, group.phase_col, :, group.start :]
        views.append(
            as_strided(
                source,
                (source.shape[0], group.rows, group.cols, *runs),
                (source.strides[0], group.row_step * item, group.col_step * item, *run_strides),
                writeable=False,
            )
        )
    return views


def copy_columns(
    views: list[np.ndarray],
    first: int,
    last: int,
    cols: np.ndarray,
    columns: slice = slice(None),
) -> None:
    """The columns ``(last - first, taps, length)`` of channels ``first:last`` (of
    :func:`column_views`), or the part ``columns`` of their long runs, into ``cols``."""
    done = 0
    for view in views:
        taps = view.shape[1] * view.shape[2]
        source = view[first:last, ..., columns]
        np.copyto(cols[:, done : done + taps].reshape(source.shape), source)
        done += taps


KEPT_PHASES_BYTES = 1 << 18
"""Phases up to this size are kept per geometry, batch and thread, with their column
views: their padding is zeroed once and a call only copies the input into them (the
zeroing and the ``as_strided`` views cost small convolutions more than the copies)."""
KEPT_GEOMETRIES = 64


class _Kept(threading.local):
    """This thread's kept buffers and views."""

    def __init__(self) -> None:
        self.phases: dict[
            tuple[int, int, np.dtype, ViewsOf], tuple[FlatGeometry, np.ndarray, list[np.ndarray]]
        ] = {}
        """Small phases and their views by (geometry id, batch, dtype, views)."""
        self.scratch_views: dict[Any, tuple[FlatGeometry, Any, tuple[object, ...]]] = {}
        """Views of larger phases in the scratch buffers (:func:`_kept_on_scratch`)."""
        self.depthwise: dict[
            tuple[int, np.dtype, bool],
            tuple[FlatGeometry, _DepthwiseBuffers, tuple[object, ...]],
        ] = {}
        """:class:`_DepthwiseBuffers` by (geometry id, dtype, kept)."""


_kept = _Kept()


ViewsOf = Callable[[FlatGeometry, np.ndarray], list[np.ndarray]]
"""Views of the phases of a geometry (:func:`column_views`, :func:`_row_views`)."""


def _phase_views(geometry: FlatGeometry, images: np.ndarray, views_of: ViewsOf) -> list[np.ndarray]:
    """``views_of(geometry, phases)`` of the zero-padded phases of ``images``
    ``(B, hx, wx)``: kept ones for small inputs, else in this thread's scratch."""
    sh, sw = geometry.strides
    shape = (sh, sw, images.shape[0], geometry.phase_size)
    small = math.prod(shape) * images.itemsize <= KEPT_PHASES_BYTES
    if small:
        # Keyed by the geometry's id (hashing its fields costs microseconds); the entry
        # holds the geometry, so that an id reused by another one is not mistaken.
        kept = _kept.phases
        key = (id(geometry), images.shape[0], images.dtype, views_of)
        entry = kept.get(key)
        if entry is None or entry[0] is not geometry:
            if len(kept) >= KEPT_GEOMETRIES:
                kept.clear()
            phases = np.zeros(shape, images.dtype)
            entry = kept[key] = (geometry, phases, views_of(geometry, phases))
        fill_phases(geometry, images, entry[1])
        return entry[2]
    # Larger phases are made in this thread's scratch; their views are kept until the
    # slot is replaced (grown): ``as_strided`` costs 2.5 us a view.
    store = _kept.scratch_views

    def make() -> tuple[np.ndarray, list[np.ndarray]]:
        phases = scratch("phases", shape, images.dtype)
        return phases, views_of(geometry, phases)

    key = (id(geometry), images.shape[0], images.dtype, views_of)
    phases, views = _kept_on_scratch(store, key, geometry, ("phases",), make)
    phases.fill(0)
    fill_phases(geometry, images, phases)
    return views


def _crop(geometry: FlatGeometry, full: np.ndarray, y: np.ndarray) -> None:
    """``y`` ``(B, oh, ow)`` = the valid columns of ``full`` ``(B, oh * wq)``."""
    oh, ow = geometry.out_shape
    np.copyto(y, full.reshape(-1, oh, geometry.grid[1])[:, :, :ow])


def flat_conv(
    geometry: FlatGeometry,
    x: np.ndarray,
    wmat: np.ndarray,
    y: np.ndarray,
) -> None:
    """``y`` ``(N, M, *out)`` = the convolution of ``x`` ``(N, C, *in)`` with ``wmat``
    ``(groups, M / groups, C / groups * taps)`` (taps in ``geometry.order``); with one
    group, ``wmat`` may have one more column, the bias (the columns then get a row of
    ones)."""
    n, c = x.shape[:2]
    group = wmat.shape[0]
    m = y.shape[1]
    taps, length = len(geometry.order), geometry.length
    oh, ow = geometry.out_shape
    views = _phase_views(geometry, x.reshape(n * c, *geometry.in_shape), column_views)
    ones = group == 1 and wmat.shape[2] == c * taps + 1
    rows = scratch_columns("cols", c * taps, length, x.dtype, ones)
    cols = rows[: c * taps].reshape(c, taps, length)
    direct = geometry.exact or ow == geometry.grid[1]
    full = None if direct else scratch("full", (group, m // group, length), x.dtype)
    for image in range(n):
        base = image * c

        def copy(start: int, stop: int, base: int = base) -> None:  # split by channel
            copy_columns(views, base + start, base + stop, cols[start:stop])

        run_parallel(copy, c, work=cols.size, least=MIN_PARALLEL_MACS)
        matrix = rows.reshape(group, -1, length)
        if group == 1 and by_pixels(m, matrix.shape[1], length, x.dtype):
            product_by_pixels(wmat[0], matrix[0], y[image].reshape(m, oh, ow))
            continue
        target = y[image].reshape(group, m // group, length) if full is None else full
        if group == 1:
            gemm_2d(wmat[0], matrix[0], target[0])
        else:
            stacked_matmul(wmat, matrix, target)
        if full is not None:
            _crop(geometry, full.reshape(m, length), y[image].reshape(m, oh, ow))


BY_PIXELS_BELOW = 96
"""Filters below which a large convolution's product is split by pixels: with fewer,
row blocks of the filters would each pack the whole column matrix again (or not split
at all, below two blocks of :data:`.matmul.ROW_ALIGN` rows)."""


def by_pixels(filters: int, inner: int, pixels: int, dtype: np.dtype) -> bool:
    """Whether a convolution's product of ``filters`` rows runs as
    :func:`product_by_pixels`: large, with too few rows for :func:`.matmul.gemm_2d`'s
    row blocks to pay, and more than one intra-op thread to split it between (on one
    thread the product of the other orientation is 3-20% faster).

    Not where :func:`.matmul.gemm_2d` splits such a product by columns bit for bit
    (float32 on the BLAS kernels of :func:`.matmul.columns_split_exactly`): its blocks
    write ``y`` directly, where the pixel blocks' product is transposed into ``y`` in a
    second pass over it. On two threads, PP-LCNet's 1x1 convolutions of 16 and 32
    channels to 32 and 64 over 112x112 and 56x56 maps then take 0.31 and 0.22 instead
    of 0.55 and 0.34 ms, its 3x3 stem 0.44 instead of 0.59 ms, and PP-OCRv4's detector
    62 instead of 70 ms.
    """
    if dtype == np.float32 and columns_split_exactly():
        return False
    return (
        8 <= filters < BY_PIXELS_BELOW
        and filters * inner * pixels >= SPLIT_PRODUCT
        and intra_op_threads() > 1
    )


def product_by_pixels(w: np.ndarray, cols: np.ndarray, y: np.ndarray) -> None:
    """``y`` ``(M, oh, ow)`` = ``w`` ``(M, K)`` @ ``cols`` ``(K, oh * width)`` with the
    first ``ow`` of every ``width`` columns kept, computed as ``cols.T @ w.T``.

    A product of few rows splits poorly by :func:`.matmul.gemm_2d` (each row block packs
    the whole column matrix; column blocks change its rounding with the thread count);
    transposed, its rows are the pixels, and blocks of them starting at multiples of
    ``ROW_ALIGN`` give the result of one call bit for bit, however many threads take
    the blocks (equal pixels give equal results wherever the blocks fall). The pixel
    blocks and the transposition into ``y`` are split between the intra-op threads:
    on two threads, 64 3x3 filters over 64x56x56 take about 0.6x the time of one
    thread's product.
    """
    m, k = w.shape
    oh, ow = y.shape[1:]
    pixels = cols.shape[1]
    product = scratch("full", (pixels, m), cols.dtype)
    w_t = w.T

    def rows(start: int, stop: int) -> None:
        np.matmul(cols[:, start:stop].T, w_t, out=product[start:stop])

    run_parallel(
        rows,
        pixels,
        work=m * k * pixels,
        parts_per_thread=2,
        align=ROW_ALIGN,
        least=MIN_PARALLEL_MACS,
    )
    kept = product.reshape(oh, pixels // oh, m)[:, :ow]

    def transpose(start: int, stop: int) -> None:
        np.copyto(y[start:stop], kept[:, :, start:stop].transpose(2, 0, 1))

    run_parallel(transpose, m, work=y.size, least=MIN_PARALLEL_MACS)


DEPTHWISE_BLOCK_BYTES = 1 << 20
"""Columns (or shifted rows and their sums) per block of a depthwise convolution. A
channel whose buffers are larger is done in pieces of whole output rows. Each block
costs a few numpy calls per tap group: blocks of 1 MB rather than 512 KB took 0.91-0.97x
the time (with numpy 2.4 on AVX-512), though they outgrow the L2 cache. Copying the
columns and multiplying them (BLAS reads all the taps of a column at once) beats a
multiply and an add per tap over the whole map even on large maps: in PP-LCNet's run 16
3x3 filters over 16x112x112 and 64 over 64x56x56 take 0.35 instead of 0.43-0.45 ms of
one thread, 0.41 instead of 0.48 ms of two."""

Epilogue = Callable[[int, int, np.ndarray], object]
"""``epilogue(first, last, block)``: work applied in place to channels ``first:last``
(of the flattened batch and channels) of a convolution's output, ``block``
``(last - first, *out)``: a bias, a residual, an activation. A depthwise convolution
applies it to each thread's share of the output when that share is done, on that
thread (no separate hand-off of an elementwise pass to the threads)."""


def tap_bands(geometry: FlatGeometry) -> list[list[int]]:
    """The tap groups (indices) in bands of the same columns (the same first column,
    count and step): the rows of a band's groups, from any phase, are multiplied by the
    band's taps in one product."""
    bands: dict[tuple[int, int, int, int], list[int]] = {}
    wq = geometry.grid[1]
    for number, group in enumerate(geometry.groups):
        key = (group.phase_col, group.start % wq, group.cols, group.col_step)
        bands.setdefault(key, []).append(number)
    return list(bands.values())


def shifted_rows(geometry: FlatGeometry) -> bool:
    """Whether :func:`flat_depthwise` sums shifted rows for ``geometry`` rather than
    copying its columns: every band of tap groups (:func:`tap_bands`) has several rows
    and columns. Else the rows gain nothing or lose: the two bands of a 3x3 stride-2
    kernel (one of them one column wide) took 1.05-2x the columns' time, and numpy's
    matmul of one inner dimension (a band of one row) does not call BLAS (10x slower).
    A 5x5 stride-2 kernel's two bands (3 and 2 columns) take 0.77-0.91x the columns'
    time (PicoDet's and PP-LCNet's on 128-256 channels of 14x14 to 100x76)."""
    groups = geometry.groups
    return all(
        groups[band[0]].cols > 1 and sum(groups[g].rows for g in band) > 1
        for band in tap_bands(geometry)
    )


@dataclass(frozen=True)
class DepthwiseOperands:
    """The per-channel operands of :func:`flat_depthwise` for a batch of images: one row
    per image and channel, so that a block of channels across images takes a slice of
    them rather than a gather (26 of 470 us on PP-OCR's 5x5 over 6x200x3x48)."""

    bands: tuple[np.ndarray, ...]
    """:func:`shifted_rows`: per band of tap groups ``(N * C, cols, rows)``; else empty."""
    final: np.ndarray
    """The vectors ``(N * C, 1, K)`` of the last product: the taps (columns) or ones (the
    sums of the shifted rows), then the bias when there is one, which multiplies a row
    of ones kept in the buffers: the bias comes with the product instead of a pass over
    each block (product, pass and crop took 1.2x the time of the product with the bias
    and the crop on 5x5 over 256x14x14, 1.26x on 6x200x3x48)."""
    biased: bool


def depthwise_operands(
    geometry: FlatGeometry, weights: np.ndarray, images: int
) -> DepthwiseOperands:
    """The operands of :func:`flat_depthwise` for ``images`` images without a bias:
    ``weights`` ``(C, taps)`` (taps in ``geometry.order``) as it multiplies them, per
    band of tap groups (:func:`tap_bands`) ``(C, cols, rows)`` (the taps of its groups,
    transposed, their rows one after the other) then ones for :func:`shifted_rows`,
    else the taps ``(C, 1, taps)``; :func:`with_depthwise_bias` adds a bias."""
    channels = weights.shape[0]
    if shifted_rows(geometry):
        grids = []
        done = 0
        for group in geometry.groups:
            size = group.rows * group.cols
            grids.append(weights[:, done : done + size].reshape(-1, group.rows, group.cols))
            done += size
        bands = tuple(
            np.concatenate([grids[g] for g in band], axis=1).transpose(0, 2, 1)
            for band in tap_bands(geometry)
        )
        final = np.ones((channels, 1, sum(band.shape[1] for band in bands)), weights.dtype)
    else:
        bands, final = (), weights.reshape(channels, 1, -1)
    return DepthwiseOperands(
        tuple(np.tile(band, (images, 1, 1)) for band in bands),
        np.tile(final, (images, 1, 1)),
        False,
    )


def with_depthwise_bias(operands: DepthwiseOperands, bias: np.ndarray | None) -> DepthwiseOperands:
    """``operands`` (of :func:`depthwise_operands`, without a bias) with ``bias``
    ``(C,)`` after the vectors of the last product; ``operands`` when ``bias`` is None."""
    if bias is None:
        return operands
    final = operands.final
    lifted = bias.astype(final.dtype, copy=False).reshape(-1, 1, 1)
    tiled = np.tile(lifted, (final.shape[0] // lifted.shape[0], 1, 1))
    return DepthwiseOperands(operands.bands, np.concatenate([final, tiled], axis=2), True)


def _row_views(geometry: FlatGeometry, phases: np.ndarray) -> list[np.ndarray]:
    """Per tap group, the read-only view ``(B, rows, length + (cols - 1) * col_step)``
    of its rows in ``phases``: row ``u`` starts at the offset of tap ``(u, 0)`` and
    reaches as far as the columns of tap ``(u, cols - 1)``."""
    item = phases.itemsize
    views = []
    for group in geometry.groups:
        source = phases[group.phase_row, group.phase_col, :, group.start :]
        reach = geometry.length + (group.cols - 1) * group.col_step
        shape = (source.shape[0], group.rows, reach)
        strides = (source.strides[0], group.row_step * item, item)
        views.append(as_strided(source, shape, strides, writeable=False))
    return views


def _reach(geometry: FlatGeometry) -> int:
    """How far the shifted rows of :func:`shifted_rows` reach past the columns."""
    return max((group.cols - 1) * group.col_step for group in geometry.groups)


def _pitch(geometry: FlatGeometry, width: int) -> int:
    """Elements per sum of the shifted rows of ``width`` columns: the shift of sum ``v``
    of a group, ``v * col_step``, is taken out of the row stride of the product that
    writes it, so that all sums line up at this pitch."""
    return width + _reach(geometry) + max(group.col_step for group in geometry.groups)


def depthwise_channel_bytes(geometry: FlatGeometry, itemsize: int, width: int) -> int:
    """The buffers :func:`flat_depthwise` fills per channel for ``width`` columns."""
    if not shifted_rows(geometry):
        return len(geometry.order) * width * itemsize
    rows = sum(group.rows for group in geometry.groups)
    sums = sum(geometry.groups[band[0]].cols for band in tap_bands(geometry))
    return (rows * (width + _reach(geometry)) + sums * _pitch(geometry, width)) * itemsize


@dataclass(frozen=True)
class _DepthwiseLayout:
    """How :func:`flat_depthwise` cuts one geometry's channels into blocks."""

    rows_path: bool
    """:func:`shifted_rows`."""
    block: int
    """Channels per block."""
    pieces: tuple[tuple[int, int], ...]
    """Output rows of each piece of a block (one piece: all rows)."""
    span: int
    """Columns of the longest piece."""
    extra: int
    """How far the shifted rows reach past the columns."""
    pitch: int
    """Elements per sum of the shifted rows (see :func:`_pitch`)."""
    row_count: int
    sum_count: int
    bands: tuple[tuple[int, ...], ...]
    """:func:`tap_bands`."""
    slots: tuple[int, ...]
    """Per tap group, its first row in the shifted rows (those of a band together)."""
    kept: bool
    """The buffers are small enough to keep per geometry and thread."""
    biased: bool
    """The buffers hold a row of ones after the columns (or the sums) for the bias
    (:attr:`DepthwiseOperands.final`)."""


def _depthwise_layout(
    geometry: FlatGeometry, itemsize: int, channels: int, biased: bool
) -> _DepthwiseLayout:
    """The layout of ``channels`` (batch times channels) of ``geometry``."""
    oh = geometry.out_shape[0]
    wq = geometry.grid[1]
    length = geometry.length
    rows_path = shifted_rows(geometry)
    per_channel = depthwise_channel_bytes(geometry, itemsize, length)
    block = min(channels, max(1, DEPTHWISE_BLOCK_BYTES // per_channel))
    rows = oh
    if per_channel > DEPTHWISE_BLOCK_BYTES:  # output rows per piece of a channel
        per_row = depthwise_channel_bytes(geometry, itemsize, wq)
        per_row -= depthwise_channel_bytes(geometry, itemsize, 0)
        rows = max(1, DEPTHWISE_BLOCK_BYTES // per_row)
    span = min(length, rows * wq)
    groups = geometry.groups
    bands = tap_bands(geometry)
    slots: dict[int, int] = {}
    for number in (g for band in bands for g in band):
        slots[number] = sum(groups[g].rows for g in slots)
    return _DepthwiseLayout(
        rows_path,
        block,
        tuple((r, min(oh, r + rows)) for r in range(0, oh, rows)),
        span,
        _reach(geometry) if rows_path else 0,
        _pitch(geometry, span),
        sum(group.rows for group in geometry.groups),
        sum(groups[band[0]].cols for band in bands),
        tuple(tuple(band) for band in bands),
        tuple(slots[number] for number in range(len(groups))),
        block * depthwise_channel_bytes(geometry, itemsize, span) <= KEPT_PHASES_BYTES,
        biased,
    )


class _DepthwiseBuffers:
    """One thread's buffers for the blocks of one depthwise geometry: the products (and
    the columns, or the shifted rows and their sums), with the views that write the
    sums at their shifts and read them lined up. Kept per geometry and thread when
    small (:data:`KEPT_PHASES_BYTES`): making the views costs a small convolution more
    than its arithmetic."""

    __slots__ = ("full", "last", "ones", "source", "targets")

    def __init__(
        self,
        geometry: FlatGeometry,
        layout: _DepthwiseLayout,
        dtype: np.dtype,
        allocate: Callable[[str, tuple[int, ...], np.dtype], np.ndarray],
    ) -> None:
        block, span, pitch = layout.block, layout.span, layout.pitch
        biased = int(layout.biased)
        self.full = allocate("block-out", (block, 1, span), dtype)
        self.targets: list[tuple[np.ndarray, np.ndarray]] = []
        if not layout.rows_path:
            taps = len(geometry.order)
            self.source = allocate("block", (block, taps + biased, span), dtype)
            self.last = self.source
            self.ones = self.source[:, taps] if biased else None
            return
        self.source = allocate("block", (block, layout.row_count, span + layout.extra), dtype)
        sums = allocate("block-sums", (block, (layout.sum_count + biased) * pitch), dtype)
        item = sums.itemsize
        first_row = first_sum = 0
        for band in layout.bands:  # its shifted rows and where its sums go
            group = geometry.groups[band[0]]
            rows = sum(geometry.groups[g].rows for g in band)
            reach = span + (group.cols - 1) * group.col_step
            to = as_strided(
                sums[:, first_sum * pitch :],
                (block, group.cols, reach),
                (sums.strides[0], (pitch - group.col_step) * item, item),
            )
            self.targets.append((self.source[:, first_row : first_row + rows], to))
            first_row += rows
            first_sum += group.cols
        self.last = as_strided(
            sums,
            (block, layout.sum_count + biased, span),
            (sums.strides[0], pitch * item, item),
        )
        self.ones = self.last[:, layout.sum_count] if biased else None


def _owned(slot: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype)


_layouts: dict[tuple[int, int, int, bool], tuple[FlatGeometry, _DepthwiseLayout]] = {}
"""Layouts by the id of their geometry, the item size, the channels and whether biased
(the entry holds the geometry, so that an id reused by another one is not mistaken)."""

_DEPTHWISE_SLOTS = ("block-out", "block", "block-sums")
"""The scratch slots of :class:`_DepthwiseBuffers` that are not kept."""


def _depthwise_buffers(
    geometry: FlatGeometry, layout: _DepthwiseLayout, dtype: np.dtype
) -> _DepthwiseBuffers:
    """This thread's buffers for ``geometry``: kept ones when small, else views of its
    scratch buffers, made again only when a slot was replaced (grown) since: the views
    cost 11-14 us a call (``as_strided``)."""
    kept = _kept.depthwise
    key = (id(geometry), dtype, layout.kept)  # kept buffers and scratch views apart
    entry = kept.get(key)
    if layout.kept:
        if entry is None or entry[0] is not geometry:
            if len(kept) >= KEPT_GEOMETRIES:
                kept.clear()
            buffers = _DepthwiseBuffers(geometry, layout, dtype, _owned)
            if buffers.ones is not None:
                buffers.ones.fill(1)
            entry = kept[key] = (geometry, buffers, ())
        return entry[1]
    buffers = _kept_on_scratch(
        kept,
        key,
        geometry,
        _DEPTHWISE_SLOTS,
        lambda: _DepthwiseBuffers(geometry, layout, dtype, scratch),
    )
    if buffers.ones is not None:  # other kernels write into the same scratch
        buffers.ones.fill(1)
    return buffers


def flat_depthwise(
    geometry: FlatGeometry,
    x: np.ndarray,
    operands: DepthwiseOperands,
    y: np.ndarray,
    epilogue: Epilogue | None = None,
) -> None:
    """``y`` ``(N, C, *out)`` = the depthwise convolution of ``x`` ``(N, C, *in)`` with
    ``operands`` (:func:`depthwise_operands`: the taps and the bias), then ``epilogue``.

    Per block of channels (:data:`DEPTHWISE_BLOCK_BYTES`; per piece of whole output rows
    of a channel whose buffers are larger), split between the intra-op threads, either

    - the columns ``(block, taps, length)`` and a stack of vector-matrix products with
      the channels' taps; or, for :func:`shifted_rows` geometries,
    - per tap group of ``rows x cols`` taps, its ``rows`` shifted rows (each as long as
      the columns plus ``(cols - 1) * col_step``) instead of the columns of all its
      taps; per band of groups with the same columns (:func:`tap_bands`), a product per
      channel of its ``(cols, rows)`` taps and their rows: ``cols`` sums over the
      kernel rows. A second product, with ones, adds up all the sums, each shifted by
      ``v * col_step`` (stored so that the shifted sums line up). A 5x5 kernel copies 5
      rows instead of 25 columns: PP-LCNet's on 256x14x14 takes 0.60-0.65x the time of
      the columns, PP-OCR's on 6x88x3x96 0.58-0.64x, with stride (2, 1) 0.65x, 3x3 ones
      0.87-0.96x.

    The last product adds the bias (a row of ones in the buffers); then the valid
    columns are cropped into ``y``."""
    n, c = x.shape[:2]
    length = geometry.length
    oh, ow = geometry.out_shape
    wq = geometry.grid[1]
    key = (id(geometry), x.itemsize, n * c, operands.biased)
    entry = _layouts.get(key)
    if entry is None or entry[0] is not geometry:
        if len(_layouts) >= KEPT_GEOMETRIES:
            _layouts.clear()
        layout = _depthwise_layout(geometry, x.itemsize, n * c, operands.biased)
        entry = _layouts[key] = (geometry, layout)
    layout = entry[1]
    rows_path, block, pieces = layout.rows_path, layout.block, layout.pieces
    slots, bands = layout.slots, layout.bands
    views = _phase_views(
        geometry,
        x.reshape(n * c, *geometry.in_shape),
        _row_views if rows_path else column_views,
    )
    images = y.reshape(n * c, oh, ow)
    blocks = -(-(n * c) // block)
    taps = len(geometry.order)

    def part(start: int, stop: int) -> None:
        if start >= stop:
            return
        buffers = _depthwise_buffers(geometry, layout, x.dtype)
        full, source_buffer, targets, last = (
            buffers.full,
            buffers.source,
            buffers.targets,
            buffers.last,
        )
        for number in range(start, stop):
            first, last_channel = number * block, min(n * c, (number + 1) * block)
            size = last_channel - first
            kernels = [matrices[first:last_channel] for matrices in operands.bands]
            final = operands.final[first:last_channel]
            for top, bottom in pieces:
                begin = top * wq
                width = min(length, bottom * wq) - begin
                if rows_path:
                    for view, slot in zip(views, slots, strict=True):
                        wide = width + view.shape[2] - length
                        np.copyto(
                            source_buffer[:size, slot : slot + view.shape[1], :wide],
                            view[first:last_channel, :, begin : begin + wide],
                        )
                    for matrices, (to_rows, to_sums), band in zip(
                        kernels, targets, bands, strict=True
                    ):
                        wide = width + views[band[0]].shape[2] - length
                        source = to_rows[:size, :, :wide]
                        np.matmul(matrices, source, out=to_sums[:size, :, :wide])
                else:
                    copy_columns(
                        views,
                        first,
                        last_channel,
                        source_buffer[:size, :taps, :width],
                        slice(begin, begin + width),
                    )
                np.matmul(final, last[:size, :, :width], out=full[:size, :, :width])
                piece = full[:size, 0, : (bottom - top) * wq].reshape(size, bottom - top, wq)
                np.copyto(images[first:last_channel, top:bottom], piece[:, :, :ow])
        if epilogue is not None:
            first, last_channel = start * block, min(n * c, stop * block)
            epilogue(first, last_channel, images[first:last_channel])

    run_parallel(
        part,
        blocks,
        work=n * c * len(geometry.order) * length,
        parts_per_thread=2,
        least=MIN_PARALLEL_MACS,
    )
