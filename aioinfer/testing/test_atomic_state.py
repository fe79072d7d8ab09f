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

A KV-cache decoder (8 variables of a few thousand positions, so that a step lasts long
enough to be cancelled in its middle) is cancelled at once (``move_on_after(0)``) or
after a random part of a step, with each kind of callback: a cancelled step leaves
every variable exactly as it was (OpenVINO, for one, writes each variable as the step
reaches it, so a device that stops a step between two of them must give the others
back).
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
from aioinfer.testing.fixtures import compile_accumulator, compile_stateful
from aioinfer.testing.models import kv_decoder_model

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


# -- a KV-cache decoder, cancelled at once or in the middle of its compute ------------------

CACHE = 6000
"""Positions in each of the decoder's 8 KV variables before the steps: a step reads and
writes the whole cache, long enough to be cancelled in the middle on any device."""
KV_STEPS = 8
"""Steps per cancel point and callback kind."""


@pytest.fixture(scope="session")
def kv_decoder(every_device: str) -> Iterator[ai.CompiledModel]:
    """:func:`~aioinfer.testing.models.kv_decoder_model` (4 layers: 8 variables) with
    ``STATEFUL: auto``."""
    try:
        compiled = compile_stateful(ai.Core(), every_device, kv_decoder_model())
    except ai.NotBatchableError as exc:  # the one refusal allowed: see the module docstring
        pytest.skip(f"{every_device} refuses STATEFUL: {exc}")
    yield compiled
    anyio.run(compiled.close)


def snapshot(request: ai.InferRequest) -> dict[str, np.ndarray]:
    """Copies of every variable's value."""
    return {state.name: state.state.copy() for state in request.query_state()}


@pytest.mark.parametrize("kind", ["none", "sync", "async"])
@pytest.mark.parametrize("point", ["at once", "mid-compute"])
async def test_a_cancelled_kv_step_leaves_every_variable(kv_decoder, point, kind, anyio_backend):
    """A decode step of a KV-cache decoder whose awaiting task is cancelled at once
    (``move_on_after(0)``) or after a random part of a step either completes, and the
    caller is told so (``infer()`` returned, ``error`` None, the callback told None,
    every variable grew by the step's position with its old positions kept), or is
    cancelled with every variable exactly as it was (shape and values), the caller and
    the callback told ``InferCancelledError`` and the awaiter its own cancellation."""
    request = kv_decoder.create_infer_request()
    callback = Callback(kind)
    callback.install(request)
    rng = np.random.default_rng(7)
    width = kv_decoder.inputs[0].shape[-1]
    for state in request.query_state():
        state.state = rng.standard_normal((1, CACHE, width)).astype(np.float32)

    def feed() -> dict[str, np.ndarray]:
        return {"x": rng.standard_normal((1, 1, width)).astype(np.float32)}

    durations = []
    for _ in range(3):
        started = anyio.current_time()
        await request.infer(feed())
        durations.append(anyio.current_time() - started)
    step = min(durations)
    counts = {"completed": 0, "cancelled": 0}
    for index in range(KV_STEPS):
        before = snapshot(request)
        callback.told.clear()
        delay = 0.0 if point == "at once" else step * float(rng.random())
        results = None
        with anyio.move_on_after(delay) as scope:
            results = await request.infer(feed())
        after = snapshot(request)
        where = f"step {index} cancelled {point} ({delay * 1e3:.1f} ms)"
        assert request.state is ai.RequestState.IDLE, where
        if results is not None:
            counts["completed"] += 1
            assert request.error is None, where
            assert not scope.cancelled_caught, f"{where}: infer() returned, yet cancelled"
            for name, old in before.items():
                new = after[name]
                assert new.shape == (1, old.shape[1] + 1, width), f"{where}: {name} {new.shape}"
                np.testing.assert_array_equal(new[:, :-1], old, f"{where}: {name}")
        else:
            counts["cancelled"] += 1
            assert scope.cancelled_caught, where
            assert isinstance(request.error, ai.InferCancelledError), f"{where}: {request.error!r}"
            for name, old in before.items():
                assert after[name].shape == old.shape, (
                    f"{where}: cancelled, yet {name} went from {old.shape} to {after[name].shape}"
                )
                np.testing.assert_array_equal(after[name], old, f"{where}: cancelled: {name}")
        if kind != "none":
            assert len(callback.told) == 1, f"{where}: the callback was told {callback.told}"
            told = callback.told[0]
            if results is not None:
                assert told is None, where
            else:
                assert isinstance(told, ai.InferCancelledError), f"{where}: {told!r}"
    assert counts["completed"] + counts["cancelled"] == KV_STEPS
    await request.close()
