"""Intra-op parallelism: parts cover the work once, errors propagate, products split."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from threadpoolctl import threadpool_info

import aioinfer as ai
from aioinfer.devices.cpu.kernels import parallel
from aioinfer.devices.cpu.kernels.matmul import (
    MIN_BLOCK_PRODUCT,
    ROW_ALIGN,
    SPLIT_PRODUCT,
    gemm_2d,
    matmul_into,
    row_blocks,
    stacked_matmul,
)
from aioinfer.devices.cpu.kernels.parallel import (
    MIN_PARALLEL_ELEMENTS,
    intra_op_threads,
    run_parallel,
    set_intra_op_threads,
)
from tests.helpers import make_model, tensor_info


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = parallel._POOL.threads
    set_intra_op_threads(2)
    yield
    set_intra_op_threads(before)


@pytest.mark.usefixtures("two_threads")
def test_parts_cover_the_range_once_on_two_threads() -> None:
    seen: list[tuple[int, int, str]] = []
    lock = threading.Lock()
    second_started = threading.Event()

    def task(start: int, stop: int) -> None:
        with lock:
            seen.append((start, stop, threading.current_thread().name))
        if start == 0:  # hold the first part until another thread has taken the second
            second_started.wait(timeout=30)
        else:
            second_started.set()
        assert intra_op_threads() == 1  # a part never splits again

    run_parallel(task, 10, work=MIN_PARALLEL_ELEMENTS)
    assert sorted((start, stop) for start, stop, _ in seen) == [(0, 5), (5, 10)]
    assert len({name for *_, name in seen}) == 2


@pytest.mark.usefixtures("two_threads")
def test_a_thread_takes_the_parts_another_has_not_started() -> None:
    """Parts are claimed, not assigned: while a helper is busy, the caller runs every
    part that is left, and the call returns without waiting for the late helper."""
    executor = parallel._POOL.executor(1)
    helpers = parallel._POOL._workers  # occupy every helper of the pool
    busy = threading.Semaphore(0)
    release_helper = threading.Event()
    for _ in range(helpers):
        executor.submit(lambda: (busy.release(), release_helper.wait(30)))
    for _ in range(helpers):
        assert busy.acquire(timeout=30)
    seen: list[tuple[int, int, str]] = []
    try:
        run_parallel(
            lambda a, b: seen.append((a, b, threading.current_thread().name)),
            12,
            work=MIN_PARALLEL_ELEMENTS,
            parts_per_thread=3,
        )
    finally:
        release_helper.set()
    assert sorted((a, b) for a, b, _ in seen) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10), (10, 12)]
    assert {name for *_, name in seen} == {threading.current_thread().name}


@pytest.mark.usefixtures("two_threads")
def test_small_work_runs_in_the_caller_and_errors_propagate() -> None:
    calls: list[tuple[int, int]] = []
    run_parallel(lambda a, b: calls.append((a, b)), 10, work=MIN_PARALLEL_ELEMENTS - 1)
    assert calls == [(0, 10)]

    def failing(start: int, stop: int) -> None:
        if start > 0:
            raise ValueError("part failed")

    with pytest.raises(ValueError, match="part failed"):
        run_parallel(failing, 10, work=MIN_PARALLEL_ELEMENTS)
    run_parallel(lambda a, b: None, 10, work=MIN_PARALLEL_ELEMENTS)  # still usable


@pytest.mark.usefixtures("two_threads")
@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [
        ((96, 128, 32), (96, 32, 128)),
        ((1, 12, 64, 16), (2, 1, 16, 64)),
        ((3, 1, 8, 4), (5, 4, 2)),
        ((1, 1, 256, 96), (1, 96, 128)),
        ((4, 256, 256), (256, 64)),
    ],
)
def test_products_match_numpy(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    np.testing.assert_allclose(matmul_into(a, b, None), a @ b, rtol=1e-4, atol=1e-4)
    if len(b_shape) > 2:
        out = np.empty((a @ b).shape, np.float32)
        assert stacked_matmul(a, b, out) is out
        np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


def _blas_threads() -> set[int]:
    return {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}


@pytest.mark.usefixtures("two_threads")
@pytest.mark.parametrize(
    ("m", "k", "n"),
    [
        (256, 128, 96),
        (2, 1024, 2048),
        (3, 4, 5),
        (2048, 1024, 7),
        (64, 1024, 1000),
        (1, 4096, 1000),
        (1000, 2100, 70),
    ],
)
def test_gemm_2d_small_and_large(m: int, k: int, n: int) -> None:
    """Large products are split in row (or, for a row vector, column) blocks; BLAS stays
    on one thread; the result is bit for bit the product of one call."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k)).astype(np.float32).T  # a transposed (strided) operand
    out = np.empty((m, n), np.float32)
    assert gemm_2d(a, b, out) is out
    np.testing.assert_array_equal(out, a @ b)
    assert _blas_threads() == {1}


@pytest.mark.parametrize(
    ("m", "k", "n", "blocks"),
    [
        (64, 1024, 1024, 3),
        (40, 1024, 8210, 2),
        (25, 3000, 512, 1),
        (73, 37, 1000, 1),
        (1000, 64, 64, 3),
        (4096, 512, 512, 4),
    ],
)
def test_row_blocks_start_aligned_and_are_large_enough(m: int, k: int, n: int, blocks: int) -> None:
    """Row blocks cover the rows once, start at multiples of ROW_ALIGN and each has at
    least MIN_BLOCK_PRODUCT multiply-adds (OpenBLAS's small-matrix kernels round
    differently: 73 rows of 37x1000 stay whole, since 24 of them are below it) and two
    rows (numpy runs one row through gemv)."""
    bounds = row_blocks(m, k, n, 4)
    assert bounds[0][0] == 0 and bounds[-1][1] == m
    assert all(stop == start for (_, stop), (start, _) in itertools.pairwise(bounds))
    assert all(start % ROW_ALIGN == 0 for start, _ in bounds)
    assert all((stop - start) * k * n >= MIN_BLOCK_PRODUCT for start, stop in bounds)
    assert len(bounds) == blocks


@pytest.mark.usefixtures("two_threads")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_products_of_25_to_95_rows_split_bit_for_bit(dtype: type) -> None:
    """Products of 25-95 rows (an MLP's batch, a sequence's steps) split in row blocks
    are bit for bit the product of one call, with plain and transposed right operands,
    whatever the block sizes (the rows of one call are what a classifier's softmax over
    huge, equal logits needs)."""
    rng = np.random.default_rng(7)
    split = 0
    for m in range(25, 96, 2):
        k, n = (int(v) for v in rng.choice([37, 96, 300, 512, 1024, 3000], size=2))
        if m * k * n < SPLIT_PRODUCT:
            continue
        split += len(row_blocks(m, k, n, 4)) > 1
        a = rng.standard_normal((m, k)).astype(dtype)
        for b in (
            rng.standard_normal((k, n)).astype(dtype),
            rng.standard_normal((n, k)).astype(dtype).T,
        ):
            out = np.empty((m, n), dtype)
            gemm_2d(a, b, out)
            np.testing.assert_array_equal(out, a @ b, err_msg=f"{m}x{k}x{n}")
    assert split >= 10


def _other_threads_share(compiled: ai.CompiledModel, x: np.ndarray, runs: int = 5) -> list[float]:
    """Per run of the plan (on this thread): CPU time the process's other threads spent,
    as a share of this thread's."""
    request = compiled.create_infer_request()
    request.infer_sync({"x": x})
    shares = []
    for _ in range(runs):
        own, total = time.thread_time(), time.process_time()
        request.infer_sync({"x": x})
        own, total = time.thread_time() - own, time.process_time() - total
        shares.append((total - own) / own)
    return shares


def _product_model(width: int) -> tuple[onnx.ModelProto, np.ndarray]:
    """``y = x @ w`` with a constant random ``width x width`` weight, and the weight."""
    weight = np.random.default_rng(0).standard_normal((width, width)).astype(np.float32)
    model = make_model(
        [oh.make_node("MatMul", ["x", "w"], ["y"])],
        [tensor_info("x", np.float32, ["n", width])],
        [tensor_info("y", np.float32, ["n", width])],
        {"w": weight},
    )
    return model, weight


def test_each_compiled_model_keeps_its_own_intra_op_threads() -> None:
    """A model compiled for 2 intra-op threads splits its large product between two
    threads even after a model with 1 was compiled (the count was process-wide, so the
    model compiled last set it for every model), and the one-thread model does not
    split. Seen in CPU time: while a plan splits, another thread computes about as much
    as the calling one; while it does not, the other threads stay idle."""
    width = 512
    model, weight = _product_model(width)
    core = ai.Core()
    two = core.compile_model(
        model, "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 2}
    )
    one = core.compile_model(
        model, "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 1}
    )
    x = np.random.default_rng(1).standard_normal((1024, width)).astype(np.float32)
    np.testing.assert_allclose(
        two.create_infer_request().infer_sync({"x": x})["y"], x @ weight, rtol=1e-4, atol=1e-3
    )
    split, alone = _other_threads_share(two, x), _other_threads_share(one, x)
    assert max(split) > 0.3, split
    assert min(alone) < 0.1, alone


def test_a_product_of_64_rows_is_split_between_two_threads() -> None:
    """An MLP's batch of 64 rows (2 to 95 rows ran in one call on one thread) is split
    between the two intra-op threads: seen in CPU time, another thread computes about as
    much as the calling one in some run; the result is that of one call, bit for bit."""
    width = 1024
    model, weight = _product_model(width)
    compiled = ai.Core().compile_model(
        model, "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 2}
    )
    x = np.random.default_rng(1).standard_normal((64, width)).astype(np.float32)
    y = compiled.create_infer_request().infer_sync({"x": x})["y"]
    np.testing.assert_array_equal(y, x @ weight)
    shares = _other_threads_share(compiled, x, runs=10)
    assert max(shares) > 0.3, shares


_COLUMN_SPLIT_CHECK = """
import json
import numpy as np
from aioinfer.devices.cpu.kernels.matmul import column_blocks, columns_split_exactly, gemm_2d
from aioinfer.devices.cpu.kernels.parallel import set_intra_op_threads

set_intra_op_threads(2)
rng = np.random.default_rng(5)
products = split = mismatches = 0
for m in range(2, 96, 2):
    k, n = (int(v) for v in rng.choice([37, 96, 300, 512, 777, 1024, 3000], size=2))
    if m * k * n < 1 << 21:
        continue
    split += len(column_blocks(m, k, n, 2)) > 1
    a = rng.standard_normal((m, k)).astype(np.float32)
    for b in (rng.standard_normal((k, n)), rng.standard_normal((n, k)).T):
        b = b.astype(np.float32)
        out = np.empty((m, n), np.float32)
        gemm_2d(a, b, out)
        products += 1
        mismatches += not np.array_equal(out, a @ b)
print(json.dumps({"exact": columns_split_exactly(), "products": products, "split": split,
                  "mismatches": mismatches}))
"""


def _avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as info:
            return " avx512f" in info.read()
    except OSError:
        return False


@pytest.mark.parametrize("kernels", ["SkylakeX", "Haswell"])
def test_float32_products_of_2_to_95_rows_split_bit_for_bit_per_blas_kernel(
    kernels: str,
) -> None:
    """With OpenBLAS's SkylakeX kernels a float32 product of 2-95 rows is split by
    columns (each block packs only its part of the right operand); with Haswell's, whose
    column blocks round differently, by rows. Either way the result is bit for bit the
    product of one call (plain and transposed right operands). Each kernel runs in a
    fresh process: OpenBLAS reads OPENBLAS_CORETYPE when it loads."""
    if kernels == "SkylakeX" and not _avx512():
        pytest.skip("the SkylakeX kernels need AVX-512")
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "OPENBLAS_CORETYPE": kernels}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", _COLUMN_SPLIT_CHECK],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result = json.loads(done.stdout)
    assert result["exact"] == (kernels == "SkylakeX")
    assert result["products"] >= 50 and result["split"] >= 20, result
    assert result["mismatches"] == 0, result
