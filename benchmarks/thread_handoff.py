"""What splitting one matrix product between two threads costs the CPU device, and where.

    python -m benchmarks.thread_handoff [--runs 300] [--gap-us 500]

For products of the sizes the CPU device meets (a 1x1 convolution of 256 channels on
14x14, of 128 on 28x28, of 16 -> 32 on 112x112, an MLP layer of batch 64), three ways
are timed in alternating blocks:

- ``one``: one OpenBLAS call on one thread (the CPU device's product below its split
  bound, :data:`~aioinfer.devices.cpu.kernels.parallel.MIN_PARALLEL_MACS`);
- ``split``: the CPU device's split, :func:`~aioinfer.devices.cpu.kernels.matmul.gemm_2d`
  with its bound lowered to nothing (row blocks, or column blocks for fewer than 96 rows,
  claimed by its two intra-op threads: the caller's and a Python helper, woken per split);
- ``blas2``: OpenBLAS's own two threads, whose workers busy-wait between calls. The CPU
  device cannot use them: their count is one setting for the whole process (even
  ``openblas_set_num_threads_local`` in numpy's build), so two compiled models with
  different hints would change each other's, and a static split between two threads
  waits for a descheduled one on a loaded machine.

Then the timeline of ``split`` (medians over the runs, microseconds from the call): when
the caller's first part starts, how long it runs, when the helper's first part starts,
how long it runs, and the tail from the end of the last part to the return. The same
after ``--gap-us`` of busy work on the caller's thread (the helper idle meanwhile, as
between the products of an inference). The handoffs, not the halves, are the cost: the
helper cannot run Python (its part's slicing and the BLAS call) before the caller lets
go of the GIL, and the caller waits for its last part the same way.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from aioinfer.devices.cpu.kernels import matmul, parallel
from benchmarks.compare import machine, timed

SHAPES = ((256, 256, 196), (128, 128, 784), (32, 16, 12544), (64, 1024, 1024))
"""``(m, k, n)``: ``m x k`` weights times ``k x n`` columns."""


@dataclass(frozen=True)
class Timeline:
    """Medians (microseconds) of one split's events, from the call."""

    caller_start: float
    caller_part: float
    helper_start: float
    helper_part: float
    tail: float
    total: float


def _median_us(call: Callable[[], object], runs: int) -> float:
    return statistics.median(timed(call, runs)) * 1e6


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def split_product(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = a @ b`` split between the intra-op threads as the CPU device splits a
    product above its bound."""
    bound = matmul.MIN_PARALLEL_MACS
    matmul.MIN_PARALLEL_MACS = 0
    try:
        matmul.gemm_2d(a, b, out)
    finally:
        matmul.MIN_PARALLEL_MACS = bound


def timeline(a: np.ndarray, b: np.ndarray, out: np.ndarray, runs: int, gap: float) -> Timeline:
    """The split's events (see the module), over the runs in which both threads ran a
    part (the caller may claim every part before the helper wakes; all NaN when no
    run had both). The blocks are :func:`split_product`'s, one per thread: columns in
    steps of ``COLUMN_ALIGN`` for a row vector, else
    :func:`~aioinfer.devices.cpu.kernels.matmul.product_blocks`."""
    caller = threading.get_ident()
    seen: dict[str, tuple[float, float]] = {}
    threads = parallel.intra_op_threads()
    if a.shape[0] == 1:
        by_rows, size, align = False, b.shape[1], matmul.COLUMN_ALIGN
        bounds = None
    else:
        bounds, by_rows = matmul.product_blocks(a, b, threads)
        size, align = len(bounds), 1

    def block(first: int, last: int) -> None:
        begin = time.perf_counter()
        start, stop = (first, last) if bounds is None else (bounds[first][0], bounds[last - 1][1])
        if by_rows:
            np.matmul(a[start:stop], b, out=out[start:stop])
        else:
            np.matmul(a, b[:, start:stop], out=out[:, start:stop])
        who = "caller" if threading.get_ident() == caller else "helper"
        seen.setdefault(who, (begin, time.perf_counter()))

    events: list[tuple[float, ...]] = []
    for _ in range(runs):
        if gap:
            _busy(gap)
        seen.clear()
        called = time.perf_counter()
        parallel.run_parallel(block, size, work=0, least=0, align=align)
        returned = time.perf_counter()
        if len(seen) == 2:
            (c0, c1), (h0, h1) = seen["caller"], seen["helper"]
            events.append(
                (
                    c0 - called,
                    c1 - c0,
                    h0 - called,
                    h1 - h0,
                    returned - max(c1, h1),
                    returned - called,
                )
            )
    if not events:
        return Timeline(*([float("nan")] * 6))
    return Timeline(*(statistics.median(column) * 1e6 for column in zip(*events, strict=True)))


def _three_ways(
    a: np.ndarray, b: np.ndarray, out: np.ndarray, runs: int, blocks: int
) -> tuple[float, float, float]:
    """Medians (us) of ``one``, ``split`` and ``blas2`` (see the module), in alternating
    blocks of ``runs``."""
    times: dict[str, list[float]] = {"one": [], "split": [], "blas2": []}
    for _ in range(blocks):
        times["one"].append(_median_us(lambda: np.matmul(a, b, out=out), runs))
        times["split"].append(_median_us(lambda: split_product(a, b, out), runs))
        with threadpool_limits(2, user_api="blas"):
            times["blas2"].append(_median_us(lambda: np.matmul(a, b, out=out), runs))
    one, split, blas2 = (statistics.median(times[key]) for key in ("one", "split", "blas2"))
    return one, split, blas2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--gap-us", type=float, default=500.0)
    args = parser.parse_args()
    parallel.set_intra_op_threads(2)
    parallel.use_intra_op_threads(2)
    rng = np.random.default_rng(0)
    print(machine())
    print("| m x k x n | one us | split us | one/split | blas2 us | one/blas2 |")
    print("|---|---:|---:|---:|---:|---:|")
    lines = []
    for m, k, n in SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        out = np.empty((m, n), np.float32)
        one, split, blas2 = _three_ways(a, b, out, args.runs, args.blocks)
        print(
            f"| {m} x {k} x {n} | {one:.1f} | {split:.1f} | {one / split:.2f} "
            f"| {blas2:.1f} | {one / blas2:.2f} |"
        )
        for label, gap in (("back to back", 0.0), (f"after {args.gap_us:.0f} us", args.gap_us)):
            t = timeline(a, b, out, args.runs, gap * 1e-6)
            lines.append(
                f"{m}x{k}x{n} {label}: caller part at {t.caller_start:.1f} for "
                f"{t.caller_part:.1f}, helper part at {t.helper_start:.1f} for "
                f"{t.helper_part:.1f}, tail {t.tail:.1f}, total {t.total:.1f} us"
            )
    print()
    print("Split timelines (medians, us from the call):")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
