"""A request owns its inputs: they are copied when they are set, so a caller may refill
one buffer for the next inference at once; ``share_inputs=True`` opts out (zero-copy).

The race is made deterministic: the caller's buffer is overwritten right after
``start_async`` (or the queue's ``start_async``) returns, before the task that runs the
inference had a chance to run, so without the copy every compute reads the overwritten
values. Results are compared with numpy (``relu(x @ w + b)``, float32: rtol 1e-5,
atol 1e-6).
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

import aioinfer as ai
from tests.helpers import make_model, mlp_model, tensor_info

pytestmark = pytest.mark.anyio

TOL = {"rtol": 1e-5, "atol": 1e-6}
ROWS, FEATURES = 2, 4


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return mlp_model(in_features=FEATURES)


def expected_y(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The model's ``y`` computed with numpy from its weights."""
    weights = {t.name: onh.to_array(t) for t in model.graph.initializer}
    return np.maximum(x @ weights["w"] + weights["b"], 0)


def frames(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    return [rng.standard_normal((ROWS, FEATURES)).astype(np.float32) for _ in range(count)]


@pytest.fixture(scope="module", params=["CPU", "BATCH:CPU", "PROCESS:CPU"])
def compiled(
    request: pytest.FixtureRequest, model: onnx.ModelProto, core: ai.Core, anyio_backend: str
) -> Iterator[ai.CompiledModel]:
    """The model on each device; one per backend (the BATCH batcher keeps loop objects)."""
    device = str(request.param)
    config = {"BATCH_TIMEOUT_MS": 1} if device.startswith("BATCH") else {}
    compiled = core.compile_model(model, device, config)
    yield compiled
    anyio.run(compiled.close, backend=anyio_backend)


async def test_start_async_copies_so_one_buffer_serves_every_request(model, compiled):
    values = frames(4)
    frame = np.empty((ROWS, FEATURES), np.float32)
    requests = [compiled.create_infer_request() for _ in values]
    for request, value in zip(requests, values):
        frame[...] = value
        request.start_async({"x": frame})
    frame[...] = np.nan  # before any inference ran
    for request, value in zip(requests, values):
        results = await request.wait()
        assert results is not None
        np.testing.assert_allclose(results["y"], expected_y(model, value), **TOL)


async def test_queue_copies_so_one_buffer_serves_every_job(model, compiled):
    values = frames(8)
    frame = np.empty((ROWS, FEATURES), np.float32)
    got: dict[int, np.ndarray] = {}

    def done(request: ai.InferRequest, userdata: int) -> None:
        got[userdata] = request.results["y"].copy()

    async with ai.AsyncInferQueue(compiled, jobs=2) as queue:
        queue.set_callback(done)
        for index, value in enumerate(values):
            frame[...] = value
            await queue.start_async({"x": frame}, index)
            frame[...] = np.nan  # the job has not run yet
        await queue.wait_all()
    assert sorted(got) == list(range(len(values)))
    for index, value in enumerate(values):
        np.testing.assert_allclose(got[index], expected_y(model, value), **TOL)


async def test_share_inputs_reads_the_callers_array(model, compiled):
    values = frames(2)
    frame = values[0].copy()
    request = compiled.create_infer_request()
    request.start_async({"x": frame}, share_inputs=True)
    # The request keeps the caller's array itself: changing it before the compute reads
    # it changes the result (the contract of share_inputs: leave it alone meanwhile).
    assert request.get_tensor("x") is frame
    frame[...] = values[1]
    results = await request.wait()
    assert results is not None
    np.testing.assert_allclose(results["y"], expected_y(model, values[1]), **TOL)
    # Shared arrays are fine when nobody changes them: the hot path of a server.
    results = await request.infer({"x": values[0]}, share_inputs=True)
    np.testing.assert_allclose(results["y"], expected_y(model, values[0]), **TOL)
    queue = ai.AsyncInferQueue(compiled, jobs=1)
    await queue.start_async({"x": frame}, share_inputs=True)
    assert queue[0].get_tensor("x") is frame
    await queue.wait_all()
    await queue.close()


async def test_batch_compiled_infer_copies_a_queued_input(model, core):
    """``compiled.infer`` on BATCH queues the rows; a buffer refilled while they wait
    must not change them (the batch fills, and runs, only when the second call comes)."""
    compiled = core.compile_model(
        model, "BATCH:CPU", {"MAX_BATCH_SIZE": 2 * ROWS, "BATCH_TIMEOUT_MS": 60_000}
    )
    values = frames(2)
    frame = values[0].copy()
    got: dict[int, np.ndarray] = {}

    async def infer(index: int) -> None:
        got[index] = (await compiled.infer({"x": frame}))["y"]

    async with anyio.create_task_group() as group:
        group.start_soon(infer, 0)
        await anyio.wait_all_tasks_blocked()  # the first rows wait for a second call
        frame[...] = values[1]
        group.start_soon(infer, 1)
    for index, value in enumerate(values):
        np.testing.assert_allclose(got[index], expected_y(model, value), **TOL)
    assert compiled.batch_statistics() == {2 * ROWS: 1}
    await compiled.close()


def test_the_copy_goes_into_one_buffer_per_input(core, model):
    compiled = core.compile_model(model, "CPU")
    request = compiled.create_infer_request()
    first, second = frames(2)
    request.set_tensor("x", first)
    buffer = request.get_tensor("x")
    assert not np.shares_memory(buffer, first)
    np.testing.assert_array_equal(buffer, first)
    request.infer_sync({"x": second})
    # Same shape and element type: the same buffer, refilled (nothing allocated).
    assert request.get_tensor("x") is buffer
    np.testing.assert_array_equal(buffer, second)
    np.testing.assert_allclose(request.results["y"], expected_y(model, second), **TOL)
    # Another shape: a buffer of that shape.
    request.set_tensor("x", np.ones((3, FEATURES), np.float32))
    assert request.get_tensor("x").shape == (3, FEATURES)
    # Converted values (a list) are owned too; shared ones are kept as given.
    request.set_tensor("x", first.tolist())
    np.testing.assert_array_equal(request.get_tensor("x"), first)
    request.set_tensor("x", first, share_inputs=True)
    assert request.get_tensor("x") is first
    results = request.infer_sync({"x": second}, share_inputs=True)
    assert request.get_tensor("x") is second
    np.testing.assert_allclose(results["y"], expected_y(model, second), **TOL)


async def test_results_never_alias_the_reused_input_buffer(core):
    """An output that is the input itself (Identity) is copied out: refilling the
    request's input buffer for the next inference leaves earlier results alone."""
    identity = make_model(
        [oh.make_node("Identity", ["x"], ["y"])],
        [tensor_info("x", np.float32, ["n"])],
        [tensor_info("y", np.float32, ["n"])],
    )
    request = core.compile_model(identity, "CPU").create_infer_request()
    first = (await request.infer({"x": np.arange(3, dtype=np.float32)}))["y"]
    buffer = request.get_tensor("x")
    await request.infer({"x": np.full(3, -1, np.float32)})
    assert request.get_tensor("x") is buffer
    np.testing.assert_array_equal(first, [0, 1, 2])
