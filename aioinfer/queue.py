"""AsyncInferQueue: a pool of infer requests that keeps the device busy.

``QueueEngine`` and ``QueueErrors``, what a device implements to run the queue itself,
live in the plugin API (:mod:`aioinfer.plugin.queue_engine`) and are importable from
here too.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import anyio

from aioinfer.plugin.async_request import invoke_callback
from aioinfer.plugin.executors import LoopEvent, loop_event
from aioinfer.plugin.queue_engine import QueueEngine, QueueErrors

if TYPE_CHECKING:
    from types import TracebackType

    from aioinfer.plugin.async_request import AsyncInferRequest
    from aioinfer.plugin.compiled_model import CompiledModel
    from aioinfer.plugin.sync_request import Inputs


class RequestsQueue(QueueErrors):
    """The generic engine of an ``AsyncInferQueue``: ``count`` requests of the compiled
    model (:meth:`CompiledModel.create_infer_request`), the idle ones in a deque, each
    job's end reported through the request's callback. The methods are those of
    :class:`AsyncInferQueue`, which documents them."""

    def __init__(self, compiled_model: CompiledModel, count: int) -> None:
        self._requests = [compiled_model.create_infer_request() for _ in range(count)]
        self.userdata: list[Any] = [None] * count
        """The userdata of the job each request ran last."""
        self._idle: deque[int] = deque(range(count))
        self._idle_changed: LoopEvent | None = None
        self._callback: Callable[[AsyncInferRequest, Any], Any] | None = None
        self._errors: list[BaseException] = []
        self._closed = False
        for index, request in enumerate(self._requests):
            request.set_callback(self._job_done)
            request.set_idle_callback(self._make_release(index))

    def __len__(self) -> int:
        return len(self._requests)

    def __getitem__(self, index: int) -> AsyncInferRequest:
        return self._requests[index]

    def set_callback(self, callback: Callable[[AsyncInferRequest, Any], Any] | None) -> None:
        self._callback = callback

    def is_ready(self) -> bool:
        return bool(self._idle)

    async def get_idle_request_id(self) -> int:
        self._raise_pending()
        while not self._idle:
            self._idle_changed = self._idle_changed or loop_event()
            await self._idle_changed.wait()
            self._raise_pending()
        return self._idle[0]

    async def start_async(
        self, inputs: Inputs | None, userdata: Any, *, share_inputs: bool = False
    ) -> None:
        self._raise_pending()
        while not self._idle:
            self._idle_changed = self._idle_changed or loop_event()
            await self._idle_changed.wait()
            self._raise_pending()
        index = self._idle.popleft()
        self.userdata[index] = userdata
        try:
            self._requests[index].start_async(inputs, userdata, share_inputs=share_inputs)
        except BaseException:
            self._idle.appendleft(index)
            raise

    async def wait_all(self) -> None:
        for request in self._requests:
            # A job's exception was collected by _job_done already.
            with contextlib.suppress(Exception):
                await request.wait()
        self._raise_pending()

    async def close(self) -> None:
        self._closed = True
        # Every job first: a job queued behind another one's compute (fewer streams than
        # requests) would otherwise start only once that compute ended.
        for request in self._requests:
            request.cancel()
        with anyio.CancelScope(shield=True):
            for request in self._requests:
                await request.close()
        if self._idle_changed is not None:
            self._idle_changed.set()

    async def _job_done(self, request: AsyncInferRequest, userdata: Any) -> None:
        if request.error is not None:
            self._errors.append(request.error)
        if self._callback is not None:
            executor = request.compiled_model.callback_executor
            try:
                await invoke_callback(self._callback, request, userdata, executor)
            except Exception as exc:
                self._errors.append(exc)
                raise  # the request keeps it too: its wait() raises it

    def _make_release(self, index: int) -> Callable[[], None]:
        def release() -> None:
            self._idle.append(index)
            if self._idle_changed is not None:
                self._idle_changed.set()
                self._idle_changed = None

        return release


class AsyncInferQueue:
    """A pool of ``jobs`` infer requests of one compiled model.

    ``await queue.start_async(inputs, userdata)`` waits (without blocking the loop) for an
    idle request and starts it; the queue's callback ``fn(request, userdata)`` runs as each
    job completes (``request.results`` holds its outputs, ``request.error`` its exception
    if it failed). An exception from a job or from the callback is re-raised once, by the
    next ``start_async``, ``wait_all`` or ``get_idle_request_id`` — never swallowed; the
    request keeps it too (``await queue[id].wait()`` raises it until its next job).

    ``jobs=0`` uses the compiled model's ``OPTIMAL_NUMBER_OF_INFER_REQUESTS``. Closing
    (``await queue.close()`` or leaving ``async with``) cancels the running jobs;
    ``await queue.wait_all()`` first drains them.

    The jobs run on the device's own queue engine when it has one (the OPENVINO device
    does: see its page), with these semantics; its requests then offer what a queue's
    caller reads (``results``, ``error``, ``userdata``, ``state``, ``get_tensor``,
    ``wait``, ``wait_for``), not ``infer``. Otherwise on a :class:`RequestsQueue`.
    """

    def __init__(self, compiled_model: CompiledModel, jobs: int = 0) -> None:
        if jobs < 0:
            raise ValueError("jobs must be >= 0 (0: the optimal number of requests)")
        count = jobs or int(compiled_model.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        engine = compiled_model.create_queue_engine(count)
        self._engine: QueueEngine = engine or RequestsQueue(compiled_model, count)
        self._requests: list[AsyncInferRequest] = [self._engine[i] for i in range(count)]
        self.userdata: list[Any] = self._engine.userdata
        """The userdata of the job each request ran last."""

    def __len__(self) -> int:
        """The number of requests (``jobs``)."""
        return len(self._requests)

    def __getitem__(self, index: int) -> AsyncInferRequest:
        """The request with id ``index`` (0 to ``len(queue) - 1``): read its ``results``
        there; start jobs through the queue, which keeps track of idle requests."""
        return self._requests[index]

    def __iter__(self) -> Iterator[AsyncInferRequest]:
        """The queue's requests, in id order."""
        return iter(self._requests)

    def set_callback(self, callback: Callable[[AsyncInferRequest, Any], Any] | None) -> None:
        """Call ``callback(request, userdata)`` as each job completes (sync or async)."""
        self._engine.set_callback(callback)

    def is_ready(self) -> bool:
        """True when a request is idle, so ``start_async`` would not wait."""
        return self._engine.is_ready()

    async def get_idle_request_id(self) -> int:
        """The id of an idle request, waiting (without blocking the loop) until one is:
        the request the next ``start_async`` runs on, unless another task starts a job
        first. ``queue[id]`` is the request (``await queue[id].wait_for(0)`` is True).

        Raises:
            RequestClosedError: the queue is closed.
            Exception: the exception of an earlier job or callback, as ``start_async``
                raises it (once), before or after waiting.
        """
        return await self._engine.get_idle_request_id()

    async def start_async(
        self, inputs: Inputs | None = None, userdata: Any = None, *, share_inputs: bool = False
    ) -> None:
        """Wait for an idle request and start ``inputs`` on it.

        The inputs are copied into the request before this returns, so one buffer may be
        refilled for the next job at once; ``share_inputs=True`` skips the copy, and the
        caller must then leave the arrays unchanged until the job completed. A device's
        queue engine may instead take a few jobs more than it has requests, checked and
        copied here, each started by the completion that frees a request (OPENVINO: up to
        4 per request; :meth:`close` drops those not started).

        Raises:
            RequestClosedError: the queue is closed.
            Exception: the exception of an earlier job or callback; the input errors of
                this job.
        """
        await self._engine.start_async(inputs, userdata, share_inputs=share_inputs)

    async def wait_all(self) -> None:
        """Wait until every started job (and its callback) has completed.

        Raises:
            Exception: the exception of a job or callback that failed since the last call.
        """
        await self._engine.wait_all()

    async def close(self) -> None:
        """Cancel the running jobs, wait for their compute to stop, close the requests."""
        await self._engine.close()

    async def __aenter__(self) -> AsyncInferQueue:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
