"""Intra-op parallelism: the CPU device's threads inside one kernel.

Each compiled model has *intra-op threads* per stream (all cores with the LATENCY hint,
one with THROUGHPUT, where the streams already use the cores). BLAS runs on one thread
by default: a large matrix product switches it to the intra-op threads for its call
(:func:`blas_threads`), everything else with enough independent work (matrices of a
stack, chunks of an elementwise pass, rows of a normalisation, input channels of
im2col) is split with :func:`run_parallel` between Python threads. numpy releases the
GIL inside its loops and BLAS calls, so the parts really run at the same time.

Why not BLAS threads everywhere: OpenBLAS wakes its threads for every call, also for
small ones, and busy-waits for them. Products of a few thousand multiply-adds (an LSTM
step, a classifier's batch-1 Gemm) took 5-400x longer with two OpenBLAS threads than with
one on a loaded 2-core machine, and stacks of small matrices (attention) 10-20x longer.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from threadpoolctl import ThreadpoolController

MIN_PARALLEL_ELEMENTS = 1 << 16
"""Below this many elements of work, handing parts to other threads costs more than it
saves; kernels run such work in the calling thread."""


class _Pool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._workers = 0
        self._inside = threading.local()
        self._blas: list[Any] | None = None
        self.threads = 1

    def blas(self) -> list[Any]:
        if self._blas is None:
            with self._lock:
                if self._blas is None:
                    controller = ThreadpoolController().select(user_api="blas")
                    self._blas = list(controller.lib_controllers)
        return self._blas

    def executor(self, workers: int) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None or self._workers < workers:
                # An older, smaller executor finishes what it has and its threads exit.
                self._executor = ThreadPoolExecutor(workers, "aioinfer-intra-op")
                self._workers = workers
            return self._executor

    def run(self, task: Callable[[int, int], None], total: int, threads: int) -> None:
        bounds = [total * i // threads for i in range(threads + 1)]
        first, *others = itertools.pairwise(bounds)
        executor = self.executor(threads - 1)
        futures: list[Future[None]] = [
            executor.submit(self.part, task, start, stop) for start, stop in others
        ]
        try:
            self.part(task, *first)
        finally:
            for future in futures:
                future.result()

    def part(self, task: Callable[[int, int], None], start: int, stop: int) -> None:
        self._inside.active = True
        try:
            task(start, stop)
        finally:
            self._inside.active = False

    def available(self) -> int:
        return 1 if getattr(self._inside, "active", False) else self.threads


_POOL = _Pool()


def set_intra_op_threads(threads: int) -> None:
    """Let kernels split their work between ``threads`` threads, and make BLAS
    single-threaded outside :func:`blas_threads`. Process-wide, like BLAS settings: the
    model compiled last sets it."""
    for lib in _POOL.blas():
        lib.set_num_threads(1)
    _POOL.threads = max(1, threads)


@contextlib.contextmanager
def blas_threads() -> Iterator[None]:
    """BLAS on the intra-op threads for the calls inside (one large product), then back
    on one thread. Inside a part of a split it stays on one."""
    threads = _POOL.available()
    if threads <= 1:
        yield
        return
    libs = _POOL.blas()
    for lib in libs:
        lib.set_num_threads(threads)
    try:
        yield
    finally:
        for lib in libs:
            lib.set_num_threads(1)


def intra_op_threads() -> int:
    """Threads a kernel may split its work between now (1: do not split; also inside a
    part of a split, which never splits again)."""
    return _POOL.available()


def run_parallel(task: Callable[[int, int], None], total: int, *, work: int) -> None:
    """Run ``task(start, stop)`` over contiguous parts of ``range(total)``.

    The parts run on :func:`intra_op_threads` threads (the caller's among them) when
    ``work`` (elements touched in all) is at least :data:`MIN_PARALLEL_ELEMENTS`, else
    ``task(0, total)`` runs in the calling thread. The first exception of a part
    propagates, once every part has finished.
    """
    threads = min(_POOL.available(), total)
    if threads <= 1 or work < MIN_PARALLEL_ELEMENTS:
        task(0, total)
        return
    _POOL.run(task, total, threads)
