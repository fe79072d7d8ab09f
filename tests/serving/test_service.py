"""The model service used directly, without HTTP: inference, the kinds of its errors,
admission, sequences, statistics and the drain, under asyncio and trio."""

from __future__ import annotations

import pickle
import re
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import numpy as np
import onnx
import pytest

import aioinfer
from aioinfer.errors import (
    CompileError,
    ErrorKind,
    InferCancelledError,
    InferenceError,
    InputShapeError,
    ProtocolError,
    RequestClosedError,
    ServiceError,
    WorkerDiedError,
)
from aioinfer.serving import (
    InferenceRequest,
    InferenceService,
    ModelConfig,
    ModelRepository,
    RequestedOutput,
)
from tests.helpers import mlp_model, reference_outputs
from tests.serving.conftest import WIDE, accumulator_model

pytestmark = pytest.mark.anyio

RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
async def service(repository: Path, anyio_backend: str) -> AsyncIterator[InferenceService]:
    """The service over the package's repository, its lifespan entered (per backend:
    see the note on the fixtures of rest/test_fast_path.py)."""
    served = InferenceService(ModelRepository(repository))
    async with served.lifespan():
        yield served


def request(parameters: dict[str, object] | None = None, **inputs: np.ndarray) -> InferenceRequest:
    return InferenceRequest(id=None, parameters=dict(parameters or {}), inputs=inputs)


def rows(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, 4)).astype(np.float32)


async def refused(
    service: InferenceService, name: str, version: str | None, infer: InferenceRequest
) -> ServiceError:
    with pytest.raises(ServiceError) as caught:
        await service.infer(name, version, infer)
    return caught.value


# -- inference ----------------------------------------------------------------------------


async def test_infer_answers_the_latest_version_or_the_one_named(service: InferenceService):
    x = rows(3)
    latest = await service.infer("mlp", None, request(x=x))
    assert (latest.model_name, latest.model_version) == ("mlp", "2")
    expected = reference_outputs(mlp_model(seed=1), {"x": x})
    assert [name for name, _, _ in latest.outputs] == ["y", "z"]
    for (_, array, binary), want in zip(latest.outputs, expected):
        assert binary is False
        np.testing.assert_allclose(array, want, rtol=RTOL, atol=ATOL)
    first = await service.infer("mlp", "1", request(x=x))
    assert first.model_version == "1"
    y = reference_outputs(mlp_model(seed=0), {"x": x})[0]
    np.testing.assert_allclose(first.outputs[0][1], y, rtol=RTOL, atol=ATOL)


async def test_infer_answers_the_outputs_asked_for_in_their_order(service: InferenceService):
    x = rows(2, seed=1)
    infer = InferenceRequest(
        id="r-1",
        parameters={},
        inputs={"x": x},
        outputs=[RequestedOutput("z", True), RequestedOutput("y", False)],
    )
    response = await service.infer("mlp", "1", infer)
    assert response.id == "r-1"
    assert [(name, binary) for name, _, binary in response.outputs] == [("z", True), ("y", False)]
    y, z = reference_outputs(mlp_model(seed=0), {"x": x})
    np.testing.assert_allclose(response.outputs[0][1], z, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(response.outputs[1][1], y, rtol=RTOL, atol=ATOL)
    every = InferenceRequest(id=None, parameters={}, inputs={"x": x}, binary_output=True)
    answer = await service.infer("mlp", "1", every)
    assert [(name, binary) for name, _, binary in answer.outputs] == [("y", True), ("z", True)]


async def test_metadata_and_readiness(service: InferenceService):
    metadata = service.model_metadata(service.find("mlp", None))
    assert (metadata.name, metadata.versions, metadata.platform) == ("mlp", ["1", "2"], "onnx")
    assert [(t.name, t.datatype, t.shape) for t in metadata.inputs] == [("x", "FP32", [-1, 4])]
    assert [t.name for t in metadata.outputs] == ["y", "z"]
    assert "sequence" in service.server_metadata().extensions
    assert service.live() and service.ready()
    assert service.model_ready(service.find("plain", None))


async def test_statistics_count_answers_and_failures_by_kind(service: InferenceService):
    metrics = service.metrics.of(service.find("mlp", "1"))
    requests, answered = metrics.requests, sum(metrics.latency.counts)
    failed = metrics.failures["bad_request"]
    await service.infer("mlp", "1", request(x=rows(1)))
    await refused(service, "mlp", "1", request(x=np.ones((1, 5), np.float32)))
    assert metrics.requests == requests + 2
    assert sum(metrics.latency.counts) == answered + 1  # the answered one only
    assert metrics.failures["bad_request"] == failed + 1
    assert metrics.in_flight == 0


async def test_the_call_context_counts_every_outcome(service: InferenceService):
    """``service.call`` is the one way in: the block's end counts the request as
    answered, failed for the kind of a ServiceError, INTERNAL for any other exception
    (raised as a ServiceError), CANCELLED when cancelled; it is in flight until then."""
    metrics = service.metrics.of(service.find("plain", None))
    requests, answered = metrics.requests, sum(metrics.latency.counts)
    failures = dict(metrics.failures)
    a = np.ones((2, 3), np.float32)
    inputs = {"a": a, "b": a, "scale": np.array([1, 2, 3], np.int64)}
    async with service.call("plain", None) as call:
        assert metrics.in_flight == 1 and call.model.name == "plain"
        response = await call.infer(request(**inputs))
    assert response.outputs[0][1].shape == (2, 3)
    with pytest.raises(ServiceError) as invalid:
        async with service.call("plain", None):
            raise ProtocolError("the body is not JSON")
    assert invalid.value.kind is ErrorKind.INVALID_ARGUMENT
    with pytest.raises(ServiceError) as internal:
        async with service.call("plain", None):
            raise KeyError("a bug of the transport")
    assert internal.value.kind is ErrorKind.INTERNAL
    assert str(internal.value) == "internal server error: KeyError: 'a bug of the transport'"
    with anyio.CancelScope() as scope:
        async with service.call("plain", None):
            scope.cancel()
            await anyio.sleep_forever()
    assert metrics.requests == requests + 4
    assert sum(metrics.latency.counts) == answered + 1
    counted = {r: n - failures.get(r, 0) for r, n in metrics.failures.items()}
    assert {r: n for r, n in counted.items() if n} == {"bad_request": 1, "error": 1, "cancelled": 1}
    assert metrics.in_flight == 0


def test_only_the_service_counts_a_call():
    """No transport writes the start / fail / succeed / end sequence by hand: only
    ``serving/service.py`` calls those methods of an ``InferCall``."""
    package = Path(aioinfer.__file__).parent
    counting = re.compile(r"\.(?:fail|succeed|end)\((?:ErrorKind|exc\.kind|\))")
    callers = sorted(
        str(path.relative_to(package))
        for path in [*package.joinpath("serving").rglob("*.py"), package / "ray.py"]
        if counting.search(path.read_text())
    )
    assert callers == ["serving/service.py"]


async def test_batch_sizes_come_from_the_device_or_are_counted(service: InferenceService):
    """A batching model (mlp: BATCH, 8 rows) reports its batches and admits enough
    inferences to fill one per stream twice over; another (plain) counts each
    inference's rows itself."""
    mlp = service.find("mlp", "1")
    batches = mlp.compiled.batch_statistics()
    assert batches is not None and mlp.batch_sizes() == batches
    assert mlp.max_concurrency == 8 * mlp.compiled.streams * 2
    plain = service.find("plain", None)
    assert plain.compiled.batch_statistics() is None
    before = plain.batch_sizes().get(2, 0)
    a = np.ones((2, 3), np.float32)
    await service.infer("plain", None, request(a=a, b=a, scale=np.array([1, 2, 3], np.int64)))
    assert plain.batch_sizes()[2] == before + 1


# -- errors and their kinds ---------------------------------------------------------------


async def test_an_unknown_model_or_version_is_not_found(service: InferenceService):
    error = await refused(service, "nothing", None, request(x=rows(1)))
    assert error.kind is ErrorKind.NOT_FOUND
    assert "Request for unknown model: 'nothing' is not found; served models: " in str(error)
    error = await refused(service, "mlp", "9", request(x=rows(1)))
    assert error.kind is ErrorKind.NOT_FOUND
    expected = "Request for unknown model: 'mlp' version 9 is not found; served versions: 1, 2"
    assert str(error) == expected
    with pytest.raises(ServiceError) as caught:
        service.find("mlp", "3")
    assert caught.value.kind is ErrorKind.NOT_FOUND


@pytest.mark.parametrize(
    ("infer", "message"),
    [
        (request(x=np.ones((1, 5), np.float32)), "'x'"),
        (request(x=np.ones((1, 4), np.int64)), "'x'"),
        (request(w=np.ones((1, 4), np.float32)), "'w'"),
        (
            InferenceRequest(None, {}, {"x": rows(1)}, [RequestedOutput("q", False)]),
            "the model has no output named 'q'; its outputs are 'y', 'z'",
        ),
        (request({"sequence_id": 1.5}, x=rows(1)), "sequence_id must be an integer or a string"),
        (request({"sequence_id": 99}, x=rows(1)), "sequence 99 of model 'mlp' is not active"),
    ],
)
async def test_bad_input_is_an_invalid_argument(
    service: InferenceService, infer: InferenceRequest, message: str
):
    error = await refused(service, "mlp", "1", infer)
    assert error.kind is ErrorKind.INVALID_ARGUMENT
    assert message in str(error)
    assert not isinstance(error, ProtocolError)  # the service's own, not the wire's
    # Nothing is lost: the model answers the next request.
    response = await service.infer("mlp", "1", request(x=rows(1)))
    assert response.outputs[0][1].shape == (1, 3)


async def test_a_full_queue_is_unavailable_before_the_body_and_at_infer(
    service: InferenceService,
):
    """``slow`` runs one inference at a time and queues one more: beyond, ``start``
    refuses (before a transport reads the body), and so does ``infer`` for a request
    admitted while there was room but whose body came after the queue filled."""
    model = service.find("slow", None)
    metrics = service.metrics.of(model)
    busy = metrics.failures["busy"]
    x = np.random.default_rng(0).standard_normal((1024, WIDE)).astype(np.float32)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            group.start_soon(service.infer, "slow", None, request(x=x))  # computes
            await anyio.wait_all_tasks_blocked()
            late = service.start("slow", None)  # admitted: the queue has room
            group.start_soon(service.infer, "slow", None, request(x=x))  # waits
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(ServiceError) as at_start:
                service.start("slow", None)
            try:
                with pytest.raises(ServiceError) as at_infer:
                    await late.infer(request(x=x[:1]))
                late.fail(at_infer.value.kind)
            finally:
                late.end()
            group.cancel_scope.cancel()
    for error in (at_start.value, at_infer.value):
        assert error.kind is ErrorKind.UNAVAILABLE
        assert "model 'slow' is at capacity: 1 inferences running and 1 waiting" in str(error)
    assert metrics.failures["busy"] == busy + 2
    assert metrics.in_flight == 0
    with anyio.fail_after(60):  # the cancelled ones gave their slots back
        response = await service.infer("slow", None, request(x=x[:2]))
    assert response.outputs[0][1].shape == (2, WIDE)


async def test_a_draining_service_is_unavailable_and_not_ready(service: InferenceService):
    service.closing = True
    try:
        error = await refused(service, "mlp", None, request(x=rows(1)))
        assert error.kind is ErrorKind.UNAVAILABLE
        assert str(error) == "the server is shutting down"
        assert not service.ready()
        assert not service.model_ready(service.find("mlp", None))
    finally:
        service.closing = False
    assert service.ready()


async def test_the_drain_waits_for_calls_in_flight(repository: Path):
    service = InferenceService(ModelRepository(repository), drain_timeout=60)
    async with service.lifespan():
        call = service.start("plain", None)
        drained = anyio.Event()

        async def drain() -> None:
            await service.drain()
            drained.set()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(drain)
                await anyio.wait_all_tasks_blocked()
                assert service.closing and not drained.is_set()
                call.end()
                await drained.wait()
    assert service.models == {}  # the lifespan closed the models


async def test_an_inference_on_a_closed_model_is_aborted(tmp_path: Path):
    onnx.save(mlp_model(seed=2), tmp_path / "m.onnx")
    service = InferenceService(ModelRepository(tmp_path / "m.onnx"))
    async with service.lifespan():
        model = service.find("m", None)
        await model.compiled.close()
        error = await refused(service, "m", None, request(x=rows(1)))
        assert error.kind is ErrorKind.ABORTED
        assert "closed" in str(error)
        assert service.metrics.of(model).failures == {"shutdown": 1}


def test_a_service_error_pickles_with_its_kind():
    for error in (
        ServiceError("model 'm' is at capacity", ErrorKind.UNAVAILABLE),
        ProtocolError("the request is not valid JSON"),
        ProtocolError("too big", ErrorKind.TOO_LARGE),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert (str(copy), copy.kind) == (str(error), error.kind)


def test_the_kind_of_an_error_belongs_to_error_kind():
    """One table, on ``ErrorKind``, for every part of the service that turns an error of
    the runtime into a kind (inference and generation alike)."""
    cases = [
        (WorkerDiedError("the worker died"), ErrorKind.UNAVAILABLE),  # a DeviceUnavailableError
        (InputShapeError("x: expected (1, 4), got (2, 4)"), ErrorKind.INVALID_ARGUMENT),
        (InferenceError("a kernel failed"), ErrorKind.INVALID_ARGUMENT),
        (RequestClosedError("closed"), ErrorKind.ABORTED),
        (InferCancelledError("cancelled"), ErrorKind.ABORTED),
        (ProtocolError("bad body", ErrorKind.TOO_LARGE), ErrorKind.TOO_LARGE),
        (CompileError("no such op"), ErrorKind.INTERNAL),
        (RuntimeError("a bug"), ErrorKind.INTERNAL),
    ]
    assert [ErrorKind.of(error) for error, _ in cases] == [kind for _, kind in cases]


# -- sequences ----------------------------------------------------------------------------


async def test_a_sequence_keeps_its_state_until_it_ends(service: InferenceService):
    model = service.find("accumulator", None)

    async def step(values: list[float], **flags: object) -> list[float]:
        infer = request({"sequence_id": "s-1", **flags}, x=np.array([values], np.float32))
        response = await service.infer("accumulator", None, infer)
        assert response.outputs[0][0] == "total"
        return list(response.outputs[0][1][0])

    assert await step([1, 2], sequence_start=True) == [1, 2]
    assert await step([1, 2]) == [2, 4]
    assert "s-1" in model.sequences
    assert await step([3, 3], sequence_end=True) == [5, 7]
    assert "s-1" not in model.sequences
    error = await refused(
        service, "accumulator", None, request({"sequence_id": "s-1"}, x=np.ones((1, 2), np.float32))
    )
    assert error.kind is ErrorKind.INVALID_ARGUMENT and "is not active" in str(error)
    # No sequence named: each inference starts from the initial state.
    for _ in range(2):
        response = await service.infer("accumulator", None, request(x=np.ones((1, 2), np.float32)))
        assert list(response.outputs[0][1][0]) == [1, 1]


async def test_a_sequence_beyond_max_sequences_is_resource_exhausted(tmp_path: Path):
    onnx.save(accumulator_model(), tmp_path / "acc.onnx")
    config = ModelConfig(stateful={"state": "state_out"})
    repository = ModelRepository(tmp_path / "acc.onnx", {"acc": config})
    service = InferenceService(repository, max_sequences=1)
    x = np.ones((1, 2), np.float32)
    async with service.lifespan():
        await service.infer("acc", None, request({"sequence_id": 1, "sequence_start": True}, x=x))
        error = await refused(
            service, "acc", None, request({"sequence_id": 2, "sequence_start": True}, x=x)
        )
        assert error.kind is ErrorKind.RESOURCE_EXHAUSTED
        assert "has 1 open sequences, its limit (max_sequences 1)" in str(error)
        # Ending the first makes room.
        await service.infer("acc", None, request({"sequence_id": 1, "sequence_end": True}, x=x))
        response = await service.infer(
            "acc", None, request({"sequence_id": 2, "sequence_start": True}, x=x)
        )
        assert list(response.outputs[0][1][0]) == [1, 1]
        metrics = service.metrics.of(service.find("acc", None))
        assert metrics.failures["busy"] == 1


def test_a_request_field_error_pickles_with_its_param():
    from aioinfer.errors import RequestFieldError

    error = RequestFieldError("'tools' is not supported", "tools")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is RequestFieldError
    assert (str(copy), copy.kind, copy.param) == (str(error), ErrorKind.INVALID_ARGUMENT, "tools")
