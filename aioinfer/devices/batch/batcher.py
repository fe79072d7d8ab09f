"""The batcher: coalesces queued inferences along the first axis and runs them as one.

Policy (the dynamic batcher of the established servers, with a bounded queue delay):
while every stream of the target is busy, items queue up; when a stream is free, the
batcher runs the head's batch as soon as one of these holds, and splits the outputs back:

- the rows queued for the head's input signature fill ``max_batch_size``;
- nobody else can join: every open infer request of the compiled model (its *members*,
  a closed population such as an ``AsyncInferQueue``) already has its rows in the
  batcher, and no direct call (``infer_timed``, an open population) is in it;
- the batch holds its share of the members: ``ceil(members / depth)`` inferences, where
  ``depth`` is the number of batches that keep the target busy (its
  ``OPTIMAL_NUMBER_OF_INFER_REQUESTS``, two per stream on the CPU). The members then
  cycle in that many batches: some compute while the loop answers and resubmits the
  others, instead of one batch of everyone that leaves the device idle while the loop
  answers it. Such a batch counts as full (below);
- everyone expected is back: the batcher expects an arrival for every inference it
  answered (a client in a closed loop sends its next request once answered), until
  they are all back or none came for a while: four timeouts, or four times the mean
  delay from an answer to the first arrival after it if that is longer (a server
  writes every answer of a batch before it reads the next requests). When no such
  arrival is expected any more and every queued inference is one of those returns, the
  batch starts: a lone client sending one request after the other never waits;
- waiting cannot pay any more: no further arrival is expected before the head's
  deadline. The batcher keeps the mean gap ``g`` between arrivals (an exponential
  average, weight 1/4, of the last gaps, each counted up to four timeouts) and starts
  the batch at ``enqueued + timeout - g``: under steady traffic the head waits the
  timeout less one gap, and after a quiet spell of four timeouts a lone arrival runs at
  once. A new compiled model starts from ``g = 0`` (it waits the whole timeout).
  While returns are expected, ``g`` is the mean gap between the returns after the first
  of each burst instead, not the idle gap while a batch computed and was answered (nor
  the first return's delay): the first client back after a batch of
  ``n`` finds the device idle, and would otherwise start a batch of one row, as costly
  as a full one, that the other ``n - 1`` then wait for;
- the head has waited ``timeout`` seconds (the bound of every wait).

Measured on a shared 2-core machine, ``AsyncInferQueue(compiled)`` on the auto-batched
4x1024 MLP: with the fixed 1 ms wait (and 4 requests, so that every batch waited it out)
0.37-0.43x onnxruntime's throughput; with this policy (and 64 requests, see
``BatchCompiledModel.optimal_number_of_infer_requests``) 1.0-1.5x.

A target whose ``OPTIMAL_NUMBER_OF_INFER_REQUESTS`` exceeds its streams queues work of
its own (the PROCESS worker does, and the CPU's task executor): full batches, and only
those, are then handed to it while its streams are busy, up to that many batches in all,
so that the next batch starts the moment a stream frees up instead of after the event
loop has noticed and dispatched it. Partial batches still wait for a free stream: under
load they would only run smaller batches sooner. An item's queue time includes the time
its batch waited in the target (the target request's ``queued_seconds``).

Everything here runs on the event loop's thread, except :meth:`Batcher.cancel`, which may
be called from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections import Counter, deque
from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
import numpy as np
from anyio import RunFinishedError

from aioinfer.errors import InferCancelledError, InferenceError, RequestClosedError
from aioinfer.plugin.executors import spawn_detached

if TYPE_CHECKING:
    from aioinfer.plugin.async_request import AsyncInferRequest
    from aioinfer.plugin.compiled_model import CompiledModel


class ItemState(Enum):
    """Where one request's rows are."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    WITHDRAWN = "withdrawn"


class _Batch:
    """A batch being computed: the target request running it and how many items still
    wait for its outputs (when none does, the compute is cancelled)."""

    __slots__ = ("live", "request")

    def __init__(self, request: AsyncInferRequest, live: int) -> None:
        self.request = request
        self.live = live


class _FutureDone:
    """``set()`` and ``await wait()`` of an event with one waiter, on an asyncio future.

    Cancelling the waiter cancels the future; a later ``set()`` then does nothing.
    """

    __slots__ = ("future",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.future: asyncio.Future[None] = loop.create_future()

    def set(self) -> None:
        if not self.future.done():
            self.future.set_result(None)

    def wait(self) -> asyncio.Future[None]:
        return self.future


class BatchItem:
    """The rows of one inference, waiting for (or taking part in) a batch."""

    __slots__ = (
        "batch",
        "batch_rows",
        "batch_size",
        "dispatched",
        "done",
        "enqueued",
        "error",
        "expected",
        "inputs",
        "loop",
        "member",
        "outputs",
        "rows",
        "signature",
        "state",
        "token",
    )

    def __init__(self, inputs: Sequence[np.ndarray], member: bool = False) -> None:
        self.inputs = list(inputs)
        self.member = member
        """Submitted by a member infer request (else by a direct call)."""
        self.rows = int(self.inputs[0].shape[0])
        # Only inputs that agree past the first axis can be joined.
        self.signature = tuple([array.shape[1:] for array in self.inputs])
        self.enqueued = time.perf_counter()
        self.dispatched = self.enqueued
        self.expected = False
        """Whether the batcher expected it: a return of an inference it answered."""
        # A bare future where the loop is asyncio: an item is made per inference, and
        # anyio's events are several times slower to create.
        self.loop: asyncio.AbstractEventLoop | None
        self.done: _FutureDone | anyio.Event
        self.token: anyio.lowlevel.EventLoopToken | None = None
        try:
            self.loop = asyncio.get_running_loop()
            self.done = _FutureDone(self.loop)
        except RuntimeError:  # not asyncio (trio)
            self.loop = None
            self.done = anyio.Event()
            self.token = anyio.lowlevel.current_token()
        self.state = ItemState.QUEUED
        self.batch: _Batch | None = None
        self.outputs: list[np.ndarray] | None = None
        self.error: BaseException | None = None
        self.batch_rows = 0
        """Rows of the batch this item ran in."""
        self.batch_size = 0
        """Number of inferences in that batch."""

    def resolve(self, outputs: list[np.ndarray] | None, error: BaseException | None) -> bool:
        """Hand the outputs (or the error) to the waiting inference, unless it left;
        True when the item was still queued or running (it leaves the batcher now)."""
        if self.state is ItemState.WITHDRAWN or self.state is ItemState.DONE:
            return False
        self.state = ItemState.DONE
        self.outputs, self.error = outputs, error
        self.done.set()
        return True


class Batcher:
    """The queue and dispatcher of one BATCH compiled model.

    ``target`` is the compiled model that runs the batches; up to ``target.streams``
    batches run at once, each on one of the target's infer requests, and full batches
    more wait in the target up to its ``OPTIMAL_NUMBER_OF_INFER_REQUESTS``. The compiled
    model's infer requests register with :meth:`add_member` while they are open.
    """

    def __init__(self, target: CompiledModel, max_batch_size: int, timeout: float) -> None:
        self.target = target
        self.max_batch_size = max_batch_size
        self.timeout = timeout
        self.depth = max(
            target.streams, int(target.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        )
        """Batches handed to the target at most (running or waiting there)."""
        self.statistics: Counter[int] = Counter()
        """Batches run so far, by number of rows."""
        self._queue: deque[BatchItem] = deque()
        self._queued_rows = 0
        self._idle: list[AsyncInferRequest] = []
        self._running = 0
        """Batches handed to the target and not yet answered."""
        self._changed: anyio.Event | None = None
        self._dispatcher: object | None = None
        """Identifies the dispatcher task that forms batches (None: none does)."""
        self._members: weakref.WeakSet[object] = weakref.WeakSet()
        self._members_in = 0
        """Items of members queued or running."""
        self._direct_in = 0
        """Items of direct calls queued or running."""
        self._gap = 0.0
        """The mean gap between arrivals (seconds; see the module's docstring)."""
        self._last_arrival: float | None = None
        self._expected = 0
        """Arrivals expected: answered inferences whose callers may send again."""
        self._expected_since = 0.0
        """The last answer or expected arrival (the expectation lapses after a quiet
        spell, see :meth:`_expecting`)."""
        self._answered_at = 0.0
        """When inferences were last answered."""
        self._return_delay = 0.0
        """The mean time from an answer to the first arrival after it (seconds)."""
        self._burst_gap = 0.0
        """The mean gap between expected arrivals after the first (seconds)."""

    def add_member(self, request: object) -> None:
        """Count ``request`` (an infer request of the compiled model) among those whose
        next inference may join a batch, until :meth:`remove_member` (or until it is
        garbage-collected)."""
        self._members.add(request)

    def remove_member(self, request: object) -> None:
        """Stop counting ``request`` (it was closed)."""
        self._members.discard(request)
        self._notify()  # the others may be all in now

    # -- the side of the waiting inferences -----------------------------------------------

    def submit(self, inputs: Sequence[np.ndarray], member: bool = False) -> BatchItem:
        """Queue the (validated) inputs of one inference; await ``item.done`` for it.
        ``member``: submitted by a member request (see :meth:`add_member`)."""
        item = BatchItem(inputs, member)
        self._queue.append(item)
        self._queued_rows += item.rows
        if member:
            self._members_in += 1
        else:
            self._direct_in += 1
        now = item.enqueued
        first = self._last_arrival is None or self._last_arrival < self._answered_at
        if first and self._answered_at:  # the first arrival since an answer
            delay = now - self._answered_at
            if self._return_delay:
                delay = self._return_delay + (delay - self._return_delay) / 4
            self._return_delay = delay
        if self._expecting(now):
            item.expected = True
            self._expected -= 1
            if not first:
                assert self._last_arrival is not None
                gap = min(now - self._last_arrival, 4 * self.timeout)
                self._burst_gap += (gap - self._burst_gap) / 4
            self._expected_since = now
        if self._last_arrival is not None:
            gap = min(now - self._last_arrival, 4 * self.timeout)
            self._gap += (gap - self._gap) / 4
        self._last_arrival = now
        if self._dispatcher is None:
            self._dispatcher = dispatcher = object()
            spawn_detached(lambda: self._dispatch(dispatcher))
        elif (
            self._queued_rows >= self.max_batch_size
            or (item.expected and not self._expected)
            or (member and (self._all_in() or 0 < self._share() <= len(self._queue)))
        ):
            self._notify()
        return item

    def _expecting(self, now: float) -> bool:
        """Whether an arrival is expected (see the module's docstring); an expectation
        that saw no arrival for four timeouts, or for four times the mean delay from an
        answer to the next arrival if that is longer, lapses."""
        quiet = now - self._expected_since
        if self._expected and quiet > 4 * max(self.timeout, self._return_delay):
            self._expected = 0
        return self._expected > 0

    def _answering(self, count: int) -> None:
        """Expect ``count`` more arrivals: the callers of inferences being answered."""
        self._expected += count
        self._expected_since = self._answered_at = time.perf_counter()

    def _caught_up(self) -> bool:
        """Whether every queued inference is an expected return and no other is
        expected (see the module's docstring)."""
        if self._expecting(time.perf_counter()):
            return False
        return all(item.expected for item in self._queue)

    def _all_in(self) -> bool:
        """Whether nobody else can join: every member is in, and no direct call."""
        return self._direct_in == 0 and self._members_in >= len(self._members)

    def _share(self) -> int:
        """The inferences a batch of members holds (0: no members, or a direct call is
        in; see the module's docstring)."""
        if self._direct_in or not self._members:
            return 0
        return -(-len(self._members) // self.depth)

    def _leave(self, item: BatchItem) -> None:
        if item.member:
            self._members_in -= 1
        else:
            self._direct_in -= 1

    def _resolve(
        self, item: BatchItem, outputs: list[np.ndarray] | None, error: BaseException | None
    ) -> None:
        if item.resolve(outputs, error):
            self._leave(item)

    def withdraw(self, item: BatchItem) -> None:
        """Take ``item`` out: out of the queue, or out of its running batch (whose compute
        stops when no item waits for it any more). Other items are not touched."""
        if item.state is ItemState.QUEUED:
            self._queue.remove(item)
            self._queued_rows -= item.rows
            self._leave(item)
            self._notify()
        elif item.state is ItemState.RUNNING:
            self._leave(item)
            if item.batch is not None:
                item.batch.live -= 1
                if item.batch.live == 0:
                    item.batch.request.cancel()
        item.state = ItemState.WITHDRAWN

    def cancel(self, item: BatchItem) -> None:
        """Withdraw ``item`` and fail it with :class:`InferCancelledError` (any thread)."""
        # If its event loop is gone, so is whoever waited for it.
        with contextlib.suppress(RunFinishedError, RuntimeError):
            if item.loop is not None:
                item.loop.call_soon_threadsafe(self._cancel, item)
            else:
                assert item.token is not None
                token = item.token
                token.backend_class.run_sync_soon(self._cancel, (item,), token.native_token)

    def _cancel(self, item: BatchItem) -> None:
        if item.state in (ItemState.QUEUED, ItemState.RUNNING):
            self.withdraw(item)
            item.error = InferCancelledError("the inference was cancelled")
            item.done.set()

    # -- the dispatcher -------------------------------------------------------------------

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def _changes(self) -> None:
        self._changed = self._changed or anyio.Event()
        await self._changed.wait()

    async def _dispatch(self, dispatcher: object) -> None:
        """Form and start batches while items are queued (one dispatcher at a time)."""
        try:
            async with anyio.create_task_group() as group:
                while await self._until_ready():
                    try:
                        request = self._request()
                    except RequestClosedError as exc:  # the target was closed under us
                        for item in self._queue:
                            self._resolve(item, None, RequestClosedError(str(exc)))
                        self._queue.clear()
                        self._queued_rows = 0
                        break
                    self._running += 1
                    group.start_soon(self._run, self._take(request), request)
                # A new item from now on starts a new dispatcher; batches still running
                # finish in this task group.
                self._dispatcher = None
        finally:
            if self._dispatcher is dispatcher:  # cancelled (its event loop is ending)
                self._dispatcher = None

    def _request(self) -> AsyncInferRequest:
        """An idle target request, or a new one (``_until_ready`` lets at most ``depth``
        batches run, so at most that many are made)."""
        if self._idle:
            return self._idle.pop()
        return self.target.create_infer_request()

    async def _until_ready(self) -> bool:
        """Wait until the head's batch may start: it is full and fewer than ``depth``
        batches are in the target, or a stream is free and the batch is full, holds
        everyone who could join, or waiting cannot pay any more (see the module's
        docstring). False when the queue ran empty."""
        streams = self.target.streams
        while self._queue:
            head = self._queue[0]
            if self._running < self.depth and self._full(head):
                return True
            if self._running >= streams:
                await self._changes()  # a batch ends, or the queue fills a batch
                continue
            if self._all_in() or self._caught_up():
                return True
            remaining = self._start_at(head) - time.perf_counter()
            if remaining <= 0:
                return True
            with anyio.move_on_after(remaining):
                await self._changes()
        return False

    def _start_at(self, head: BatchItem) -> float:
        """When the head's batch starts unless something happens first: its deadline,
        less the expected wait for the next arrival (the mean gap; within a burst of
        expected returns, the mean gap between those)."""
        gap = self._burst_gap if self._expected else self._gap
        return head.enqueued + self.timeout - gap

    def _full(self, head: BatchItem) -> bool:
        """Whether the head's batch is full: ``max_batch_size`` rows, or the members'
        share of inferences."""
        share = self._share()
        if share and len(self._queue) >= share:
            return True
        return self._rows_like(head) >= self.max_batch_size

    def _rows_like(self, head: BatchItem) -> int:
        if self._queued_rows < self.max_batch_size:
            return self._queued_rows
        return sum(item.rows for item in self._queue if item.signature == head.signature)

    def _take(self, request: AsyncInferRequest) -> list[BatchItem]:
        """Take the head and the items behind it that fit into its batch (up to the
        members' share of inferences while only members are in)."""
        head = self._queue[0]
        taken: list[BatchItem] = []
        kept, rows = deque[BatchItem](), 0
        most = self._share() or len(self._queue)
        for item in self._queue:
            fits = (
                item.signature == head.signature
                and rows + item.rows <= self.max_batch_size
                and len(taken) < most
            )
            if item is head or fits:
                taken.append(item)
                rows += item.rows
            else:
                kept.append(item)
        self._queue = kept
        self._queued_rows -= rows
        batch = _Batch(request, len(taken))
        now = time.perf_counter()
        for item in taken:
            item.state, item.batch, item.dispatched = ItemState.RUNNING, batch, now
            item.batch_rows, item.batch_size = rows, len(taken)
        return taken

    async def _run(self, items: list[BatchItem], request: AsyncInferRequest) -> None:
        """Run one batch on ``request`` and hand each item its rows of the outputs."""
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._running -= 1
                self._idle.append(request)
                self._notify()

        try:
            live = [item for item in items if item.state is ItemState.RUNNING]
            if not live:
                return
            rows = sum(item.rows for item in live)
            self.statistics[rows] += 1
            inputs = live[0].inputs if len(live) == 1 else _join([i.inputs for i in live])
            try:
                # The batcher owns these arrays (joined here, or an item's own copies),
                # and nothing changes them while the batch reads them; a request whose
                # rows were withdrawn may refill its buffers, but then nobody reads this
                # batch's results.
                results = await request.infer(inputs, share_inputs=True)
            except InferCancelledError:
                return  # every item was withdrawn; each has its answer already
            except Exception as exc:
                if len(live) == 1:
                    self._answering(1)
                    self._resolve(live[0], None, exc)
                else:
                    # One bad item must not fail the others: run each on its own.
                    await self._run_alone(live, request)
                return
            outputs = results.to_tuple()  # owned arrays: the request may run again now
            self._answering(sum(item.state is ItemState.RUNNING for item in live))
            if request.queued_seconds:  # the batch waited in the target for a stream
                for item in live:
                    item.dispatched += request.queued_seconds
            # Free the request, and let the dispatcher start the next batch before this
            # batch's inferences resume and answer: compute and answering then overlap.
            release()
            await anyio.lowlevel.cancel_shielded_checkpoint()
            if len(live) == 1:
                self._resolve(live[0], list(outputs), None)
                return
            for item, parts in zip(live, _split(outputs, [i.rows for i in live])):
                self._resolve(item, *parts)
        finally:
            release()

    async def _run_alone(self, items: list[BatchItem], request: AsyncInferRequest) -> None:
        for item in items:
            if item.state is not ItemState.RUNNING:
                continue
            item.batch = _Batch(request, 1)
            item.batch_rows, item.batch_size = item.rows, 1
            try:
                results = await request.infer(item.inputs, share_inputs=True)
            except InferCancelledError:
                continue
            except Exception as exc:
                self._answering(1)
                self._resolve(item, None, exc)
            else:
                self._answering(1)
                self._resolve(item, list(results.to_tuple()), None)


def _join(inputs: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Concatenate the items' inputs along the first axis, input by input."""
    return [np.concatenate(parts, axis=0) for parts in zip(*inputs)]


def _split(
    outputs: Sequence[np.ndarray], rows: list[int]
) -> list[tuple[list[np.ndarray] | None, BaseException | None]]:
    """Each item's rows of every output (copies, so that no result keeps the batch
    alive), or an error for every item when an output does not have one row per row."""
    total = sum(rows)
    for index, output in enumerate(outputs):
        if output.ndim == 0 or output.shape[0] != total:
            shape = list(output.shape)
            return [
                (
                    None,
                    InferenceError(
                        f"output {index} of a batch of {total} rows has shape {shape}; "
                        "the BATCH device needs one output row per input row"
                    ),
                )
                for _ in rows
            ]
    parts: list[tuple[list[np.ndarray] | None, BaseException | None]] = []
    start = 0
    for count in rows:
        parts.append(([output[start : start + count].copy() for output in outputs], None))
        start += count
    return parts
