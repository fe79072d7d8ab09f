"""benchmarks/thread_handoff.py: the split it times computes the product it splits.

The benchmark times the CPU device's split of one product between two threads; these
tests check that the blocks it hands to the threads (the device's own row or column
blocks, and the timeline's blocks) make up the whole product, against numpy's one
call. Times are measured by the benchmark, never asserted.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from aioinfer.devices.cpu.kernels import parallel
from benchmarks import thread_handoff


@pytest.fixture
def two_threads() -> Iterator[None]:
    previous = parallel.intra_op_threads()
    parallel.use_intra_op_threads(2)
    try:
        yield
    finally:
        parallel.use_intra_op_threads(previous)


# Above the device's SPLIT_PRODUCT (2M multiply-adds), so that they are split: 200 rows
# by rows; 40 rows by columns where the BLAS splits columns exactly; a row vector by
# columns.
SHAPES = [(200, 128, 96), (40, 256, 300), (1, 2048, 1100)]


def _operands(m: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``a``, ``b`` and an output full of NaN (a block left unwritten stays NaN)."""
    rng = np.random.default_rng(m * n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    return a, b, np.full((m, n), np.nan, np.float32)


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_split_product_is_the_product(two_threads: None, m: int, k: int, n: int) -> None:
    a, b, out = _operands(m, k, n)
    thread_handoff.split_product(a, b, out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_timeline_blocks_cover_the_product(two_threads: None, m: int, k: int, n: int) -> None:
    a, b, out = _operands(m, k, n)
    line = thread_handoff.timeline(a, b, out, runs=5, gap=0.0)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    # Either both threads ran a part in some run (then every event is a time), or none.
    values = [line.caller_start, line.caller_part, line.helper_start, line.helper_part]
    assert all(np.isnan(values)) or all(v >= 0 for v in values)


def test_shapes_are_split() -> None:
    assert all(m * k * n >= thread_handoff.matmul.SPLIT_PRODUCT for m, k, n in SHAPES)


def test_split_restores_the_bound() -> None:
    bound = thread_handoff.matmul.MIN_PARALLEL_MACS
    a = np.ones((30, 4), np.float32)
    thread_handoff.split_product(a, a.T.copy(), np.empty((30, 30), np.float32))
    assert bound == thread_handoff.matmul.MIN_PARALLEL_MACS
