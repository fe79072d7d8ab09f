"""The CPU device runs short plans on the event loop's thread (``CPU_INLINE_RUN_US``)."""

from __future__ import annotations

import anyio
import numpy as np
import pytest

import aioinfer as ai
from tests import helpers

pytestmark = pytest.mark.anyio

WIDTH = 8


def _compiled(steps: int, width: int = WIDTH, **config: object) -> ai.CompiledModel:
    return ai.Core().compile_model(helpers.chain_model(steps, width), "CPU", config)


def _input(width: int = WIDTH) -> np.ndarray:
    return np.random.default_rng(3).standard_normal((2, width)).astype(np.float32)


async def test_a_short_plan_runs_inline_once_its_run_time_is_known() -> None:
    """The first run of new input shapes goes to a compute thread (its time unknown):
    ``queued_seconds`` is the wait for that thread, never exactly 0. Once a run was
    short, the next ones run inline: they waited for no thread at all. (The first runs
    also build the shapes' plan and its buffers: on a loaded machine they can take
    longer than the budget, so the runs before the first inline one are not counted.)"""
    compiled = _compiled(2)
    request = compiled.create_infer_request()
    x = _input()
    first = await request.infer({"x": x})
    assert request.queued_seconds > 0.0
    for _ in range(10):
        await request.infer({"x": x})
        if request.queued_seconds == 0.0:
            break
    waits = []
    for _ in range(5):
        results = await request.infer({"x": x})
        waits.append(request.queued_seconds)
        np.testing.assert_array_equal(results["y"], first["y"])
    assert waits == [0.0] * 5
    await compiled.close()


async def test_inline_runs_can_be_turned_off_and_long_plans_use_threads() -> None:
    """``CPU_INLINE_RUN_US=0`` sends every run to a thread; so does a plan whose runs
    take longer than the budget."""
    for compiled, x in (
        (_compiled(2, CPU_INLINE_RUN_US=0), _input()),
        (_compiled(2, CPU_INLINE_RUN_US=1), _input()),  # no plan runs in 1 us
    ):
        assert compiled.get_property("CPU_INLINE_RUN_US") in (0, 1)
        request = compiled.create_infer_request()
        for _ in range(4):
            await request.infer({"x": x})
            assert request.queued_seconds > 0.0
        await compiled.close()


async def test_a_long_first_run_of_new_shapes_is_not_counted() -> None:
    """The run that builds a plan for new input shapes does one-time work: when it takes
    longer than the budget it is not recorded (the next run is measured instead), so
    it cannot keep short runs off the loop for several runs."""
    compiled = _compiled(2, CPU_INLINE_RUN_US=1)  # every run is longer than 1 us
    times = compiled.run_times  # type: ignore[attr-defined]
    request = compiled.create_infer_request()
    x = _input()
    await request.infer({"x": x})
    assert times.seconds == {}
    await request.infer({"x": x})
    assert len(times.seconds) == 1
    await compiled.close()


async def test_inline_runs_let_other_tasks_run_every_budget() -> None:
    """A task that infers in a loop on a short model yields to the event loop whenever
    the loop last had a turn ``CPU_INLINE_RUN_US`` or more ago: another task runs at
    least once per budget plus one run."""
    compiled = _compiled(2)
    budget = compiled.get_property("CPU_INLINE_RUN_US") / 1e6
    request = compiled.create_infer_request()
    x = _input()
    for _ in range(2):
        await request.infer({"x": x})

    # (A run that a loaded machine stretches past the budget goes to a thread, which
    # gives the loop turns too: the bound holds either way.)
    await helpers.assert_inline_runs_share_the_loop(lambda: request.infer({"x": x}), budget)
    await compiled.close()


async def test_an_inline_run_cancelled_before_it_starts_never_runs() -> None:
    """Cancelling the awaiting task before its inline run raises the cancellation; the
    request stays idle, its results those of the last completed inference."""
    compiled = _compiled(2)
    request = compiled.create_infer_request()
    x = _input()
    for _ in range(2):
        last = await request.infer({"x": x})
    with anyio.CancelScope() as scope:
        scope.cancel()
        await request.infer({"x": 2 * x})
    assert scope.cancelled_caught
    assert request.state is ai.RequestState.IDLE
    np.testing.assert_array_equal(request.results["y"], last["y"])
    again = await request.infer({"x": x})
    np.testing.assert_array_equal(again["y"], last["y"])
    await compiled.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_asyncio_cancel_test_agrees_with_anyios_checkpoint() -> None:
    """Under asyncio the inline path reads anyio's task state itself: it must see a
    cancelled scope exactly when anyio's ``checkpoint_if_cancelled`` would raise (a
    cancelled outer scope, a shield in between, no scope at all)."""
    from aioinfer.plugin.inline import _asyncio_scope_cancelled

    async def anyio_says() -> bool:
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
        except anyio.get_cancelled_exc_class():
            return True
        return False

    results = []
    with anyio.CancelScope() as outer:
        ours = _asyncio_scope_cancelled()
        results.append((ours, await anyio_says()))
        outer.cancel()
        with anyio.CancelScope(shield=True), anyio.CancelScope():
            ours = _asyncio_scope_cancelled()
            results.append((ours, await anyio_says()))
        with anyio.CancelScope():
            ours = _asyncio_scope_cancelled()
            results.append((ours, await anyio_says()))
    assert results == [(False, False), (False, False), (True, True)]
