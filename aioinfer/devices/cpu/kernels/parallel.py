"""Intra-op parallelism: the CPU device's threads inside one kernel.

Each compiled model has its own *intra-op threads* per stream (all cores with the
LATENCY hint, one with THROUGHPUT, where the streams already use the cores), set for the
thread that runs its plan at each run (:func:`use_intra_op_threads`). BLAS always runs on one
thread; work with enough independent parts (column blocks of a large matrix product,
matrices of a stack, chunks of an elementwise pass, rows of a normalisation, input
channels of im2col) is split with :func:`run_parallel` between Python threads. numpy
releases the GIL inside its loops and BLAS calls, so the parts really run at the same
time.

Why not BLAS's own threads: OpenBLAS wakes its threads for every call and busy-waits
for them. On a loaded 2-core machine, products of a few thousand multiply-adds (an LSTM
step, a classifier's batch-1 Gemm) took 5-400x longer with two OpenBLAS threads than
with one, stacks of small matrices (attention) 10-20x longer, and even large products
(64x1024x1024, 128x1152x784) 8-90x longer, while the same products split in two column
blocks on this pool took 0.7-4x the one-thread time.

Parts are claimed dynamically: every thread, the caller's included, takes the next
unclaimed part until none is left, and helpers that have not started when the caller
runs out of parts are cancelled. A helper the OS does not schedule (another process
holds the core) therefore delays the call by at most the part it is running, never by
parts it has not begun.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from threadpoolctl import ThreadpoolController

MIN_PARALLEL_ELEMENTS = 1 << 20
"""Below this many elements of work, handing parts to other threads costs more than it
saves; kernels run such work in the calling thread. A bias and Relu over 64 x 1024 took
13 us inline and 28-78 us split; with 1M instead of 64K as the bound (quiet, the same
compiled models alternating in one process), PP-LCNet's inference took 0.85x the time,
PP-OCR's classifier 0.86x, SqueezeNet 0.92x, openWakeWord's embedding 0.91x, the MLP
0.95x, BERT, ResNet-18 and the detectors 0.95-1.00x; at 4M BERT lost (1.17x)."""
MIN_PARALLEL_MACS = 1 << 24
"""The same bound for matrix products (counted in multiply-adds) and the column copies and
transpositions around them. A split costs two thread hand-offs on this kind of machine
(the helper's wake-up, and the caller's once the helper's last part is done): the helper
starts its part 37 us after the call when splits follow each other, 70-84 us after 2-10
ms without one (its vCPU halted), and each part runs 1.2-1.5x slower than alone: a 256
-> 256 1x1 convolution on 14x14 (12.8M multiply-adds) took 138 us on one thread and 172
us split in two. With 4M instead of 1M (quiet, alternating in one process):
openWakeWord's embedding 0.82x the time, PP-OCR's classifier 0.84x, PP-LCNet 0.88x,
SqueezeNet 0.90x, the other models 0.96-1.01x; with 16M instead of 4M (2026-12-01,
quiet, alternating fresh processes, two or three rounds): PP-LCNet 0.87-0.95x, PicoDet's
layout model 0.85-0.90x, openWakeWord's embedding 0.85-0.93x, ResNet-18 0.86-1.01x,
PP-OCR's detector 0.92-1.02x, SqueezeNet 1.02-1.08x, the other models within the noise
(0.96-1.04x); 32M instead of 16M was a wash (2026-12-01, quiet, three rounds of
alternating processes), 64M took 1.09-1.25x the time on BERT, the ResNets, the MLP and
PicoDet's layout model."""


class _ThreadState(threading.local):
    active = False
    """The thread runs a part of a split (which never splits again)."""
    threads = 0
    """Intra-op threads of the plan this thread runs (0: the process default)."""


class _Pool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._workers = 0
        self._inside = _ThreadState()
        self._blas: list[Any] | None = None
        self.threads = 1
        """The process default, for kernels run outside a compiled model's plan."""

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

    def run(
        self, task: Callable[[int, int], None], total: int, threads: int, parts: int, align: int
    ) -> None:
        bounds = sorted({min(total, total * i // parts // align * align) for i in range(parts)})
        pieces = list(itertools.pairwise([*bounds, total]))
        parts = len(pieces)
        claims = itertools.count()
        lock = threading.Lock()

        def claim_parts() -> None:
            while True:
                with lock:
                    index = next(claims)
                if index >= parts:
                    return
                self.part(task, *pieces[index])

        executor = self.executor(threads - 1)
        futures: list[Future[None]] = [executor.submit(claim_parts) for _ in range(threads - 1)]
        try:
            claim_parts()
        finally:
            for future in futures:
                if not future.cancel():  # a helper that never started has nothing to do
                    future.result()

    def part(self, task: Callable[[int, int], None], start: int, stop: int) -> None:
        self._inside.active = True
        try:
            task(start, stop)
        finally:
            self._inside.active = False

    def available(self) -> int:
        inside = self._inside
        return 1 if inside.active else inside.threads or self.threads


_POOL = _Pool()


def set_intra_op_threads(threads: int) -> None:
    """Make BLAS single-threaded, and let kernels run outside a compiled model's plan
    (constant folding at compile time) split their work between ``threads`` threads.
    A plan's run uses its compiled model's own count (:func:`use_intra_op_threads`)."""
    for lib in _POOL.blas():
        lib.set_num_threads(1)
    _POOL.threads = max(1, threads)


def use_intra_op_threads(threads: int) -> None:
    """Let the kernels the calling thread runs from now on split their work between
    ``threads`` threads: a compiled model's request calls it before each run of its
    plan, so every compiled model keeps its own count (two models compiled with
    different hints or ``INFERENCE_NUM_THREADS`` do not change each other's)."""
    _POOL._inside.threads = max(1, threads)


def blas_architectures() -> frozenset[str]:
    """The kernels (OpenBLAS's core type, ``threadpoolctl``'s architecture) of the BLAS
    libraries loaded in the process; empty when none reports one."""
    return frozenset(
        str(lib.architecture) for lib in _POOL.blas() if getattr(lib, "architecture", None)
    )


def intra_op_threads() -> int:
    """Threads a kernel may split its work between now (1: do not split; also inside a
    part of a split, which never splits again)."""
    return _POOL.available()


def run_parallel(
    task: Callable[[int, int], None],
    total: int,
    *,
    work: int,
    parts_per_thread: int = 1,
    align: int = 1,
    least: int = MIN_PARALLEL_ELEMENTS,
) -> None:
    """Run ``task(start, stop)`` over contiguous parts of ``range(total)``.

    The parts (``parts_per_thread`` per thread, at most ``total``) run on
    :func:`intra_op_threads` threads, the caller's among them, each thread claiming the
    next part when it is free, when ``work`` (elements touched in all) is at least
    :data:`MIN_PARALLEL_ELEMENTS`; else ``task(0, total)`` runs in the calling thread.
    Parts start at multiples of ``align``. The first exception of a part propagates, once
    every started part has finished.
    """
    threads = min(_POOL.available(), total)
    if threads <= 1 or work < least:
        task(0, total)
        return
    parts = min(total, threads * max(1, parts_per_thread))
    _POOL.run(task, total, threads, parts, max(1, align))
