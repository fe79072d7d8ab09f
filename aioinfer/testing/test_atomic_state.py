"""Atomic steps under random cancels: a step is completed or cancelled, never both.

An accumulator (``present = past + x``, int64: exact) runs 300 steps on one request; each
step is cancelled at a random point (after a random number of turns of the event loop, up
to about a step's worth, or while its callback runs) in one of these ways: cancelling the
task that awaits ``infer()`` (a cancel scope), ``request.cancel()`` after
``start_async``, cancelling the task that awaits ``wait()``, and under asyncio also
asyncio's own ``task.cancel()`` of a task awaiting ``infer()`` (which no cancel scope
shields from). After every step exactly one of these holds:

- completed: the state advanced by ``x``; ``request.error`` is None; the callback was told
  None; ``infer()`` returned the results, and so did ``wait()`` after ``cancel()`` (a
  task cancelled while it awaited ``wait()``, or by ``task.cancel()``, may get its own
  cancellation once the step completed; never ``InferCancelledError``);
- cancelled: the state is as before; ``request.error`` is ``InferCancelledError``; the
  callback was told so; the awaiter got ``InferCancelledError`` (``cancel()``) or its
  own cancellation.

Every device runs the stateful model, keeping its variables natively (CPU) or through
the variable-state layer above the device (TWOSTAGE, PROCESS:CPU); a batching device may
refuse ``STATEFUL`` with ``NotBatchableError`` (BATCH: the requests of a batch cannot each
keep a state), and skips that run. Every device also runs the same loop on the plain
model, where the test feeds the state as ``past`` and a step's commit is the publication
of its results.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np
import pytest

import aioinfer as ai
from aioinfer.testing.fixtures import compile_accumulator

pytestmark = pytest.mark.anyio

STEPS = 300
MODES = {
    "asyncio": ["infer", "cancel", "wait", "native"],
    "trio": ["infer", "cancel", "wait"],
}
"""How a step is cancelled (see the module docstring), by backend."""
WIDTH = 4
"""The accumulator's width (the default of :func:`accumulator_model`)."""


@pytest.fixture(scope="session")
def stateful(every_device: str) -> Iterator[ai.CompiledModel]:
    """The accumulator with its state kept as a variable (one compile serves the tests of
    both backends)."""
    try:
        compiled = compile_accumulator(ai.Core(), every_device, stateful=True)
    except ai.NotBatchableError as exc:  # the one refusal allowed: see the module docstring
        pytest.skip(f"{every_device} refuses STATEFUL: {exc}")
    yield compiled
    anyio.run(compiled.close)


@pytest.fixture(scope="session")
def plain(every_accumulator: tuple[ai.Core, ai.CompiledModel]) -> ai.CompiledModel:
    """The accumulator without variables: the test feeds the state as ``past``."""
    return every_accumulator[1]


@dataclass
class Callback:
    """The request's callback (none, sync or async) and what it was told."""

    kind: str
    told: list[BaseException | None] = field(default_factory=list)
    running: bool = False
    """True while the callback runs: the cancel point ``"callback"`` waits for it."""
    hold: bool = False
    """Whether the sync callback waits for ``cancelled`` (cancel point ``"callback"``)."""
    cancelled: threading.Event = field(default_factory=threading.Event)
    """Set once the cancel was sent: a holding sync callback keeps its thread until then,
    so that the cancel lands while it runs."""

    def install(self, request: ai.InferRequest) -> None:
        if self.kind == "sync":
            request.set_callback(self.sync)
        elif self.kind == "async":
            request.set_callback(self.async_)

    def sync(self, request: ai.InferRequest, userdata: Any) -> None:
        self.running = True
        if self.hold:
            self.cancelled.wait(timeout=10)
        self.told.append(request.error)
        self.running = False

    async def async_(self, request: ai.InferRequest, userdata: Any) -> None:
        self.running = True
        for _ in range(3):
            await anyio.sleep(0)
        self.told.append(request.error)
        self.running = False


async def turns_per_step(request: ai.InferRequest, feed: Callable[[], dict]) -> float:
    """How many turns of the event loop a step without cancels lasts (the mean of a few):
    the scale of the random delays, counted in turns because a step lasts well under the
    resolution of a loop's timers."""
    turns, steps, done = 0, 5, False

    async def spin() -> None:
        nonlocal turns
        while not done:
            await anyio.sleep(0)
            turns += 1

    async with anyio.create_task_group() as group:
        group.start_soon(spin)
        for _ in range(steps):
            await request.infer(feed())
        done = True
    return turns / steps


async def cancelled_step(
    request: ai.InferRequest, inputs: dict, mode: str, callback: Callback, delay: int
) -> str:
    """Run one step and cancel it (mode ``infer``, ``cancel`` or ``wait``) after ``delay``
    turns of the loop, or while its callback runs when ``callback.hold`` is set; return
    what the awaiter saw: ``returned``, ``InferCancelledError`` or ``task cancelled``."""
    scope = anyio.CancelScope()

    async def cancel_later(cancel: Callable[[], object]) -> None:
        if callback.hold:
            while not callback.running:
                await anyio.sleep(0)
        else:
            for _ in range(delay):
                await anyio.sleep(0)
        cancel()
        callback.cancelled.set()

    outcome = "returned"
    async with anyio.create_task_group() as group:
        if mode == "native":
            task = asyncio.get_running_loop().create_task(request.infer(inputs))
            group.start_soon(cancel_later, task.cancel)
            await asyncio.wait([task])
            if task.cancelled():
                outcome = "task cancelled"
            elif isinstance(task.exception(), ai.InferCancelledError):
                outcome = "InferCancelledError"
        else:
            if mode != "infer":
                request.start_async(inputs)
            cancel = request.cancel if mode == "cancel" else scope.cancel
            group.start_soon(cancel_later, cancel)
            with scope:
                try:
                    await (request.infer(inputs) if mode == "infer" else request.wait())
                except ai.InferCancelledError:
                    outcome = "InferCancelledError"
        group.cancel_scope.cancel()  # a canceller that did not fire yet
    return "task cancelled" if scope.cancelled_caught else outcome


async def run_steps(
    compiled: ai.CompiledModel, stateful: bool, kind: str, backend: str, seed: int
) -> None:
    request = compiled.create_infer_request()
    callback = Callback(kind)
    callback.install(request)
    rng = random.Random(seed)
    state = np.zeros((1, WIDTH), np.int64)  # the plain model's state, fed as ``past``

    def feed(x: np.ndarray | None = None) -> dict[str, np.ndarray]:
        x = np.ones((1, WIDTH), np.int64) if x is None else x
        return {"x": x} if stateful else {"x": x, "past": state}

    def current() -> np.ndarray:
        if stateful:
            return request.query_state()[0].state.copy()
        return state.copy()

    scale = await turns_per_step(request, feed)
    if stateful:
        request.reset_state()
    counts = {"completed": 0, "cancelled": 0, "during callback": 0}
    for step in range(STEPS):
        x = np.full((1, WIDTH), step + 1, np.int64)
        before, published = current(), request.results
        callback.told.clear()
        callback.cancelled.clear()
        mode = rng.choice(MODES[backend])
        point = "callback" if kind != "none" and rng.random() < 0.3 else "delay"
        # Skewed towards few turns: a step's cancellable part may be a small share of it
        # (an ORT run inline on the loop, then a sync callback's thread hop), and a
        # uniform delay over the whole step would then rarely land before the commit.
        delay = int((scale + 2) * rng.random() ** 3)
        callback.hold = point == "callback"
        if point == "callback":
            counts["during callback"] += 1
        outcome = await cancelled_step(request, feed(x), mode, callback, delay)

        where = f"step {step}: {mode} cancelled at {point} ({delay} turns): {outcome}"
        assert request.state is ai.RequestState.IDLE, where
        if stateful:
            advanced = np.array_equal(current(), before + x)
            unchanged = np.array_equal(current(), before)
        else:
            advanced = request.results is not published
            unchanged = not advanced
            if advanced:
                assert request.results is not None, where
                np.testing.assert_array_equal(request.results["present"], before + x, where)
                state = request.results["present"]
        assert advanced != unchanged, f"{where}: the state is neither old nor advanced"
        if advanced:
            counts["completed"] += 1
            assert request.error is None, f"{where}: completed, but error {request.error!r}"
            own = mode in ("wait", "native")  # the task's own cancellation may come after
            allowed = {"returned", "task cancelled"} if own else {"returned"}
            assert outcome in allowed, f"{where}: completed, but the awaiter saw otherwise"
            assert request.results is not None, where
            np.testing.assert_array_equal(request.results["y"], before + x, where)
        else:
            counts["cancelled"] += 1
            assert isinstance(request.error, ai.InferCancelledError), where
            expected = "InferCancelledError" if mode == "cancel" else "task cancelled"
            assert outcome == expected, where
        if kind != "none":
            assert len(callback.told) == 1, f"{where}: the callback was told {callback.told}"
            told = callback.told[0]
            assert told is None if advanced else isinstance(told, ai.InferCancelledError), where
    # The random points reached both outcomes, and the callbacks.
    assert counts["completed"] > 0 and counts["cancelled"] > 0, counts
    assert kind == "none" or counts["during callback"] > 0, counts


@pytest.mark.parametrize("kind", ["none", "sync", "async"])
async def test_stateful_steps_are_completed_or_cancelled(stateful, kind, anyio_backend):
    await run_steps(stateful, stateful=True, kind=kind, backend=anyio_backend, seed=1)


@pytest.mark.parametrize("kind", ["none", "sync", "async"])
async def test_steps_are_completed_or_cancelled(plain, kind, anyio_backend):
    await run_steps(plain, stateful=False, kind=kind, backend=anyio_backend, seed=2)
