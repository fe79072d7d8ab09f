"""Spatial sampling kernels: GridSample (any number of spatial axes) and AffineGrid.

GridSample reads ``X`` (N, C, D1, ..., Dr) at the normalized positions of ``grid``
(N, O1, ..., Or, r), whose last axis lists the coordinates innermost axis first (x, y,
z). A coordinate of -1 / +1 is the first / last pixel's center with ``align_corners``,
else its outer edge. Positions outside the image are clamped (``border``), mirrored
(``reflection``) or read as zeros; interpolation is ``nearest`` (half to even),
``linear`` or ``cubic`` (Keys, a = -0.75), separable over the axes and vectorized over
all output positions: each output sums ``taps ** r`` weighted gathers.
"""

from __future__ import annotations

import itertools

import numpy as np

from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel

_CUBIC_A = -0.75


def _reflect(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """Mirror ``x`` at ``low`` and ``high`` until it lies between them."""
    span = high - low
    if span <= 0:
        return np.full_like(x, low)
    below = x < low
    distance = np.where(below, low - x, x - high)
    bounces = np.floor(distance / span)
    rest = distance - bounces * span
    even = bounces % 2 == 0
    inside_from_low = np.where(even, low + rest, high - rest)
    inside_from_high = np.where(even, high - rest, low + rest)
    mirrored = np.where(below, inside_from_low, inside_from_high)
    return np.where((x < low) | (x > high), mirrored, x)


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
    """Keys' cubic convolution weights of the taps at -1, 0, 1, 2 for a fraction t."""
    a = _CUBIC_A

    def near(d: np.ndarray) -> np.ndarray:  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d: np.ndarray) -> np.ndarray:  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _axis_taps(
    x: np.ndarray, size: int, mode: str, padding: str, align_corners: bool
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(index, weight) of each tap along one spatial axis, for every output position."""
    low, high = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
    if mode == "nearest":
        x = np.rint(x)
    if padding == "border":
        x = np.where((x < low) | (x > high), np.clip(x, 0, size - 1), x)
    elif padding == "reflection":
        x = _reflect(x, low, high)
    if mode == "nearest":
        taps = [np.trunc(x).astype(np.int64)]
        weights = [np.ones_like(x)]
    else:
        start = np.floor(x)
        t = x - start
        base = start.astype(np.int64)
        if mode == "linear":
            taps, weights = [base, base + 1], [1 - t, t]
        else:
            taps, weights = [base - 1, base, base + 1, base + 2], _cubic_weights(t)
    result = []
    for index, weight in zip(taps, weights):
        if padding == "zeros":
            weight = weight * ((index >= 0) & (index < size))
        elif padding == "reflection":
            index = np.trunc(_reflect(index.astype(x.dtype), low, high)).astype(np.int64)
        result.append((np.clip(index, 0, size - 1), weight))
    return result


@kernel("GridSample", since=16)
def _grid_sample(spec: NodeSpec) -> Kernel:
    mode = spec.attr("mode", "linear" if spec.opset >= 20 else "bilinear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    padding = spec.attr("padding_mode", "zeros")
    align_corners = bool(spec.attr("align_corners", 0))
    if mode not in ("nearest", "linear", "cubic"):
        raise ValueError(f"mode must be nearest, linear or cubic, got {mode!r}")
    if padding not in ("zeros", "border", "reflection"):
        raise ValueError(f"padding_mode must be zeros, border or reflection, got {padding!r}")

    def run(x: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray]:
        dims = x.shape[2:]
        if grid.shape[-1] != len(dims) or grid.shape[0] != x.shape[0]:
            raise ValueError(f"grid of shape {grid.shape} does not fit X of shape {x.shape}")
        work = np.result_type(x.dtype, np.float32)
        axes = []
        for axis, size in enumerate(dims):
            normalized = grid[..., len(dims) - 1 - axis].astype(np.float32)
            if align_corners:
                position = (normalized + 1) / 2 * (size - 1)
            else:
                position = ((normalized + 1) * size - 1) / 2
            axes.append(_axis_taps(position.astype(work), size, mode, padding, align_corners))
        channels_last = np.moveaxis(x, 1, -1).astype(work, copy=False)  # (N, *dims, C)
        batch = np.arange(x.shape[0]).reshape((-1,) + (1,) * (grid.ndim - 2))
        out = np.zeros((*grid.shape[:-1], x.shape[1]), dtype=work)
        for taps in itertools.product(*axes):
            weight = np.ones(grid.shape[:-1], dtype=work)
            for _, tap_weight in taps:
                weight = weight * tap_weight
            index = (batch, *(tap_index for tap_index, _ in taps))
            out += weight[..., None] * channels_last[index]
        return (np.moveaxis(out, -1, 1).astype(x.dtype),)

    return run


@kernel("AffineGrid", since=20)
def _affine_grid(spec: NodeSpec) -> Kernel:
    """The normalized sampling grid of affine matrices ``theta`` (N, r, r + 1) for an
    output of ``size`` (N, C, D1, ..., Dr); coordinates innermost axis first."""
    align_corners = bool(spec.attr("align_corners", 0))

    def run(theta: np.ndarray, size: np.ndarray) -> tuple[np.ndarray]:
        dims = [int(d) for d in size[2:]]
        if theta.shape[1:] != (len(dims), len(dims) + 1):
            raise ValueError(f"theta of shape {theta.shape} does not fit a size of {size}")
        ticks = [
            np.linspace(-1, 1, d) if align_corners else (2 * np.arange(d) + 1) / d - 1 for d in dims
        ]
        mesh = np.meshgrid(*ticks, indexing="ij")
        base = np.stack([*mesh[::-1], np.ones(dims)], axis=-1)  # (*dims, r + 1): x, y, .., 1
        grid = np.einsum("...k,njk->n...j", base, theta.astype(np.float64))
        return (grid.astype(theta.dtype),)

    return run
