"""AsyncInferRequest: the generic awaitable request.

It owns the request's state machine (idle -> busy -> idle, closed), runs the device's
(executor, stage) pipeline, calls the user's callback, and turns cancellation of the
awaiting task into a cooperative stop of the compute. A device only declares stages.

A step is atomic: it is either cancelled or completed, never both. Its *commit point* is
the start of the device's last stage (postprocess: it commits the variable state and
publishes the results). A cancel before that point cancels the step; from that point on
the step completes: ``cancel()`` does nothing, and the last stage and the callback run
shielded from the cancellation of the awaiting task, which is delivered afterwards as the
task's own. Without this, a cancel landing during the callback reported a step whose state
had already advanced as cancelled.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any

import anyio

from aioinfer.errors import InferCancelledError, RequestBusyError, RequestClosedError
from aioinfer.plugin.executors import Executor, asyncio_loop, spawn_detached
from aioinfer.plugin.sync_request import STAGES

if TYPE_CHECKING:
    from types import TracebackType

    from aioinfer.model import Inputs, Port
    from aioinfer.plugin.state import VariableState
    from aioinfer.plugin.sync_request import SyncInferRequest
    from aioinfer.results import InferResults

Stage = Callable[[], None]
Callback = Callable[["AsyncInferRequest", Any], Any]


class RequestState(Enum):
    """Where a request is in its life."""

    IDLE = "idle"
    BUSY = "busy"
    CLOSED = "closed"


class AsyncInferRequest:
    """One infer request: ``await request.infer(inputs)``.

    One inference at a time per request (a second one while busy raises
    :class:`RequestBusyError`); use several requests, or an ``AsyncInferQueue``, for
    parallelism. Cancelling the task that awaits :meth:`infer` or :meth:`wait`, or
    calling :meth:`cancel`, stops the compute at the next kernel boundary and leaves the
    request idle and reusable.
    """

    def __init__(
        self,
        request: SyncInferRequest,
        pipeline: Sequence[tuple[Executor, Stage]],
        callback_executor: Executor,
    ) -> None:
        self._request = request
        last = len(pipeline) - 1
        self._steps = [
            # (name, executor, stage, whether it is the commit point: a lone stage is not)
            (name, executor, stage, index == last and last > 0)
            for index, (name, (executor, stage)) in enumerate(zip(_stage_names(pipeline), pipeline))
        ]
        self._callback_executor = callback_executor
        self._state = RequestState.IDLE
        self._started = False
        self._committed = False
        """True once the running inference passed its commit point (see the module)."""
        self._published: InferResults | None = None
        """The results before the running inference (it published when they changed)."""
        self._done: anyio.Event | None = None
        """Set when the running inference settles; made only when someone waits."""
        self._callback: Callback | None = None
        self._callback_userdata: Any = None
        self._userdata: Any = None
        self._on_idle: Callable[[], None] | None = None
        self._callback_error: BaseException | None = None
        self.error: BaseException | None = None
        """How the last inference ended: None on success, else its exception
        (``InferCancelledError`` when it was cancelled). Callbacks read it."""

    # -- ports and tensors ----------------------------------------------------------------

    @property
    def compiled_model(self) -> Any:
        """The compiled model this request belongs to."""
        return self._request.compiled_model

    @property
    def inputs(self) -> list[Port]:
        """The input ports."""
        return self._request.compiled_model.inputs

    @property
    def outputs(self) -> list[Port]:
        """The output ports."""
        return self._request.compiled_model.outputs

    @property
    def state(self) -> RequestState:
        """IDLE, BUSY or CLOSED."""
        return self._state

    @property
    def userdata(self) -> Any:
        """The userdata of the current (or last) inference."""
        return self._userdata

    def set_tensor(self, key: str | int | Port, value: Any, *, share_inputs: bool = False) -> None:
        """Set one input for the next inference (by name, index or Port).

        ``value`` is copied into the request's own buffer for that input, reused while its
        shape and element type stay the same; ``share_inputs=True`` keeps ``value`` itself
        (zero-copy: do not modify it until the inference completed).

        Raises:
            UnknownInputError, InputTypeError, InputShapeError: see the messages.
            RequestBusyError: an inference is running on this request.
        """
        self._check_idle()
        self._request.set_tensor(key, value, share_inputs=share_inputs)

    def set_tensors(self, key: str | int | Port, values: Sequence[Any]) -> None:
        """Set one input from a list of tensors joined along the batch (first) axis."""
        self._check_idle()
        self._request.set_tensors(key, values)

    def clear_inputs(self) -> None:
        """Forget every input set so far: the next inference needs all of them again.

        Raises:
            RequestBusyError: an inference is running on this request.
        """
        self._check_idle()
        self._request.clear_inputs()

    def release_memory(self) -> None:
        """Free the buffers the request keeps between inferences (the CPU device's
        planned activation buffers); the next inference allocates them again. Inputs set
        and the last results stay.

        Raises:
            RequestBusyError: an inference is running on this request.
        """
        if self._state is not RequestState.CLOSED:
            self._check_idle()
        self._request.release_memory()

    def get_tensor(self, key: str | int | Port) -> Any:
        """The input set for ``key`` (the request's copy, or the caller's array when it
        was shared) or the output ``key`` of the last inference."""
        return self._request.get_tensor(key)

    @property
    def results(self) -> InferResults | None:
        """The results of the last completed inference (None before the first)."""
        return self._request.results

    def get_profiling_info(self) -> list[dict[str, Any]]:
        """Per-stage durations of the last inference."""
        return self._request.get_profiling_info()

    @property
    def queued_seconds(self) -> float:
        """Seconds the last inference waited before it computed: for a free thread of the
        device's task executor, in the BATCH device's batch queue, in a PROCESS worker for a
        free stream (0 when it computed at once)."""
        return self._request.queued_seconds

    # -- variable state -------------------------------------------------------------------

    def query_state(self) -> list[VariableState]:
        """The variables of a stateful model (see the ``STATEFUL`` config), each with
        ``name``, ``state`` (read, or assign to replace) and ``reset()``.

        Each request has its own variables; they change only when an inference completes.

        Raises:
            RequestBusyError: an inference is running (also raised by a state's setter
                and ``reset()`` while one runs).
            RequestClosedError: the request is closed.
        """
        self._check_idle()
        return self._request.query_state(self._check_idle)

    def reset_state(self) -> None:
        """Give every variable its initial value again (zeros, sized at the next inference).

        Raises:
            RequestBusyError: an inference is running.
            RequestClosedError: the request is closed.
        """
        self._check_idle()
        self._request.reset_state()

    # -- inference ------------------------------------------------------------------------

    async def infer(
        self, inputs: Inputs | None = None, *, share_inputs: bool = False
    ) -> InferResults:
        """Run one inference and return its results.

        ``inputs`` is a dict from input name (or index, or Port) to array, or a list in
        input order; inputs set before with :meth:`set_tensor` may be left out. They are
        copied into the request's buffers before this returns control to the loop; with
        ``share_inputs=True`` the request reads the caller's arrays instead (zero-copy),
        which must then stay unchanged until the inference completed.

        Cancelling the awaiting task before the commit point (the start of the last
        stage) cancels the inference; afterwards the inference completes and this returns
        its results (the task's cancellation reaches it at its next checkpoint).

        Raises:
            UnknownInputError, InputTypeError, InputShapeError, MissingInputError: bad
                input (nothing runs; the request stays usable).
            RequestBusyError: this request is already running an inference.
            InferenceError: a kernel failed (the message names the node).
            InferCancelledError: :meth:`cancel` was called meanwhile.
        """
        self._begin(inputs, None, share_inputs)
        await self._run(awaited=True)
        return self._finish()

    def start_async(
        self, inputs: Inputs | None = None, userdata: Any = None, *, share_inputs: bool = False
    ) -> None:
        """Start one inference and return at once; ``await wait()`` for it.

        ``userdata`` goes to the callback of this inference (instead of the one given
        to :meth:`set_callback`). Must be called from a running event loop.

        The inputs are copied before this returns, so the caller may reuse its arrays at
        once (one frame buffer for every frame). ``share_inputs=True`` skips the copy: the
        caller must then leave the arrays unchanged until the inference completed.

        Raises:
            RequestBusyError, RequestClosedError, and the input errors of :meth:`infer`.
        """
        self._begin(inputs, userdata, share_inputs)
        spawn_detached(self._run_detached)

    async def wait(self) -> InferResults | None:
        """Wait for the inference started with :meth:`start_async` (and its callback).

        Returns its results (None when nothing was started). Cancelling the waiting task
        before the inference's commit point cancels the inference; afterwards the
        inference completes (``error`` None, the callback told of success) and the
        task's cancellation is raised once it has.

        Raises:
            Exception: the inference's or the callback's exception.
        """
        if not self._started:
            return self._request.results
        if self._state is RequestState.BUSY:
            done = self._settled()
            try:
                await done.wait()
            except anyio.get_cancelled_exc_class():
                self.cancel()
                with anyio.CancelScope(shield=True):
                    await done.wait()
                raise
        return self._finish()

    async def wait_for(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds; True when the inference has completed.

        A timeout does not cancel the inference.

        Raises:
            Exception: the inference's or the callback's exception, when it completed
                with one.
        """
        if not self._started:
            return True
        if self._state is RequestState.BUSY:
            with anyio.move_on_after(timeout):
                await self._settled().wait()
            if self._state is RequestState.BUSY:
                return False
        self._finish()
        return True

    def cancel(self) -> None:
        """Stop the running inference at the next kernel boundary.

        Its awaiter gets :class:`InferCancelledError`; cancelling the awaiting task
        instead gives the framework's own cancellation exception. A no-op when idle, and
        once the inference passed its commit point (its last stage started): it then
        completes.
        """
        if self._state is RequestState.BUSY and not self._committed:
            self._request.cancel()

    def set_callback(self, callback: Callback | None, userdata: Any = None) -> None:
        """Call ``callback(request, userdata)`` after each inference completes.

        A coroutine function is awaited on the event loop; a plain function runs on the
        compiled model's callback executor (a thread). It also runs when the inference
        failed or was cancelled: ``request.error`` then holds the exception (None on
        success). It runs once per inference, to its end: cancelling the awaiting task
        does not interrupt it. ``wait()``/``infer()`` return only after the callback
        finished, and re-raise its exception. ``None`` removes the callback.
        """
        self._callback = callback
        self._callback_userdata = userdata

    def set_idle_callback(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback()`` each time an inference started on this request settles,
        once the request is idle again and after the callback of :meth:`set_callback`
        returned: for the owner of a pool of requests (``AsyncInferQueue``) to take the
        request back. It runs on the event loop, synchronously, and must not raise (the
        inference is over: nobody would be told). ``None`` removes it."""
        self._on_idle = callback

    # -- lifetime -------------------------------------------------------------------------

    async def close(self) -> None:
        """Cancel a running inference, wait until its compute let go, and close.

        Using the request afterwards raises :class:`RequestClosedError`.
        """
        if self._state is RequestState.CLOSED:
            return
        if self._state is RequestState.BUSY:
            self.cancel()
            with anyio.CancelScope(shield=True):
                await self._settled().wait()
        self._state = RequestState.CLOSED

    async def __aenter__(self) -> AsyncInferRequest:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def infer_sync(
        self, inputs: Inputs | None = None, *, share_inputs: bool = False
    ) -> InferResults:
        """Run one inference in the calling thread, through the same stages.

        For scripts, tests and the ONNX backend API; never call it on an event loop.
        No callback runs. ``share_inputs`` as for :meth:`infer`. Raises the errors of
        :meth:`infer`.
        """
        self._check_idle()
        self._state = RequestState.BUSY
        self._committed = False  # the sync path has no commit point before its end
        try:
            return self._request.infer(inputs, share_inputs=share_inputs)
        finally:
            self._state = RequestState.IDLE

    # -- the state machine ----------------------------------------------------------------

    def _check_idle(self) -> None:
        if self._state is RequestState.CLOSED:
            raise RequestClosedError("this infer request is closed")
        if self._state is RequestState.BUSY:
            raise RequestBusyError(
                "this infer request is already running an inference; await it (wait()) or "
                "use another request (create_infer_request() or an AsyncInferQueue)"
            )

    def _begin(self, inputs: Inputs | None, userdata: Any, share_inputs: bool) -> None:
        self._check_idle()
        self._request.set_inputs(inputs, share_inputs=share_inputs)
        self._state = RequestState.BUSY
        self._committed = False
        self._request.cancel_token.requested = False
        self._request.queued_seconds = 0.0
        self._userdata = self._callback_userdata if userdata is None else userdata
        self.error = None
        self._callback_error = None
        self._started = True
        self._done = None
        self._published = self._request.results

    async def _run(self, awaited: bool) -> None:
        """Stages, then the callback, then back to idle; exceptions end in ``self.error``.

        ``awaited``: a task of the caller awaits this run, and may be cancelled.
        """
        request = self._request
        token = request.cancel_token
        durations = request.stage_durations
        try:
            try:
                # The stages, in this coroutine: one of its own per inference cost as
                # much as the cancel check of an inline run (profiled).
                start = time.perf_counter()
                for name, executor, stage, committing in self._steps:
                    if token.requested:
                        raise InferCancelledError("the inference was cancelled")
                    try:
                        # The commit point: the last stage commits the state and
                        # publishes the results, so from there on the step completes.
                        self._committed = committing
                        if executor.inline:
                            # Called here: awaiting the executor would cost a coroutine
                            # per stage (profiled) for a plain call.
                            stage()
                        elif not committing:
                            _, waited = await executor.run_timed(stage, request.cancel)
                            request.queued_seconds += waited
                        else:
                            with _shielded():
                                _, waited = await executor.run_timed(stage)
                            request.queued_seconds += waited
                    finally:
                        # One clock read per stage: a stage ends when the next starts.
                        end = time.perf_counter()
                        durations[name] = end - start
                        start = end
            except anyio.get_cancelled_exc_class():
                # asyncio's own cancellation (task.cancel(), asyncio.timeout) goes through
                # shields: it may come after the last stage published. Then it completed.
                if request.results is self._published:
                    self.error = InferCancelledError("the inference was cancelled")
                raise
            except Exception as exc:
                self.error = exc
            finally:
                # Told how the step ended, and run to its end whatever happens meanwhile
                # (no task of the caller awaits a detached run: a shield is enough there).
                if self._callback is not None and awaited:
                    await _to_the_end(self._call_back)
                elif self._callback is not None:
                    with _detached_shield():
                        await self._call_back()
        finally:
            self._settle()

    async def _run_detached(self) -> None:
        try:
            await self._run(awaited=False)
        except BaseException:  # recorded in self.error; wait() re-raises it
            return

    async def _call_back(self) -> None:
        callback = self._callback
        if callback is None:
            return
        try:
            await invoke_callback(callback, self, self._userdata, self._callback_executor)
        except Exception as exc:
            self._callback_error = exc

    def _settle(self) -> None:
        self._published = None  # keeps no results alive
        self._state = RequestState.IDLE
        if self._done is not None:
            self._done.set()
        if self._on_idle is not None:
            self._on_idle()

    def _settled(self) -> anyio.Event:
        """The event the running inference sets when it settles (made on first use: an
        awaited ``infer()`` needs none)."""
        if self._done is None:
            self._done = anyio.Event()
        return self._done

    def _finish(self) -> InferResults:
        if self.error is not None:
            raise self.error
        if self._callback_error is not None:
            raise self._callback_error
        results = self._request.results
        assert results is not None
        return results


def _shielded() -> anyio.CancelScope:
    return anyio.CancelScope(shield=True)


def _detached_shield() -> contextlib.AbstractContextManager[Any]:
    """What keeps a detached run's callback running to its end: under asyncio, nothing is
    needed (the task of ``spawn_detached`` is outside every cancel scope, and a shield
    would not stop asyncio's own ``task.cancel()`` anyway) and a cancel scope costs as
    much as a tenth of the loop's work per inference on a small model; under trio, a
    shield (the system task is cancelled when the run ends)."""
    return contextlib.nullcontext() if asyncio_loop() is not None else _shielded()


async def _to_the_end(call: Callable[[], Awaitable[None]]) -> None:
    """Await ``call()`` (which must not raise) to its end even when the awaiting task is
    cancelled meanwhile, then re-raise that cancellation.

    A shielded cancel scope stops anyio's and trio's cancellation, but not asyncio's own
    (``task.cancel()``, ``asyncio.timeout``), which would interrupt ``call()``; so it runs
    as a task of its own, which that cancellation does not reach.
    """
    done = anyio.Event()

    async def run() -> None:
        try:
            await call()
        finally:
            done.set()

    spawn_detached(run)
    cancelled: BaseException | None = None
    while not done.is_set():
        try:
            with anyio.CancelScope(shield=True):
                await done.wait()
        except anyio.get_cancelled_exc_class() as exc:
            cancelled = exc
    if cancelled is not None:
        raise cancelled


async def invoke_callback(
    callback: Callback, request: AsyncInferRequest, userdata: Any, executor: Executor
) -> None:
    """Await ``callback(request, userdata)`` on the loop when it is a coroutine function;
    otherwise run it on ``executor`` (a thread), so it cannot stall the loop."""
    if inspect.iscoroutinefunction(callback):
        await callback(request, userdata)
    else:
        await executor.run(lambda: callback(request, userdata))


def _stage_names(pipeline: Sequence[tuple[Executor, Stage]]) -> list[str]:
    if len(pipeline) == len(STAGES):
        return list(STAGES)
    return [getattr(stage, "__name__", f"stage{i}") for i, (_, stage) in enumerate(pipeline)]
