"""Depthwise convolutions as stacks of banded matrix products.

For one channel, the output pixels of a tile of ``tw`` columns in one output row are a
matrix product: the rows of the padded input that the kernel rows read, cut to the
``wt = (tw - 1) * sw + (kw - 1) * dw + 1`` columns the tile reads, put side by side
(``kh * wt`` values), times a banded matrix ``(kh * wt, tw)`` that holds the kernel
row ``i`` tap ``j`` at ``(i * wt + q * sw + j * dw, q)`` and zeros elsewhere. Every
row and tile of every image of a channel share that matrix, so a channel is one matrix
product ``(N * oh * tiles, kh * wt) @ (kh * wt, tw)`` on BLAS, and the channels are a
stack of them. The windows copied are ``kh * wt / tw`` values per output pixel (instead
of ``kh * kw``), at the price of ``wt / kw`` times the multiply-adds, which BLAS does
faster than numpy's passes over the taps. Kernel rows that read only padding are left
out. Measured on one thread (OpenBLAS on AVX-512): PP-LCNet's 5x5 depthwise convolution
on 256x14x14 takes 0.14 instead of 0.23 ms, 512x7x7 0.14 instead of 0.22 ms; PP-OCR's
classifier's 5x5 ones on 6 images of 200x1x48 ...

Like the Winograd products, a non-finite input value reaches the outputs of its whole
tile row (``0 * inf`` is NaN), not only those whose windows hold it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided

from aioinfer.devices.cpu.kernels.conv_flat import Epilogue, scratch
from aioinfer.devices.cpu.kernels.parallel import run_parallel

TILE_RANGE = (16, 48)
"""Output columns per tile when the rows are wider than :data:`WHOLE_ROW`: a divisor of
the width in this range (closest to 32) when there is one, else 32 and the columns past
the width dropped. Narrower tiles copy more windows, wider ones waste more
multiply-adds on the band's zeros."""
WHOLE_ROW = 64
"""Output rows up to this wide are one tile."""
MIN_KERNEL_WIDTH = 5
"""Kernels from this wide run as banded products. On 3x3 kernels the column copies of
:func:`.conv_flat.flat_depthwise` are short enough, and the band's zeros (``wt / 3``
times the multiply-adds) cost more than they save: 64x56x56 took 1.26 times as long,
128x28x28 1.24, 16x112x112 1.27 (only 3x3 stride-2 ones on maps 28 wide or less gain,
0.8x). 5x5 kernels take 0.5-0.8 of the time (see the module's docstring)."""
BLOCK_BYTES = 1 << 19
"""Windows per block of channels: they stay in the L2 cache between their copy and
their product."""


@dataclass(frozen=True)
class BandGeometry:
    """Where the windows of a depthwise convolution lie in its padded input, and how its
    output rows are cut into tiles (1-D convolutions are one row)."""

    in_shape: tuple[int, int]
    padded: tuple[int, int]
    """Rows and columns of the zero-padded input (wide enough for the last tile)."""
    begins: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    rows: tuple[int, int]
    """First kernel row used and how many (the others read only padding)."""
    kernel_width: int
    out_shape: tuple[int, int]
    tile: int
    tiles: int
    window: int
    """Input columns a tile reads: ``(tile - 1) * sw + (kw - 1) * dw + 1``."""

    @property
    def depth(self) -> int:
        """Inner dimension of the products: kernel rows used times the window."""
        return self.rows[1] * self.window


def band_fits(kernel_shape: Sequence[int], dilations: Sequence[int]) -> bool:
    """Whether a depthwise convolution of this kernel runs as banded products."""
    return kernel_shape[-1] >= MIN_KERNEL_WIDTH and dilations[-1] == 1


def _tile(width: int) -> int:
    if width <= WHOLE_ROW:
        return width
    low, high = TILE_RANGE
    divisors = [d for d in range(low, high + 1) if width % d == 0]
    return min(divisors, key=lambda d: abs(d - 32)) if divisors else 32


def band_geometry(
    in_shape: Sequence[int],
    kernel_shape: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    begins: Sequence[int],
    ends: Sequence[int],
    out_shape: Sequence[int],
) -> BandGeometry:
    """The geometry of a 1-D or 2-D depthwise convolution (spatial shapes and attributes;
    1-D is lifted to one row)."""
    lift = (1,) * (2 - len(kernel_shape))
    zero = (0,) * (2 - len(kernel_shape))
    hx, wx = lift + tuple(in_shape)
    kh, kw = lift + tuple(kernel_shape)
    sh, sw = lift + tuple(strides)
    dh, dw = lift + tuple(dilations)
    bh, bw = zero + tuple(begins)
    eh, ew = zero + tuple(ends)
    oh, ow = lift + tuple(out_shape)
    used = [i for i in range(kh) if any(0 <= r * sh + i * dh - bh < hx for r in range(oh))]
    first, count = used[0], used[-1] - used[0] + 1
    tile = _tile(ow)
    tiles = -(-ow // tile)
    window = (tile - 1) * sw + (kw - 1) * dw + 1
    width = max(wx + bw + ew, (tiles * tile - 1) * sw + (kw - 1) * dw + 1)
    return BandGeometry(
        (hx, wx),
        (hx + bh + eh, width),
        (bh, bw),
        (sh, sw),
        (dh, dw),
        (first, count),
        kw,
        (oh, ow),
        tile,
        tiles,
        window,
    )


def band_weights(geometry: BandGeometry, w: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The banded matrices ``(C, depth, tile)`` of the depthwise filters ``w``
    ``(C, 1, *kernel)``."""
    c = w.shape[0]
    first, count = geometry.rows
    kw, tile, window = geometry.kernel_width, geometry.tile, geometry.window
    kernels = w.reshape(c, -1, kw)[:, first : first + count]
    bands = np.zeros((c, count, window, tile), dtype)
    columns = np.arange(tile)
    for j in range(kw):
        at = columns * geometry.strides[1] + j * geometry.dilations[1]
        bands[:, :, at, columns] = kernels[:, :, j, None]
    return bands.reshape(c, count * window, tile)


_kept = threading.local()
"""``padded``: this thread's zero-padded inputs by (geometry, batch, channels, dtype)."""
KEPT_GEOMETRIES = 64


def _padded(geometry: BandGeometry, shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
    """This thread's padded input buffer ``(N, C, *padded)``: zeroed once, only its
    interior is written by the calls (each thread writes and reads the channels of
    its own parts)."""
    kept: dict[tuple[int, int, int, np.dtype], tuple[BandGeometry, np.ndarray]]
    kept = getattr(_kept, "padded", None) or {}
    _kept.padded = kept
    key = (id(geometry), *shape, dtype)
    entry = kept.get(key)
    if entry is None or entry[0] is not geometry:
        if len(kept) >= KEPT_GEOMETRIES:
            kept.clear()
        entry = kept[key] = (geometry, np.zeros((*shape, *geometry.padded), dtype))
    return entry[1]


def band_depthwise(
    geometry: BandGeometry,
    x: np.ndarray,
    bands: np.ndarray,
    y: np.ndarray,
    epilogue: Epilogue | None = None,
) -> None:
    """``y`` ``(N, C, *out)`` = the depthwise convolution of ``x`` ``(N, C, *in)`` with
    the banded matrices ``bands`` (:func:`band_weights`); ``epilogue`` applied to each
    part's channels of each image when they are done."""
    n, c = x.shape[:2]
    hx, wx = geometry.in_shape
    bh, bw = geometry.begins
    sh, sw = geometry.strides
    dh = geometry.dilations[0]
    oh, ow = geometry.out_shape
    tile, tiles, window = geometry.tile, geometry.tiles, geometry.window
    first_row, count = geometry.rows
    images = x.reshape(n, c, hx, wx)
    out = y.reshape(n, c, oh, ow)
    rows = n * oh * tiles
    depth = geometry.depth
    exact = tiles * tile == ow
    block = max(1, BLOCK_BYTES // (rows * depth * x.itemsize))

    def part(start: int, stop: int) -> None:
        padded = _padded(geometry, (n, c), x.dtype)
        padded[:, start:stop, bh : bh + hx, bw : bw + wx] = images[:, start:stop]
        item = padded.itemsize
        pn, pc, pr, _ = padded.strides
        origin = padded[:, :, first_row * dh :]
        windows = as_strided(
            origin,
            (c, n, oh, tiles, count, window),
            (pc, pn, sh * pr, tile * sw * item, dh * pr, item),
            writeable=False,
        )
        for first in range(start, stop, block):
            last = min(stop, first + block)
            size = last - first
            cols = scratch("band", (size, n, oh, tiles, count, window), x.dtype)
            np.copyto(cols, windows[first:last])
            matrix = cols.reshape(size, rows, depth)
            if n == 1 and exact:
                np.matmul(
                    matrix, bands[first:last], out=out[0, first:last].reshape(size, rows, tile)
                )
                continue
            product = scratch("band-out", (size, n, oh, tiles * tile), x.dtype)
            np.matmul(matrix, bands[first:last], out=product.reshape(size, rows, tile))
            np.copyto(out[:, first:last], product[..., :ow].transpose(1, 0, 2, 3))
        if epilogue is not None:
            for image in range(n):
                epilogue(image * c + start, image * c + stop, out[image, start:stop])

    run_parallel(part, c, work=c * rows * depth * tile, parts_per_thread=2)
