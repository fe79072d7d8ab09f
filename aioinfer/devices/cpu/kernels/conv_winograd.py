"""Winograd F(2x2, 3x3): 3x3 stride-1 convolutions in 2.25x fewer multiply-adds.

The output is cut into 2x2 tiles; tile ``t`` reads the 4x4 patch ``d`` of the padded
input at ``(2 * ty, 2 * tx)``. With the transforms of Lavin & Gray (2016),

    V = Bt d B,   U = G g Gt (once, at compile time),   Y = At (U * V) A,

the elementwise products of all channels become 16 matrix products
``(M, C) @ (C, tiles)``: 16 C multiply-adds per tile and filter instead of 36 C. The
transforms are additions only (and halvings in ``G``), a few passes over the input and
the output. Rounding differs from the direct sum by a few float32 ulps of the largest
terms (the transforms add at most 4 x 4 terms), well within the tolerances the tests
state against onnxruntime (rtol 1e-4 on sums of thousands of products).

Used for 2-D, 3x3, stride 1, dilation 1, one group, when both channel counts are large
enough for the 16 products to run at BLAS's speed (see :func:`winograd_fits`).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from aioinfer.devices.cpu.kernels.conv_flat import scratch
from aioinfer.devices.cpu.kernels.matmul import stacked_matmul
from aioinfer.devices.cpu.kernels.parallel import MIN_PARALLEL_ELEMENTS, run_parallel

_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])

MIN_CHANNELS = 96
"""Input and output channels from which the saved multiply-adds outweigh the transforms,
which are numpy passes over the input and output (one thread, measured with OpenBLAS on
AVX-512): 96->96 channels on 52x52 take 3.8 instead of 4.9 ms, 256->256 on 14x14 2.0
instead of 2.4 ms, 512->512 on 7x7 and 64->64 on 56x56 the same, 48->48 on 52x52 1.5
instead of 1.4 ms."""
MIN_TILES = 36
"""Output tiles (2x2 pixels) from which the transforms pay for themselves."""


def winograd_fits(
    kernel_shape: tuple[int, ...],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    group: int,
    channels: int,
    filters: int,
    out_shape: tuple[int, ...],
) -> bool:
    """Whether a convolution of this geometry runs as Winograd F(2x2, 3x3)."""
    if kernel_shape != (3, 3) or strides != (1, 1) or dilations != (1, 1) or group != 1:
        return False
    tiles = -(-out_shape[0] // 2) * -(-out_shape[1] // 2)
    return min(channels, filters) >= MIN_CHANNELS and tiles >= MIN_TILES


def winograd_weights(w: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``U = G g Gt`` of the filters ``w`` ``(M, C, 3, 3)``, as ``(16, M, C)``."""
    u = np.einsum("ik,mckl,jl->ijmc", _G, w.astype(np.float64), _G)
    return np.ascontiguousarray(u.reshape(16, *w.shape[:2]), dtype=dtype)


def winograd_conv(
    x: np.ndarray,
    u: np.ndarray,
    begins: tuple[int, ...],
    out_shape: tuple[int, ...],
    y: np.ndarray,
) -> None:
    """``y`` ``(N, M, oh, ow)`` = the 3x3 stride-1 convolution of ``x`` ``(N, C, H, W)``
    padded by ``begins`` at the top and left (and by zeros as needed at the bottom and
    right) with the transformed filters ``u`` (:func:`winograd_weights`).

    All three steps split between the intra-op threads: the input's transform by blocks
    of channels, the 16 products by product, the output's transform by blocks of
    filters (with only the products split, the transforms, about half of one thread's
    time, kept a 128 -> 128 filter 28x28 convolution on two threads as slow as on one)."""
    n, c, height, width = x.shape
    m = u.shape[1]
    oh, ow = out_shape
    th, tw = -(-oh // 2), -(-ow // 2)
    tiles = n * th * tw
    dtype = x.dtype
    # The padded input, large enough for every tile's 4x4 patch; its transform
    # v (4, 4, C, N, th, tw); the buffers are the calling thread's, shared by the parts.
    hp, wp = 2 * th + 2, 2 * tw + 2
    padded = scratch("phases", (n, c, hp, wp), dtype)
    half = scratch("winograd-half", (4, c, n, th, wp), dtype)
    v = scratch("cols", (4, 4, c, n, th, tw), dtype)
    bh, bw = begins
    rows, cols = min(height, hp - bh), min(width, wp - bw)

    def transform_input(first: int, last: int) -> None:
        block = padded[:, first:last]
        block.fill(0)
        block[:, :, bh : bh + rows, bw : bw + cols] = x[:, first:last, :rows, :cols]
        # Bt d over rows: for every tile row ty, (P0 - P2, P1 + P2, P2 - P1, P1 - P3) of
        # padded rows 2ty + i, whole rows at a time: half (4, C, N, th, wp).
        planes = block.transpose(1, 0, 2, 3)
        rows_of = [planes[:, :, i : i + 2 * th : 2] for i in range(4)]
        part = half[:, first:last]
        np.subtract(rows_of[0], rows_of[2], out=part[0])
        np.add(rows_of[1], rows_of[2], out=part[1])
        np.subtract(rows_of[2], rows_of[1], out=part[2])
        np.subtract(rows_of[1], rows_of[3], out=part[3])
        # (Bt d) B: the same over columns 2tx + j, into v.
        cols_of = [part[..., j : j + 2 * tw : 2] for j in range(4)]
        into = v[:, :, first:last]
        np.subtract(cols_of[0], cols_of[2], out=into[:, 0])
        np.add(cols_of[1], cols_of[2], out=into[:, 1])
        np.subtract(cols_of[2], cols_of[1], out=into[:, 2])
        np.subtract(cols_of[1], cols_of[3], out=into[:, 3])

    run_parallel(transform_input, c, work=16 * c * tiles * 4, least=MIN_PARALLEL_ELEMENTS)
    # The 16 products (M, C) @ (C, tiles), split between the threads.
    products = scratch("full", (16, m, tiles), dtype)
    stacked_matmul(u, v.reshape(16, c, tiles), products)
    p = products.reshape(4, 4, m, n, th, tw)
    # At p: rows (p0 + p1 + p2, p1 - p2 - p3), into half2 (2, 4, M, tiles); (At p) A:
    # columns, into the output tiles y[n, m, 2ty + a, 2tx + b].
    half2 = scratch("winograd-half", (2, 4, m, n, th, tw), dtype)
    exact = oh == 2 * th and ow == 2 * tw
    target = y if exact else scratch("winograd-out", (n, m, 2 * th, 2 * tw), dtype)
    tn, tm, trow, tcol = target.strides
    quads = as_strided(
        target,
        (2, 2, m, n, th, tw),
        (trow, tcol, tm, tn, 2 * trow, 2 * tcol),
    )

    def transform_output(first: int, last: int) -> None:
        q2 = half2[:, :, first:last]
        pp = p[:, :, first:last]
        np.add(pp[0], pp[1], out=q2[0])
        q2[0] += pp[2]
        np.subtract(pp[1], pp[2], out=q2[1])
        q2[1] -= pp[3]
        for a in range(2):
            q = q2[a]
            quad = quads[a, :, first:last]
            np.add(q[0], q[1], out=quad[0])
            quad[0] += q[2]
            np.subtract(q[1], q[2], out=quad[1])
            quad[1] -= q[3]
        if not exact:
            np.copyto(y[:, first:last], target[:, first:last, :oh, :ow])

    run_parallel(transform_output, m, work=16 * m * tiles * 2, least=MIN_PARALLEL_ELEMENTS)
