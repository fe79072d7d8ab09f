"""The BATCH device: coalescing, exact splitting, isolation, cancellation, the THROUGHPUT hint.

Exactness: joining rows changes nothing for integer and elementwise models, so their
batched results are compared bit for bit with unbatched runs. A float32 matrix product
goes through BLAS, whose kernels (and so rounding) depend on the number of rows: no
runtime can promise identical bits there, and those results are compared with a
tolerance instead.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import anyio
import numpy as np
import onnx
import onnx.helper as oh
import pytest

import aioinfer as ai
from aioinfer.devices.batch import BatchCompiledModel
from tests import helpers
from tests.helpers import make_model, mlp_model, reference_outputs, tensor_info

pytestmark = pytest.mark.anyio

WIDE = 256


def exact_model() -> onnx.ModelProto:
    """``y = xi @ w + b`` in int64 (no BLAS) and ``t = tanh(xf / 2) + xf`` (elementwise)."""
    rng = np.random.default_rng(0)
    weights = {
        "w": rng.integers(-5, 5, (4, 3)).astype(np.int64),
        "b": rng.integers(-5, 5, 3).astype(np.int64),
        "half": np.array(0.5, np.float32),
    }
    nodes = [
        oh.make_node("MatMul", ["xi", "w"], ["m"]),
        oh.make_node("Add", ["m", "b"], ["y"]),
        oh.make_node("Mul", ["xf", "half"], ["h"]),
        oh.make_node("Tanh", ["h"], ["th"]),
        oh.make_node("Add", ["th", "xf"], ["t"]),
    ]
    return make_model(
        nodes,
        [tensor_info("xi", np.int64, ["batch", 4]), tensor_info("xf", np.float32, ["batch", 4])],
        [tensor_info("y", np.int64, ["batch", 3]), tensor_info("t", np.float32, ["batch", 4])],
        weights,
        name="exact",
    )


def sequence_model() -> onnx.ModelProto:
    """``y = x * 2`` for x of shape ``["batch", "seq"]``: rows of different lengths."""
    two = np.array(2.0, np.float32)
    return make_model(
        [oh.make_node("Mul", ["x", "two"], ["y"])],
        [tensor_info("x", np.float32, ["batch", "seq"])],
        [tensor_info("y", np.float32, ["batch", "seq"])],
        {"two": two},
        name="seq",
    )


def gather_model() -> onnx.ModelProto:
    """``rows = table[index]``: an index out of range fails in the kernel, not in validation."""
    table = np.arange(30, dtype=np.float32).reshape(10, 3)
    return make_model(
        [oh.make_node("Gather", ["table", "index"], ["rows"], axis=0, name="gather")],
        [tensor_info("index", np.int64, ["batch"])],
        [tensor_info("rows", np.float32, ["batch", 3])],
        {"table": table},
        name="gather",
    )


def chain_model(steps: int) -> onnx.ModelProto:
    """(MatMul, Tanh) * steps over ``["n", WIDE]``: slow enough to stop half-way."""
    return helpers.chain_model(steps, WIDE, seed=1)


def exact_feeds(count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    feeds = []
    for i in range(count):
        rows = 1 + i % 3
        feeds.append(
            {
                "xi": rng.integers(-50, 50, (rows, 4)).astype(np.int64),
                "xf": rng.standard_normal((rows, 4)).astype(np.float32),
            }
        )
    return feeds


async def infer_all(
    compiled: ai.CompiledModel, feeds: Sequence[dict[str, np.ndarray]]
) -> list[ai.InferResults]:
    """Run every feed on its own request, all at once."""
    results: list[Any] = [None] * len(feeds)

    async def one(index: int) -> None:
        results[index] = await compiled.create_infer_request().infer(feeds[index])

    async with anyio.create_task_group() as group:
        for index in range(len(feeds)):
            group.start_soon(one, index)
    return results


@pytest.fixture(scope="module")
def exact_plain(core: ai.Core) -> ai.CompiledModel:
    return core.compile_model(exact_model(), "CPU")


# -- coalescing and exactness -----------------------------------------------------------


async def test_concurrent_requests_are_batched_and_split_back_exactly(core, exact_plain):
    compiled = core.compile_model(
        exact_model(), "BATCH:CPU", {"MAX_BATCH_SIZE": 8, "BATCH_TIMEOUT_MS": 50}
    )
    assert isinstance(compiled, BatchCompiledModel)
    feeds = exact_feeds(24)
    batched = await infer_all(compiled, feeds)
    alone = exact_plain.create_infer_request()
    for feed, results in zip(feeds, batched):
        expected = alone.infer_sync(feed)
        for name in ("y", "t"):
            np.testing.assert_array_equal(results[name], expected[name], err_msg=name)
    # And the unbatched runs agree with onnxruntime (tanh may differ by an ulp).
    reference = reference_outputs(exact_model(), feeds[0])
    np.testing.assert_array_equal(batched[0]["y"], reference[0])
    np.testing.assert_allclose(batched[0]["t"], reference[1], rtol=1e-6, atol=1e-6)
    statistics = compiled.batch_statistics()
    # 24 requests of 1-3 rows (48 rows) ran in far fewer batches, none above 8 rows.
    assert sum(rows * count for rows, count in statistics.items()) == 48
    assert sum(statistics.values()) < 24
    assert max(statistics) <= 8


async def test_results_are_owned_arrays(core):
    compiled = core.compile_model(exact_model(), "BATCH:CPU", {"BATCH_TIMEOUT_MS": 20})
    first, second = await infer_all(compiled, exact_feeds(2))
    assert first["t"].flags.owndata and second["t"].flags.owndata
    before = second["t"].copy()
    first["t"][:] = 0  # a result belongs to its caller; others are not views of it
    np.testing.assert_array_equal(second["t"], before)


async def test_float_matmul_agrees_within_tolerance(core):
    """BLAS picks its kernel by the number of rows, so the bits of a float32 product
    depend on the batch; the values agree with onnxruntime to float32 rounding."""
    model = mlp_model(in_features=64, out_features=32, seed=3)
    compiled = core.compile_model(model, "BATCH:CPU", {"BATCH_TIMEOUT_MS": 50})
    rng = np.random.default_rng(4)
    feeds = [{"x": rng.standard_normal((1, 64)).astype(np.float32)} for _ in range(16)]
    batched = await infer_all(compiled, feeds)
    for feed, results in zip(feeds, batched):
        for got, want in zip(results.to_tuple(), reference_outputs(model, feed)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert sum(compiled.batch_statistics().values()) < 16


async def test_rows_of_different_lengths_go_into_separate_batches(core):
    compiled = core.compile_model(sequence_model(), "BATCH:CPU", {"BATCH_TIMEOUT_MS": 50})
    rng = np.random.default_rng(5)
    feeds = [{"x": rng.standard_normal((1, 3 + i % 2)).astype(np.float32)} for i in range(8)]
    batched = await infer_all(compiled, feeds)
    for feed, results in zip(feeds, batched):
        np.testing.assert_array_equal(results["y"], feed["x"] * np.float32(2))
    # Four rows of length 3 and four of length 4: two batches of 4 rows.
    assert compiled.batch_statistics() == {4: 2}


async def test_full_batch_runs_without_waiting_for_the_timeout(core):
    compiled = core.compile_model(
        exact_model(), "BATCH:CPU", {"MAX_BATCH_SIZE": 4, "BATCH_TIMEOUT_MS": 60_000}
    )
    feeds = [{k: v[:1] for k, v in feed.items()} for feed in exact_feeds(4)]
    with anyio.fail_after(30):
        await infer_all(compiled, feeds)
    assert compiled.batch_statistics() == {4: 1}


async def test_a_request_larger_than_the_batch_runs_alone(core, exact_plain):
    compiled = core.compile_model(exact_model(), "BATCH:CPU", {"MAX_BATCH_SIZE": 2})
    rng = np.random.default_rng(6)
    feed = {
        "xi": rng.integers(-9, 9, (7, 4)).astype(np.int64),
        "xf": rng.standard_normal((7, 4)).astype(np.float32),
    }
    results = await compiled.create_infer_request().infer(feed)
    expected = exact_plain.create_infer_request().infer_sync(feed)
    np.testing.assert_array_equal(results["y"], expected["y"])
    assert compiled.batch_statistics() == {7: 1}


async def test_profiling_reports_the_batch(core):
    compiled = core.compile_model(exact_model(), "BATCH:CPU", {"BATCH_TIMEOUT_MS": 50})
    requests = [compiled.create_infer_request() for _ in range(3)]
    feeds = [{k: v[:1] for k, v in feed.items()} for feed in exact_feeds(3)]
    async with anyio.create_task_group() as group:
        for request, feed in zip(requests, feeds):
            group.start_soon(request.infer, feed)
    info = {entry["name"]: entry for entry in requests[0].get_profiling_info()}
    assert {"preprocess", "start", "wait", "postprocess"} <= set(info)
    assert info["batch"]["rows"] == 3 and info["batch"]["requests"] == 3
    assert 0 <= info["batch"]["seconds"] <= info["wait"]["seconds"]


# -- isolation ----------------------------------------------------------------------------


async def test_a_bad_input_fails_only_its_own_request(core, exact_plain):
    compiled = core.compile_model(exact_model(), "BATCH:CPU", {"BATCH_TIMEOUT_MS": 50})
    feeds = exact_feeds(6)
    bad_type = dict(feeds[1], xi=feeds[1]["xi"].astype(np.float64))
    bad_shape = dict(feeds[2], xf=np.zeros((1, 5), np.float32))
    bad_rows = dict(feeds[3], xf=np.zeros((9, 4), np.float32))  # xi has other rows
    errors: dict[int, BaseException] = {}
    results: dict[int, ai.InferResults] = {}
    requests = [compiled.create_infer_request() for _ in feeds]

    async def one(index: int, feed: dict[str, np.ndarray]) -> None:
        try:
            results[index] = await requests[index].infer(feed)
        except ai.InputError as exc:
            errors[index] = exc

    async with anyio.create_task_group() as group:
        for index, feed in enumerate([feeds[0], bad_type, bad_shape, bad_rows, *feeds[4:]]):
            group.start_soon(one, index, feed)
    assert isinstance(errors[1], ai.InputTypeError) and "'xi'" in str(errors[1])
    assert isinstance(errors[2], ai.InputShapeError) and "'xf'" in str(errors[2])
    assert isinstance(errors[3], ai.InputShapeError) and "'batch'" in str(errors[3])
    alone = exact_plain.create_infer_request()
    for index in (0, 4, 5):
        np.testing.assert_array_equal(results[index]["y"], alone.infer_sync(feeds[index])["y"])
    # The failed requests stay usable.
    again = await requests[1].infer(feeds[1])
    np.testing.assert_array_equal(again["y"], alone.infer_sync(feeds[1])["y"])


async def test_a_kernel_failure_in_a_batch_fails_only_the_request_that_caused_it(core):
    compiled = core.compile_model(gather_model(), "BATCH:CPU", {"BATCH_TIMEOUT_MS": 50})
    indices = [np.array([i % 10], np.int64) for i in range(6)]
    indices[3] = np.array([99], np.int64)  # out of range
    outcomes: dict[int, Any] = {}

    async def one(index: int) -> None:
        try:
            outcomes[index] = await compiled.create_infer_request().infer({"index": indices[index]})
        except ai.InferenceError as exc:
            outcomes[index] = exc

    async with anyio.create_task_group() as group:
        for index in range(6):
            group.start_soon(one, index)
    assert isinstance(outcomes[3], ai.InferenceError) and "gather" in str(outcomes[3])
    table = np.arange(30, dtype=np.float32).reshape(10, 3)
    for index in (0, 1, 2, 4, 5):
        np.testing.assert_array_equal(outcomes[index]["rows"], table[indices[index]])
    assert compiled.batch_statistics() == {6: 1}  # one batch, then each ran alone


# -- cancellation ---------------------------------------------------------------------------


async def test_cancelling_a_waiting_request_removes_it_from_its_batch(core, exact_plain):
    compiled = core.compile_model(
        exact_model(), "BATCH:CPU", {"MAX_BATCH_SIZE": 4, "BATCH_TIMEOUT_MS": 60_000}
    )
    feeds = [{k: v[:1] for k, v in feed.items()} for feed in exact_feeds(5)]
    scopes = [anyio.CancelScope() for _ in feeds]
    results: dict[int, ai.InferResults] = {}
    requests = [compiled.create_infer_request() for _ in feeds]

    async def one(index: int) -> None:
        with scopes[index]:
            results[index] = await requests[index].infer(feeds[index])

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for index in range(3):
                group.start_soon(one, index)
            await anyio.wait_all_tasks_blocked()
            scopes[1].cancel()  # 3 rows queued, batch of 4 not full: request 1 leaves
            await anyio.wait_all_tasks_blocked()
            assert requests[1].state is ai.RequestState.IDLE
            group.start_soon(one, 3)  # 3 rows again: still not full
            await anyio.wait_all_tasks_blocked()
            assert compiled.batch_statistics() == {}
            group.start_soon(one, 4)  # now 4: the batch runs, without request 1
    assert sorted(results) == [0, 2, 3, 4]
    assert compiled.batch_statistics() == {4: 1}
    alone = exact_plain.create_infer_request()
    for index in (0, 2, 3, 4):
        np.testing.assert_array_equal(results[index]["t"], alone.infer_sync(feeds[index])["t"])


async def test_request_cancel_fails_only_that_request(core, exact_plain):
    compiled = core.compile_model(
        exact_model(), "BATCH:CPU", {"MAX_BATCH_SIZE": 3, "BATCH_TIMEOUT_MS": 60_000}
    )
    feeds = [{k: v[:1] for k, v in feed.items()} for feed in exact_feeds(4)]
    requests = [compiled.create_infer_request() for _ in feeds]
    with anyio.fail_after(30):
        requests[0].start_async(feeds[0])
        requests[1].start_async(feeds[1])
        await anyio.wait_all_tasks_blocked()
        requests[0].cancel()
        with pytest.raises(ai.InferCancelledError):
            await requests[0].wait()
        requests[2].start_async(feeds[2])
        requests[3].start_async(feeds[3])
        for request in requests[1:]:
            assert await request.wait() is not None
    assert compiled.batch_statistics() == {3: 1}
    # The cancelled request is reusable (in a batch with two others).
    with anyio.fail_after(30):
        for request, feed in zip(requests[:3], feeds):
            request.start_async(feed)
        results = await requests[0].wait()
        await requests[1].wait()
        await requests[2].wait()
    assert results is not None
    expected = exact_plain.create_infer_request().infer_sync(feeds[0])
    np.testing.assert_array_equal(results["t"], expected["t"])
    assert compiled.batch_statistics() == {3: 2}


async def test_cancelling_every_request_of_a_running_batch_stops_its_compute(core):
    model = chain_model(300)
    compiled = core.compile_model(model, "BATCH:CPU", {"BATCH_TIMEOUT_MS": 0})
    x = np.random.default_rng(7).standard_normal((128, WIDE)).astype(np.float32)
    # The first run of a shape records its memory plan (under load it can take longer
    # than the full run): the small request below must not be the first of its shape.
    await compiled.create_infer_request().infer({"x": x[:1]})
    start = time.perf_counter()
    await compiled.create_infer_request().infer({"x": x})
    full = time.perf_counter() - start
    with anyio.move_on_after(full / 10) as scope:
        await infer_all(compiled, [{"x": x[:64]}, {"x": x[64:]}])
    assert scope.cancelled_caught
    # The target has one stream: a small request runs as soon as the cancelled batch let go.
    start = time.perf_counter()
    await compiled.create_infer_request().infer({"x": x[:1]})
    assert time.perf_counter() - start < full / 2, full


async def test_close_cancels_waiting_requests(core):
    compiled = core.compile_model(
        exact_model(), "BATCH:CPU", {"MAX_BATCH_SIZE": 8, "BATCH_TIMEOUT_MS": 60_000}
    )
    request = compiled.create_infer_request()
    idle = compiled.create_infer_request()  # it could join: the batch waits for it
    request.start_async(exact_feeds(1)[0])
    with anyio.fail_after(30):
        await anyio.wait_all_tasks_blocked()
        await compiled.close()
    assert idle.state is ai.RequestState.CLOSED
    assert request.state is ai.RequestState.CLOSED
    assert isinstance(request.error, ai.InferCancelledError)
    with pytest.raises(ai.RequestClosedError):
        compiled.create_infer_request()


# -- the other request paths ----------------------------------------------------------------


async def test_queue_and_callbacks_work_on_a_batch_model(core, exact_plain):
    compiled = core.compile_model(exact_model(), "BATCH:CPU", {"BATCH_TIMEOUT_MS": 20})
    feeds = exact_feeds(12)
    got: dict[int, np.ndarray] = {}
    async with ai.AsyncInferQueue(compiled, jobs=6) as queue:
        queue.set_callback(lambda request, index: got.__setitem__(index, request.results["y"]))
        for index, feed in enumerate(feeds):
            await queue.start_async(feed, userdata=index)
        await queue.wait_all()
    alone = exact_plain.create_infer_request()
    for index, feed in enumerate(feeds):
        np.testing.assert_array_equal(got[index], alone.infer_sync(feed)["y"])


def test_infer_sync_runs_alone_on_the_target(core, exact_plain):
    compiled = core.compile_model(exact_model(), "BATCH:CPU")
    feed = exact_feeds(3)[2]
    results = compiled.create_infer_request().infer_sync(feed)
    np.testing.assert_array_equal(
        results["y"], exact_plain.create_infer_request().infer_sync(feed)["y"]
    )
    assert compiled.batch_statistics() == {}


# -- compiling, properties, the THROUGHPUT hint ---------------------------------------------


def test_properties_are_the_batch_ones_then_the_targets(core):
    compiled = core.compile_model(
        exact_model(), "BATCH:CPU", {"MAX_BATCH_SIZE": "16", "NUM_STREAMS": 2}
    )
    assert compiled.get_property("MAX_BATCH_SIZE") == 16
    assert compiled.get_property("BATCH_TIMEOUT_MS") == 1.0
    assert compiled.get_property("TARGET_DEVICE") == "CPU"
    assert compiled.get_property("NUM_STREAMS") == 2
    assert compiled.get_property("DEVICE_NAME") == "BATCH:CPU"
    assert compiled.get_property("NETWORK_NAME") == "exact"
    supported = compiled.get_property("SUPPORTED_PROPERTIES")
    assert {"MAX_BATCH_SIZE", "BATCH_TIMEOUT_MS", "PERFORMANCE_HINT"} <= set(supported)
    assert core.get_property("BATCH", "DEVICE_NAME") == "BATCH"
    assert "BATCH" in core.available_devices
    # "BATCH" alone batches on the CPU too.
    assert core.compile_model(exact_model(), "BATCH").get_property("DEVICE_NAME") == "BATCH:CPU"


@pytest.mark.parametrize(
    ("device", "config", "error", "words"),
    [
        ("BATCH:CPU", {"MAX_BATCH_SIZE": 0}, ai.InvalidPropertyValueError, ["MAX_BATCH_SIZE"]),
        ("BATCH:CPU", {"BATCH_TIMEOUT_MS": -1}, ai.InvalidPropertyValueError, [">= 0"]),
        ("BATCH:CPU", {"COLOUR": 1}, ai.UnknownPropertyError, ["COLOUR"]),
        ("BATCH:GPU", {}, ai.UnknownDeviceError, ["'GPU'"]),
        ("BATCH:BATCH", {}, ai.UnknownDeviceError, ["plain target", "'BATCH'"]),
        ("CPU:BATCH", {}, ai.UnknownDeviceError, ["'CPU' takes no target"]),
        ("BATCH:CPU", {"STATEFUL": {"xi": "y"}}, ai.NotBatchableError, ["stateful"]),
    ],
)
def test_bad_configs_are_refused_clearly(core, device, config, error, words):
    with pytest.raises(error) as caught:
        core.compile_model(exact_model(), device, config)
    for word in words:
        assert word in str(caught.value)


def not_batchable(kind: str) -> onnx.ModelProto:
    shapes = {
        "static": ([2, 4], [2, 4]),
        "two symbols": (["n", 4], ["m", 4]),
        "scalar output": (["n", 4], []),
    }[kind]
    node = (
        oh.make_node("ReduceSum", ["x"], ["y"], keepdims=0)
        if kind == "scalar output"
        else oh.make_node("Relu", ["x"], ["y"])
    )
    return make_model(
        [node],
        [tensor_info("x", np.float32, shapes[0])],
        [tensor_info("y", np.float32, shapes[1])],
        name=kind,
    )


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("static", ["input 'x'", "first dimension 2", "not a symbolic batch dimension"]),
        ("two symbols", ["different symbols", "'n'", "'m'"]),
        ("scalar output", ["output 'y'", "rank 0"]),
    ],
)
def test_a_model_without_a_batch_dimension_is_refused_by_batch(core, kind, words):
    with pytest.raises(ai.NotBatchableError) as caught:
        core.compile_model(not_batchable(kind), "BATCH:CPU")
    for word in [repr(kind), *words]:
        assert word in str(caught.value)
    # ... and runs unbatched on the CPU under the THROUGHPUT hint.
    plain = core.compile_model(not_batchable(kind), "CPU", {"PERFORMANCE_HINT": "THROUGHPUT"})
    assert plain.get_property("DEVICE_NAME") == "CPU"


async def test_throughput_hint_batches_a_batchable_model(core, exact_plain):
    compiled = core.compile_model(exact_model(), "CPU", {"PERFORMANCE_HINT": "THROUGHPUT"})
    assert isinstance(compiled, BatchCompiledModel)
    assert compiled.get_property("DEVICE_NAME") == "BATCH:CPU"
    assert compiled.get_property("PERFORMANCE_HINT") == "THROUGHPUT"
    assert compiled.get_property("NUM_STREAMS") == ai.Core().get_property("CPU", "NUM_CORES")
    feeds = exact_feeds(16)
    batched = await infer_all(compiled, feeds)
    alone = exact_plain.create_infer_request()
    for feed, results in zip(feeds, batched):
        np.testing.assert_array_equal(results["t"], alone.infer_sync(feed)["t"])
    assert sum(compiled.batch_statistics().values()) < 16


@pytest.mark.parametrize("value", ["NO", False])
def test_allow_auto_batching_no_keeps_the_plain_device(core, value):
    config = {"PERFORMANCE_HINT": "THROUGHPUT", "ALLOW_AUTO_BATCHING": value}
    compiled = core.compile_model(exact_model(), "CPU", config)
    assert compiled.get_property("DEVICE_NAME") == "CPU"
    assert compiled.get_property("ALLOW_AUTO_BATCHING") is False


def test_latency_hint_does_not_batch(core):
    compiled = core.compile_model(exact_model(), "CPU", {"PERFORMANCE_HINT": "LATENCY"})
    assert compiled.get_property("DEVICE_NAME") == "CPU"
