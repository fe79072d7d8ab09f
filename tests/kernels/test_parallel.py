"""Intra-op parallelism: parts cover the work once, errors propagate, BLAS is restored."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from aioinfer.devices.cpu.kernels.matmul import stacked_matmul
from aioinfer.devices.cpu.kernels.parallel import (
    MIN_PARALLEL_ELEMENTS,
    intra_op_threads,
    run_parallel,
)


@pytest.fixture
def two_blas_threads() -> object:
    with threadpool_limits(limits=2, user_api="blas"):
        yield


def _blas_threads() -> list[int]:
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


@pytest.mark.usefixtures("two_blas_threads")
def test_parts_cover_the_range_once_on_several_threads() -> None:
    seen: list[tuple[int, int, str]] = []
    lock = threading.Lock()

    def task(start: int, stop: int) -> None:
        with lock:
            seen.append((start, stop, threading.current_thread().name))
        assert intra_op_threads() == 1  # a part never splits again

    run_parallel(task, 10, work=MIN_PARALLEL_ELEMENTS, blas_single=True)
    covered = sorted(i for start, stop, _ in seen for i in range(start, stop))
    assert covered == list(range(10))
    assert len({name for *_, name in seen}) == min(2, intra_op_threads())
    assert _blas_threads() == [2] * len(_blas_threads())  # restored


@pytest.mark.usefixtures("two_blas_threads")
def test_small_work_runs_in_the_caller_and_errors_propagate() -> None:
    calls: list[tuple[int, int]] = []
    run_parallel(lambda a, b: calls.append((a, b)), 10, work=MIN_PARALLEL_ELEMENTS - 1)
    assert calls == [(0, 10)]

    def failing(start: int, stop: int) -> None:
        if start > 0:
            raise ValueError("part failed")

    with pytest.raises(ValueError, match="part failed"):
        run_parallel(failing, 10, work=MIN_PARALLEL_ELEMENTS, blas_single=True)
    assert _blas_threads() == [2] * len(_blas_threads())


@pytest.mark.usefixtures("two_blas_threads")
@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [((96, 128, 32), (96, 32, 128)), ((1, 12, 64, 16), (2, 1, 16, 64)), ((3, 1, 8, 4), (5, 4, 2))],
)
def test_stacked_matmul_matches_numpy(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    np.testing.assert_allclose(stacked_matmul(a, b, None), a @ b, rtol=1e-5, atol=1e-5)
    out = np.empty(
        (*np.broadcast_shapes(a_shape[:-2], b_shape[:-2]), a_shape[-2], b_shape[-1]), np.float32
    )
    assert stacked_matmul(a, b, out) is out
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
