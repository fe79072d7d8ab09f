"""Intra-op parallelism for kernels that numpy runs on one core.

numpy's ufuncs and reductions use one thread, and its stacked matmuls call BLAS once per
small matrix, where BLAS threads cost more to wake than they save. A kernel with enough
independent work (rows, chunks, matrices of a stack) splits it with :func:`run_parallel`
between as many threads as the BLAS threads the compiled model configured (one per
core with the LATENCY hint; one in all, so no splitting, per stream with THROUGHPUT).
numpy releases the GIL inside its loops, so the parts really run at the same time.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from threadpoolctl import ThreadpoolController

MIN_PARALLEL_ELEMENTS = 1 << 16
"""Below this many elements of work, handing parts to other threads costs more than it
saves; kernels run such work in the calling thread."""


class _Pool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blas: list[Any] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._workers = 0
        self._inside = threading.local()

    def blas(self) -> list[Any]:
        if self._blas is None:
            with self._lock:
                if self._blas is None:
                    self._blas = list(
                        ThreadpoolController().select(user_api="blas").lib_controllers
                    )
        return self._blas

    def threads(self) -> int:
        if getattr(self._inside, "active", False):
            return 1  # a part of a split never splits again
        return min((lib.num_threads for lib in self.blas()), default=1)

    def executor(self, workers: int) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None or self._workers < workers:
                # An older, smaller executor finishes what it has and its threads exit.
                self._executor = ThreadPoolExecutor(workers, "aioinfer-intra-op")
                self._workers = workers
            return self._executor

    def run(
        self, task: Callable[[int, int], None], total: int, threads: int, blas_single: bool
    ) -> None:
        bounds = [total * i // threads for i in range(threads + 1)]
        executor = self.executor(threads - 1)
        libs = self.blas() if blas_single else []
        previous = [lib.num_threads for lib in libs]
        for lib in libs:
            lib.set_num_threads(1)
        try:
            first, *others = itertools.pairwise(bounds)
            futures: list[Future[None]] = [
                executor.submit(self._part, task, start, stop) for start, stop in others
            ]
            self._part(task, *first)
            for future in futures:
                future.result()
        finally:
            for lib, count in zip(libs, previous):
                lib.set_num_threads(count)

    def _part(self, task: Callable[[int, int], None], start: int, stop: int) -> None:
        self._inside.active = True
        try:
            task(start, stop)
        finally:
            self._inside.active = False


_POOL = _Pool()


def intra_op_threads() -> int:
    """Threads a kernel may split its work between now (1: do not split)."""
    return _POOL.threads()


def run_parallel(
    task: Callable[[int, int], None], total: int, *, work: int, blas_single: bool = False
) -> None:
    """Run ``task(start, stop)`` over contiguous parts of ``range(total)``.

    The parts run on :func:`intra_op_threads` threads (the caller's among them) when
    ``work`` (elements touched in all) is at least :data:`MIN_PARALLEL_ELEMENTS`, else
    ``task(0, total)`` runs in the calling thread. ``blas_single`` sets BLAS to one thread
    while the parts run (each part calls BLAS itself). Exceptions of a part propagate.
    """
    threads = min(_POOL.threads(), total)
    if threads <= 1 or work < MIN_PARALLEL_ELEMENTS:
        task(0, total)
        return
    _POOL.run(task, total, threads, blas_single)
