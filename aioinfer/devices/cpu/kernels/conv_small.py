"""Small convolutions of one image: the per-call work bound once per input shape.

The convolutions of speech models are small: Silero VAD's five (129 channels of 3
samples into 128 filters of 3 taps, down to 128 channels of one sample into one filter)
each compute in 1-5 us, and the general path of :func:`.conv.conv_compute` around the
product (the geometry looked up, the column buffers found, dtypes and shapes checked,
the bias cast and broadcast, the epilogue's calls) cost 6-9 us more. A
:class:`SmallConv` holds everything that depends only on the input's shape: the
zero-padded input buffer with its borders written once, the window view that fills the
columns, the columns, the weight matrix and the bias as a column. A call is two copies, one BLAS
product and the bias (kernel alone, fastest of 7 x 3000 calls, with its epilogue):
silero's 129x3 -> 128 convolution with ReLU 14.1 -> 10.8-11.3 us, its strided 64x2 one
7.9 -> 5.0 us, its one-filter head with a Sigmoid 9.3 -> 4.1 us (with the one-element
sigmoid of :mod:`.fused`).

The product is the general path's (the weight matrix times the columns, the bias added
after it), so the values are the same bit for bit; except that the general path
multiplies one pixel's column the other way round (``cols.T @ W.T``), where BLAS may sum
in another order (equal within rounding).
"""

from __future__ import annotations

import numpy as np


class SmallConv:
    """The convolution of one image of one input shape by a constant weight matrix
    (one group), into columns kept between calls. Not thread-safe: one per thread."""

    __slots__ = ("bias", "bias_const", "cols", "filled", "interior", "matrix", "out_shape", "view")

    def __init__(
        self,
        interior: np.ndarray,
        view: np.ndarray,
        filled: np.ndarray,
        matrix: np.ndarray,
        out_shape: tuple[int, ...],
        bias_const: np.ndarray | None,
    ) -> None:
        """``interior``: where the image goes in the zero-padded input; ``view``: the
        window view of that input; ``filled``: the (contiguous) columns it is copied
        into (the buffers of :class:`.conv._Columns` for the image's shape)."""
        self.interior = interior
        self.view = view
        self.filled = filled
        self.cols = filled.reshape(matrix.shape[1], -1)
        self.matrix = matrix
        self.out_shape = (1, matrix.shape[0], *out_shape)
        self.bias_const = bias_const
        self.bias = None if bias_const is None else self.column(bias_const)
        """The constant bias as a column of the output's dtype."""

    def column(self, b: np.ndarray) -> np.ndarray:
        """``b`` as a column that broadcasts over the output's channels."""
        return b.astype(self.cols.dtype).reshape(-1, *(1,) * (len(self.out_shape) - 2))

    def __call__(self, x: np.ndarray, b: np.ndarray | None, out: np.ndarray | None) -> np.ndarray:
        """The convolution of ``x`` (of the bound shape) plus ``b``, into ``out`` when it
        has the output's shape and dtype."""
        if out is None or out.shape != self.out_shape or out.dtype != self.cols.dtype:
            out = np.empty(self.out_shape, self.cols.dtype)
        np.copyto(self.interior, x)
        np.copyto(self.filled, self.view)
        np.matmul(self.matrix, self.cols, out=out.reshape(self.matrix.shape[0], -1))
        if b is not None:
            out[0] += self.bias if b is self.bias_const else self.column(b)
        return out
