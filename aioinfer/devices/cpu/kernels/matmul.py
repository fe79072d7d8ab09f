"""Matrix product kernels: MatMul, Gemm and MatMulInteger, all on BLAS-backed np.matmul."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import numpy as np

from aioinfer.devices.cpu.kernels.parallel import (
    MIN_PARALLEL_ELEMENTS,
    MIN_PARALLEL_MACS,
    blas_architectures,
    intra_op_threads,
    run_parallel,
)
from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, OutKernel, kernel, out_kernel


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.matmul`` with fast paths: float16 in float32 BLAS, one GEMM for a stack times
    a matrix, large products split in blocks between threads, stacks split too."""
    if a.dtype == b.dtype and (a.dtype == np.float16 or a.dtype.kind == "V"):
        # float16 and the ml_dtypes floats (bfloat16, float8) run in float32 BLAS.
        return _matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
    if a.ndim < 2 or b.ndim < 2 or a.dtype != b.dtype or a.dtype not in _BLAS_DTYPES:
        return np.asarray(np.matmul(a, b))
    return matmul_into(a, b, None)


_BLAS_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
SPLIT_PRODUCT = 1 << 21
"""Multiply-adds from which one matrix product is split between the intra-op threads
(below, handing parts to other threads costs about what it saves)."""
PARTS_PER_THREAD = 2
"""Blocks per thread of a split product: a thread that runs late leaves its second
block to the others."""
ROW_ALIGN = 24
"""Row blocks of a split product start at multiples of this: OpenBLAS's kernels then
meet every row as in one call, and the product is bit for bit that of one call whatever
the number of threads (checked on float32 and float64 products of 25-4096 rows, plain
and transposed right operands, with OpenBLAS's SkylakeX and Haswell kernels; 8- and
16-row blocks are not: Haswell's float32 and SkylakeX's float64 kernels work on rows in
groups that 24 divides)."""
MIN_BLOCK_PRODUCT = 1 << 20
"""Multiply-adds every block of a split product has at least: OpenBLAS (SkylakeX) runs
products of at most 1e6 multiply-adds through other kernels, whose rounding differs, so
a smaller block would not be bit for bit the rows of one call."""
COLUMN_ALIGN = 32
"""Column blocks of a split row vector times a matrix (BLAS's gemv) start at multiples
of this: bit for bit the product of one call."""
COLUMN_BLOCK_ALIGN = 64
"""Column blocks of a split product of 2-95 rows start at multiples of this. Only where
they are bit for bit one call's columns: float32 on OpenBLAS's SkylakeX kernels (checked
on ~4,600 products of 2-95 rows, plain and transposed right operands, 2 and 4 blocks);
not with Haswell's float32 kernel (its values move by rounding wherever the split falls)
nor SkylakeX's float64 one (on some odd widths)."""
COLUMN_SPLIT_KERNELS = frozenset({"SkylakeX"})
"""The OpenBLAS kernels (``threadpoolctl``'s architecture) whose float32 products split by
columns (:data:`COLUMN_BLOCK_ALIGN`) bit for bit."""


def aligned_blocks(
    total: int, unit_work: int, align: int, blocks: int, least_units: int = 1
) -> list[tuple[int, int]]:
    """At most ``blocks`` contiguous blocks of ``range(total)`` starting at multiples of
    ``align``, each at least ``least_units`` long and :data:`MIN_BLOCK_PRODUCT`
    multiply-adds (``unit_work`` per unit); one block when no split qualifies."""
    least = max(least_units, -(-MIN_BLOCK_PRODUCT // max(1, unit_work)))
    step = -(-least // align) * align
    aligned = range(0, total, step)
    starts = sorted({aligned[i * len(aligned) // blocks] for i in range(blocks)})
    bounds = list(itertools.pairwise([*starts, total]))
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < least:
        bounds[-2:] = [(bounds[-2][0], total)]  # the last block is the only short one
    return bounds


def row_blocks(m: int, k: int, n: int, blocks: int) -> list[tuple[int, int]]:
    """Row blocks of an ``m x k @ k x n`` product that split it bit for bit (see
    :func:`aligned_blocks`, :data:`ROW_ALIGN`); each has two rows or more, since numpy
    runs a one-row product through gemv, not gemm."""
    return aligned_blocks(m, k * n, ROW_ALIGN, blocks, least_units=2)


def column_blocks(m: int, k: int, n: int, blocks: int) -> list[tuple[int, int]]:
    """Column blocks of an ``m x k @ k x n`` float32 product (see
    :data:`COLUMN_BLOCK_ALIGN`, :func:`columns_split_exactly`)."""
    return aligned_blocks(n, m * k, COLUMN_BLOCK_ALIGN, blocks)


@functools.cache
def columns_split_exactly() -> bool:
    """Whether float32 products split by columns bit for bit here: every BLAS library
    numpy may call runs one of :data:`COLUMN_SPLIT_KERNELS`."""
    kernels = blas_architectures()
    return bool(kernels) and kernels <= COLUMN_SPLIT_KERNELS


def product_blocks(a: np.ndarray, b: np.ndarray, parts: int) -> tuple[list[tuple[int, int]], bool]:
    """The blocks (at most ``parts``) :func:`gemm_2d` splits ``a @ b`` of two or more
    rows into, and whether they are blocks of rows (else of columns)."""
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    if m < 4 * ROW_ALIGN and a.dtype == np.float32 and columns_split_exactly():
        return column_blocks(m, k, n, parts), False
    return row_blocks(m, k, n, parts), True


def gemm_2d(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[...] = a @ b`` for 2-D operands: one single-threaded BLAS call for a small
    product; a large one split into blocks of ``out``'s rows or columns, each block a
    BLAS call on one of the intra-op threads (see :mod:`.parallel` for why not BLAS's own
    threads).

    Splits keep results bit for bit independent of the thread count, which a
    classifier's softmax over huge, equal logits (the onnx package's light models)
    depends on: row blocks (:data:`ROW_ALIGN`, :data:`MIN_BLOCK_PRODUCT`); column
    blocks for a row vector (:data:`COLUMN_ALIGN`) and, where they are exact
    (:data:`COLUMN_BLOCK_ALIGN`), for float32 products of 2 to 95 rows, whose row blocks
    would each pack the whole right operand again (a 64-row product in 24-row blocks
    gains nothing on SkylakeX; in two column blocks, 2x). Elsewhere a product of 2 to 24
    rows runs in one call.
    """
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    threads = intra_op_threads()
    if m * k * n < SPLIT_PRODUCT or threads <= 1:
        np.matmul(a, b, out=out)
        return out
    parts = PARTS_PER_THREAD * threads
    if m == 1:

        def vector(start: int, stop: int) -> None:
            np.matmul(a, b[:, start:stop], out=out[:, start:stop])

        per = max(1, min(PARTS_PER_THREAD, n // (COLUMN_ALIGN * threads)))
        run_parallel(
            vector,
            n,
            work=m * k * n,
            parts_per_thread=per,
            align=COLUMN_ALIGN,
            least=MIN_PARALLEL_MACS,
        )
        return out
    bounds, by_rows = product_blocks(a, b, parts)
    if len(bounds) == 1:
        np.matmul(a, b, out=out)
        return out

    def blocks(first: int, last: int) -> None:
        start, stop = bounds[first][0], bounds[last - 1][1]
        if by_rows:
            np.matmul(a[start:stop], b, out=out[start:stop])
        else:
            np.matmul(a, b[:, start:stop], out=out[:, start:stop])

    run_parallel(
        blocks,
        len(bounds),
        work=m * k * n,
        parts_per_thread=PARTS_PER_THREAD,
        least=MIN_PARALLEL_MACS,
    )
    return out


def stacked_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """``a @ b`` for stacks of matrices (both operands have batch axes), into ``out`` when
    given (it must have the product's shape and dtype).

    numpy calls BLAS once per matrix of a stack, and BLAS threads cost more than they
    save on small matrices: the stack is split between the intra-op threads along its
    first batch axis of size > 1, each part on single-threaded BLAS (a stack of one is a
    plain product).
    """
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if out is None:
        out = np.empty((*batch, a.shape[-2], b.shape[-1]), dtype=np.result_type(a, b))
    axis = next((i for i, n in enumerate(batch) if n > 1), None)
    if out.size == 0 or a.size == 0 or b.size == 0:
        np.matmul(a, b, out=out)
        return out
    if axis is None:
        gemm_2d(a.reshape(a.shape[-2:]), b.reshape(b.shape[-2:]), out.reshape(out.shape[-2:]))
        return out
    a = np.broadcast_to(a, (*batch, *a.shape[-2:]))
    b = np.broadcast_to(b, (*batch, *b.shape[-2:]))
    lead = (slice(None),) * axis

    def part(start: int, stop: int) -> None:
        index = (*lead, slice(start, stop))
        np.matmul(a[index], b[index], out=out[index])

    work = a.shape[-2] * a.shape[-1] * b.shape[-1] * int(np.prod(batch))
    run_parallel(part, batch[axis], work=work, least=MIN_PARALLEL_MACS)
    return out


def matmul_into(a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """``a @ b`` written into ``out`` when it has the product's shape and dtype (a planned
    buffer), else into a new array (see :func:`gemm_2d` and :func:`stacked_matmul`)."""
    if a.ndim < 2 or b.ndim < 2 or a.dtype != b.dtype or a.dtype not in _BLAS_DTYPES:
        return _matmul(a, b)
    if a.size == 0 or b.size == 0:
        return np.asarray(np.matmul(a, b))
    if a.ndim == 2 and b.ndim == 2:  # (np.broadcast_shapes costs 3 us per call)
        shape: tuple[int, ...] = (a.shape[0], b.shape[1])
    else:
        shape = (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
    if out is not None and (out.shape != shape or out.dtype != a.dtype):
        out = None  # another shape than when the memory plan was made
    if out is None:
        out = np.empty(shape, dtype=a.dtype)
    if b.ndim == 2:
        # A stack times a matrix is one product: fold the stack into the rows.
        gemm_2d(a.reshape(-1, a.shape[-1]), b, out.reshape(-1, b.shape[1]))
        return out
    return stacked_matmul(a, b, out)


@kernel("MatMul", since=1)
def matmul(spec: NodeSpec) -> Kernel:
    """MatMul-1/9/13: numpy matmul semantics (1-D operands, broadcast batch dims)."""

    def run(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
        return (_matmul(a, b),)

    return run


@out_kernel(matmul)
def matmul_out(spec: NodeSpec) -> OutKernel:
    """MatMul writing into a planned buffer."""
    return lambda out, a, b: (matmul_into(a, b, out),)


SmallGemm = Callable[
    [np.ndarray | None, np.ndarray, np.ndarray, np.ndarray | None], np.ndarray | None
]
"""``small(out, a, b, c)``: the product of a Gemm with constant operands as
:func:`small_gemm` binds it, or None when these operands do not take that path."""


def small_gemm(spec: NodeSpec) -> SmallGemm | None:
    """The fast path of a Gemm (or FusedGemm) whose ``B`` and ``C`` are constants: a
    classifier's layers (openWakeWord's 1x1536 @ 1536x128, its 1x128 @ 128x1 head).

    Everything a general call checks per run is settled here once: ``C`` scaled by
    ``beta`` and known to broadcast over any number of rows, ``B`` transposed (a view).
    A run checks that ``a``, ``b`` and ``c`` are what the node was compiled for (the
    compile-time constants, by identity) and the product small enough for one BLAS
    call (below :data:`SPLIT_PRODUCT`; an output too small for a FusedGemm's epilogue
    to split between threads), then makes one matmul (into ``out`` when it
    has the product's shape) and one addition: the general path's calls, so the same
    values, without its 2-3 us of checks. None (at compile time) for a node whose
    attributes leave no such path: ``transA``, ``alpha != 1``, a ``B`` that is not a
    float matrix, a ``C`` that is not a constant row or scalar of B's dtype.
    """
    b_const = spec.const(1)
    c_const = spec.const(2)
    beta = float(spec.attr("beta", 1.0))
    if (
        spec.attr("transA", 0)
        or float(spec.attr("alpha", 1.0)) != 1.0
        or b_const is None
        or b_const.ndim != 2
        or b_const.dtype not in _BLAS_DTYPES
    ):
        return None
    matrix = b_const.T if spec.attr("transB", 0) else b_const
    k, n = matrix.shape
    dtype = matrix.dtype
    bias = None
    if c_const is not None and beta != 0.0:
        if c_const.dtype != dtype or c_const.ndim > 2 or c_const.shape[-1:] not in ((), (1,), (n,)):
            return None
        if c_const.ndim == 2 and c_const.shape[0] != 1:
            return None
        bias = c_const if beta == 1.0 else c_const * dtype.type(beta)

    def run(
        out: np.ndarray | None, a: np.ndarray, b: np.ndarray, c: np.ndarray | None
    ) -> np.ndarray | None:
        if (
            b is not b_const
            or c is not c_const
            or a.ndim != 2
            or a.shape[1] != k
            or a.dtype != dtype
            or a.shape[0] * k * n >= SPLIT_PRODUCT
            or a.shape[0] * n >= MIN_PARALLEL_ELEMENTS // 2
        ):
            return None
        shape = (a.shape[0], n)
        if out is None or out.shape != shape or out.dtype != dtype:
            out = np.empty(shape, dtype)
        np.matmul(a, matrix, out=out)
        if bias is not None:
            out += bias
        return out

    return run


def _gemm(spec: NodeSpec, planned: bool) -> Kernel:
    alpha = float(spec.attr("alpha", 1.0))
    beta = float(spec.attr("beta", 1.0))
    trans_a = bool(spec.attr("transA", 0))
    trans_b = bool(spec.attr("transB", 0))
    # (y shape, C shape) pairs known to broadcast: np.broadcast_shapes costs 3 us a call,
    # a quarter of a small Gemm (openWakeWord's 1x1536 @ 1536x128).
    fitting: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    small = small_gemm(spec)

    def run(
        out: np.ndarray | None, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None
    ) -> tuple[np.ndarray]:
        if small is not None:
            y = small(out, a, b, c)
            if y is not None:
                return (y,)
        if a.ndim != 2 or b.ndim != 2:
            raise ValueError(f"Gemm: A and B must be 2-D, got shapes {a.shape} and {b.shape}")
        y = _matmul(a.T if trans_a else a, b.T if trans_b else b)
        if beta == 0.0:
            c = None
        if c is not None and c.shape != y.shape and (y.shape, c.shape) not in fitting:
            if y.shape != np.broadcast_shapes(y.shape, c.shape):
                raise ValueError(f"Gemm: C of shape {c.shape} does not broadcast to {y.shape}")
            if len(fitting) < 64:
                fitting.add((y.shape, c.shape))
        if y.dtype.kind != "f":
            # Integer Gemm: scale in float64 like the definition, cast the sum once.
            if alpha == 1.0 and beta == 1.0:
                return (y if c is None else y + c,)
            total = y * alpha if c is None else y * alpha + c * beta
            return (total.astype(y.dtype),)
        if alpha != 1.0:
            y *= y.dtype.type(alpha)
        if c is not None:
            y += c if beta == 1.0 else c * y.dtype.type(beta)
        return (y,)

    if planned:
        return run
    return lambda a, b, c=None: run(None, a, b, c)


@kernel("Gemm", since=1)
def gemm(spec: NodeSpec) -> Kernel:
    """Gemm-1/6/7/9/11/13: ``alpha * A' @ B' + beta * C`` with optional transposes.

    Before opset 7 the ``broadcast`` attribute governs C; C is broadcast either way, since
    a C that already has the output shape is unaffected. C is optional from opset 11.
    """
    return _gemm(spec, planned=False)


@out_kernel(gemm)
def gemm_out(spec: NodeSpec) -> OutKernel:
    """Gemm writing its small products with constant operands (:func:`small_gemm`) into
    a planned buffer; other products allocate theirs."""
    return _gemm(spec, planned=True)


@kernel("MatMulInteger", since=10)
def matmul_integer(spec: NodeSpec) -> Kernel:
    """MatMulInteger-10: (A - a_zero_point) @ (B - b_zero_point) in int32.

    The product runs in float64 BLAS, exact for 8-bit operands (every partial sum stays
    far below 2**53), instead of numpy's slow integer matmul loop.
    """

    def run(
        a: np.ndarray,
        b: np.ndarray,
        a_zero_point: np.ndarray | None = None,
        b_zero_point: np.ndarray | None = None,
    ) -> tuple[np.ndarray]:
        a64 = a.astype(np.float64)
        if a_zero_point is not None:
            zero = np.asarray(a_zero_point, dtype=np.float64)
            if zero.ndim == 1 and a.ndim >= 2:
                zero = zero.reshape(-1, 1)  # one zero point per row of A
            a64 -= zero
        b64 = b.astype(np.float64)
        if b_zero_point is not None:
            b64 -= np.asarray(b_zero_point, dtype=np.float64)  # one per column of B
        return (_matmul(a64, b64).astype(np.int32),)

    return run
