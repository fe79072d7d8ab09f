"""The model manager through the service, under asyncio and trio: load on demand, the
least recently used idle model unloaded first, pinned and idle models, requests waiting
for a load, a failing load, a model too large for the budget, in-flight requests
during an unload."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from anyio.abc import TaskStatus

from aioinfer.errors import ErrorKind, ModelMemoryError, ServiceError
from aioinfer.serving import InferenceRequest, InferenceService, ModelRepository
from aioinfer.serving.manager import FIRST_RETRY_S
from tests.helpers import matmul_model, mlp_model
from tests.serving.conftest import write_config, write_model

pytestmark = pytest.mark.anyio

MB = 2**20
SMALL = {"device": "CPU", "memory_bytes": 100 * MB}
"""A small model accounted at 100 MiB (declared, well above what it holds: the order of
evictions does not hang on what a load measures, nor on the resident memory)."""
BUDGET = 250 * MB
"""Two small models fit, not three."""


def request(width: int = 4) -> InferenceRequest:
    x = np.ones((1, width), np.float32)
    return InferenceRequest(id=None, parameters={}, inputs={"x": x})


def repository(tmp_path: Path, **models: dict[str, Any]) -> ModelRepository:
    """Small models (``mlp_model``) with the given configs."""
    for seed, (name, config) in enumerate(models.items()):
        write_model(tmp_path, name, 1, mlp_model(seed=seed))
        write_config(tmp_path, name, config)
    return ModelRepository(tmp_path)


@pytest.fixture
async def lru_service(tmp_path: Path) -> AsyncIterator[InferenceService]:
    """Models a, b, c, d of 100 MiB each under a budget of 250 MiB: two fit."""
    repo = repository(tmp_path, a=SMALL, b=SMALL, c=SMALL, d=SMALL)
    service = InferenceService(repo, memory_budget=BUDGET)
    async with service.lifespan():
        yield service


def states(service: InferenceService) -> dict[str, tuple[str, str]]:
    return {e["name"]: (e["state"], e["reason"]) for e in service.repository_index()}


def loads(service: InferenceService) -> dict[str, Any]:
    return dict(service.metrics.load_figures())


async def test_models_load_at_start_while_they_fit_and_the_others_on_demand(
    lru_service: InferenceService,
) -> None:
    assert list(lru_service.models) == ["a", "b"]
    assert states(lru_service)["c"] == ("UNAVAILABLE", "unloaded")
    response = await lru_service.infer("c", None, request())
    assert response.outputs[0][1].shape == (1, 3)
    assert "c" in lru_service.models
    assert loads(lru_service)["c"].misses == 1


async def test_the_least_recently_used_model_is_unloaded_first(
    lru_service: InferenceService,
) -> None:
    for name in ("b", "a"):  # a is now the more recent of the two loaded
        await lru_service.infer(name, None, request())
    await lru_service.infer("c", None, request())  # evicts b
    assert sorted(lru_service.models) == ["a", "c"]
    await lru_service.infer("a", None, request())
    await lru_service.infer("d", None, request())  # evicts c, used before a
    assert sorted(lru_service.models) == ["a", "d"]
    await lru_service.infer("b", None, request())  # evicts a
    assert sorted(lru_service.models) == ["b", "d"]
    evictions = {name: figures.evictions for name, figures in loads(lru_service).items()}
    assert evictions == {"a": 1, "b": 1, "c": 1, "d": 0}
    state, reason = states(lru_service)["a"]
    assert state == "UNAVAILABLE"
    assert reason == "evicted: least recently used, to load 'b'"
    assert lru_service.manager.used_bytes() == 200 * MB


async def test_a_pinned_model_is_never_unloaded(tmp_path: Path) -> None:
    repo = repository(tmp_path, a={**SMALL, "pinned": True}, b=SMALL, c=SMALL)
    service = InferenceService(repo, memory_budget=BUDGET)
    async with service.lifespan():
        await service.infer("b", None, request())  # a is the least recently used
        await service.infer("c", None, request())
        assert sorted(service.models) == ["a", "c"]
        await service.infer("b", None, request())
        assert sorted(service.models) == ["a", "b"]
        assert loads(service)["a"].unloads == 0


async def test_only_pinned_models_left_refuse_the_load_with_the_sizes(tmp_path: Path) -> None:
    pinned = {**SMALL, "pinned": True}
    repo = repository(tmp_path, a=pinned, b=pinned, c=SMALL)
    service = InferenceService(repo, memory_budget=BUDGET)
    async with service.lifespan():
        with pytest.raises(ModelMemoryError) as refused:
            await service.infer("c", None, request())
    assert refused.value.kind is ErrorKind.RESOURCE_EXHAUSTED
    assert "'c' needs 100.0 MiB" in str(refused.value)
    assert "hold 200.0 MiB (209715200 bytes) of the budget of 250.0 MiB" in str(refused.value)


async def test_an_idle_model_is_unloaded_after_idle_unload_s(tmp_path: Path) -> None:
    repo = repository(
        tmp_path,
        idle={**SMALL, "idle_unload_s": 0.2},
        kept={**SMALL, "idle_unload_s": 0.2, "pinned": True},
        control=SMALL,
    )
    service = InferenceService(repo)  # no budget: idle_unload_s alone
    async with service.lifespan():
        for name in ("idle", "kept", "control"):
            await service.infer(name, None, request())
        used = time.perf_counter()
        with anyio.fail_after(30):  # a hang guard
            while states(service)["idle"][0] != "UNAVAILABLE":
                await anyio.sleep(0.02)
        assert time.perf_counter() - used >= 0.2
        assert states(service)["idle"] == ("UNAVAILABLE", "idle for 0.2 s")
        assert sorted(service.models) == ["control", "kept"]
        await service.infer("idle", None, request())  # loads it again
        assert loads(service)["idle"].loads == 2


async def test_requests_wait_for_the_load_up_to_the_models_max_queue(tmp_path: Path) -> None:
    repo = repository(tmp_path, a=SMALL, b={**SMALL, "max_queue": 2})
    service = InferenceService(repo, memory_budget=150 * MB)
    answers: list[str] = []

    async def infer() -> None:
        try:
            await service.infer("b", None, request())
            answers.append("ok")
        except ServiceError as exc:
            assert exc.kind is ErrorKind.UNAVAILABLE
            assert "requests wait for its load (its max_queue)" in str(exc)
            answers.append("busy")

    async with service.lifespan():
        assert list(service.models) == ["a"]
        async with anyio.create_task_group() as group:
            for _ in range(5):
                group.start_soon(infer)
    assert sorted(answers) == ["busy", "busy", "busy", "ok", "ok"]
    assert loads(service)["b"].loads == 1


async def test_a_failing_load_answers_its_waiters_and_is_retried_after_a_backoff(
    tmp_path: Path,
) -> None:
    repo = repository(tmp_path, good=SMALL)
    broken = tmp_path / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"not a model")
    write_config(tmp_path, "broken", SMALL)
    service = InferenceService(
        ModelRepository(tmp_path), model_control_mode="explicit", memory_budget=BUDGET
    )
    errors: list[ServiceError] = []

    async def infer() -> None:
        with pytest.raises(ServiceError) as failed:
            await service.infer("broken", None, request())
        errors.append(failed.value)

    async with service.lifespan():
        async with anyio.create_task_group() as group:
            for _ in range(3):
                group.start_soon(infer)
        assert len(errors) == 3
        assert {error.kind for error in errors} == {ErrorKind.UNAVAILABLE}
        assert all("model 'broken' failed to load" in str(error) for error in errors)
        assert loads(service)["broken"].failed_loads == 1
        state, reason = states(service)["broken"]
        assert state == "UNAVAILABLE" and reason.startswith("load failed: ")
        await infer()  # within the backoff: the same error, no new load
        assert loads(service)["broken"].failed_loads == 1
        write_model(tmp_path, "broken", 1, mlp_model())
        await anyio.sleep(FIRST_RETRY_S)
        response = await service.infer("broken", None, request())
        assert response.outputs[0][1].shape == (1, 3)
        assert repo.models["good"].name == "good"


async def test_a_model_alone_over_the_budget_is_refused_with_both_sizes(tmp_path: Path) -> None:
    write_model(tmp_path, "big", 1, matmul_model(512))  # 1 MiB of weights
    write_config(tmp_path, "big", {"device": "CPU"})
    service = InferenceService(ModelRepository(tmp_path), memory_budget="512KiB")
    async with service.lifespan():
        assert states(service)["big"][0] == "UNAVAILABLE"
        with pytest.raises(ModelMemoryError) as refused:
            await service.infer("big", None, request(512))
    message = str(refused.value)
    assert re.search(r"needs at least 1\.0 MiB \(\d+ bytes\)", message), message
    assert "the budget is 512.0 KiB (524288 bytes)" in message
    assert loads(service)["big"].loads == 0


async def test_an_idle_model_goes_before_a_busy_one_and_a_busy_one_drains(
    tmp_path: Path,
) -> None:
    repo = repository(tmp_path, busy=SMALL, idle=SMALL, next={**SMALL, "pinned": True}, last=SMALL)
    service = InferenceService(repo, model_control_mode="explicit", memory_budget=BUDGET)
    release = anyio.Event()
    answered: list[np.ndarray] = []

    async def hold(*, task_status: TaskStatus[None]) -> None:
        # A request admitted to "busy" (in flight, as a transport's call is while it
        # reads the body), whose inference runs only once released.
        async with service.call("busy", None) as call:
            task_status.started()
            await release.wait()
            answered.append((await call.infer(request())).outputs[0][1])

    async def infer_last() -> None:
        await service.infer("last", None, request())

    async with service.lifespan():
        reference = (await service.infer("busy", None, request())).outputs[0][1]
        async with anyio.create_task_group() as group:
            await group.start(hold)
            await service.infer("idle", None, request())  # busy: the least recently used
            await service.infer("next", None, request())
            assert sorted(service.models) == ["busy", "next"]  # the idle one went
            group.start_soon(infer_last)  # only busy can go: it drains first
            with anyio.fail_after(30):  # a hang guard
                while states(service)["busy"][0] != "UNLOADING":
                    await anyio.sleep(0.01)
            assert "last" not in service.models
            release.set()  # the request in flight is answered by the model it came to
        assert sorted(service.models) == ["last", "next"]
    assert len(answered) == 1
    np.testing.assert_array_equal(answered[0], reference)
    figures = loads(service)
    assert (figures["idle"].evictions, figures["busy"].evictions) == (1, 1)


async def test_resident_memory_over_the_budget_unloads_idle_models(tmp_path: Path) -> None:
    # "big" is declared at 1 MiB but holds 36 MiB of weights: the accounts fit the
    # budget, the server's resident memory does not.
    write_model(tmp_path, "big", 1, matmul_model(3072))
    write_config(tmp_path, "big", {"device": "CPU", "batching": False, "memory_bytes": MB})
    write_model(tmp_path, "small", 1, mlp_model())
    write_config(tmp_path, "small", {"device": "CPU", "memory_bytes": MB})
    service = InferenceService(
        ModelRepository(tmp_path), model_control_mode="explicit", memory_budget=24 * MB
    )
    async with service.lifespan():
        await service.infer("big", None, request(3072))
        assert service.manager.used_bytes() == MB
        await service.infer("small", None, request())
        assert list(service.models) == ["small"]
        state, reason = states(service)["big"]
        assert (state, reason) == ("UNAVAILABLE", "evicted: least recently used, to load 'small'")
