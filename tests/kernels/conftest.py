"""Fixtures the kernel tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aioinfer.devices.cpu.kernels import parallel
from tests.kernels._check import split_small_products


@pytest.fixture(params=[1, 2], ids=["one-thread", "two-threads"])
def threads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """Kernels run with one or two intra-op threads (the calling thread's count), BLAS on
    one thread as the device runs it; test-sized products split between the two."""
    split_small_products(monkeypatch)
    before = parallel._POOL._inside.threads
    parallel.set_intra_op_threads(parallel._POOL.threads)
    parallel.use_intra_op_threads(request.param)
    yield request.param
    parallel._POOL._inside.threads = before
