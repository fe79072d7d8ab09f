"""The OPENVINO device's engine behind ``AsyncInferQueue``: jobs ended and the next one
started in OpenVINO's completion callback, the event loop told in batches.

The generic queue runs each job as an awaited request (a task, its stages, a waiter
thread that wakes the loop, the loop that refills the request). With as many requests as
OpenVINO has streams, a stream then stays idle from the end of one job until the loop
has started the next: on the small models that left the generic queue at about half of
OpenVINO's own ``AsyncInferQueue`` (the figures: docs/benchmarks.md, "The OPENVINO
queue engine").

Here OpenVINO calls :meth:`OpenVINOQueue.completed` on the stream thread that ran the job
(its request's callback): it copies the outputs and starts the first queued job at once
on the request that just became free. Jobs are queued by
:meth:`~OpenVINOQueue.start_async` while every request is busy (checked and copied on
the loop, up to :data:`QUEUED_PER_REQUEST` per request), so that a request that frees
finds its next job waiting even when both requests end together (with a single waiting
job the loop would start about a third of the jobs itself, each after a loop turn with a
request idle). Then it tells the loop (see :mod:`.wake`): once the queue has room for
half its jobs again, or at once when something waits for this end (a callback, an error,
a request gone idle); the loop publishes the results, the errors and the started jobs of
the whole batch in order. Callbacks run on the loop's side as in the generic queue (a
coroutine function on the loop, a plain one on the callback executor), and a request
with a callback becomes free only once its callback returned (then the loop starts its
next job): no user code runs on OpenVINO's threads.

Two things make the callback pay:

- OpenVINO's binding makes a Python thread state for each call on a thread Python does
  not know and frees it afterwards. :func:`keep_thread_state` keeps the first one of
  each stream thread, which saves about a sixth of the CPU a tiny model's job costs.
- OpenVINO calls no Python callback for a job that failed or was cancelled (its binding
  re-raises the engine's exception instead; OpenVINO 2026.4). One thread of the queue
  looks for such jobs every :data:`FAILURE_CHECK_SECONDS` while jobs run
  (``wait_for(0)`` raises for them) and ends them as a callback would, with their error.

Stateful models keep the generic queue (their steps commit state on the loop).
"""

from __future__ import annotations

import ctypes
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import numpy as np

from aioinfer.errors import InferCancelledError
from aioinfer.plugin.async_request import RequestState, invoke_callback
from aioinfer.plugin.executors import LoopEvent, loop_event, spawn_detached
from aioinfer.plugin.queue_engine import QueueErrors
from aioinfer.plugin.sync_request import RequestSource, SyncInferRequest

from .bridge import EXIT_JOIN_SECONDS, let_go, stop_at_exit
from .wake import LoopWake, loop_wake

if TYPE_CHECKING:
    from aioinfer.model import Inputs, Port
    from aioinfer.plugin.executors import Executor
    from aioinfer.results import InferResults

Callback = Callable[[Any, Any], Any]


class JobRequest(Protocol):
    """What the queue runs jobs on: a request of the device
    (:class:`~.request.OpenVINOInferRequest`), its OpenVINO request and its job steps."""

    @property
    def ov_request(self) -> Any:
        """OpenVINO's ``InferRequest``."""

    @property
    def compiled_model(self) -> RequestSource:
        """The compiled model that made the request."""

    @property
    def results(self) -> InferResults | None:
        """The results last published."""

    def prepare_job(self, inputs: Inputs | None, *, share_inputs: bool) -> None:
        """Check and set a job's inputs."""

    def launch_job(self) -> None:
        """Start the prepared job in OpenVINO."""

    def finish_job(self, succeeded: bool) -> list[np.ndarray]:
        """The ended job's outputs (raises its failure)."""

    def cancel(self) -> None:
        """Cancel the running job."""

    def set_results(self, arrays: Sequence[np.ndarray]) -> None:
        """Publish a job's outputs."""

    def get_tensor(self, key: str | int | Port) -> np.ndarray:
        """An input or an output of the last job."""

    def get_profiling_info(self) -> list[dict[str, Any]]:
        """The last job's stage durations."""


class JobModel(RequestSource, Protocol):
    """What the queue asks of the compiled model it runs
    (:class:`~.compiled_model.OpenVINOCompiledModel`, which makes the queue)."""

    @property
    def callback_executor(self) -> Executor:
        """Where plain callbacks run."""

    def create_sync_infer_request(self) -> JobRequest:
        """A request to run jobs on."""


QUEUED_PER_REQUEST = 4
"""How many jobs per request :meth:`OpenVINOQueue.start_async` may queue while every
request is busy."""

FAILURE_CHECK_SECONDS = 0.005
"""How often the queue looks for jobs that failed (see the module) while jobs run."""


class _Job:
    """One job: its inputs until it starts, then how it ended."""

    __slots__ = ("error", "inputs", "outputs", "refused", "share_inputs", "userdata")

    def __init__(self, inputs: Inputs | None, userdata: Any, share_inputs: bool) -> None:
        self.inputs = inputs
        self.userdata = userdata
        self.share_inputs = share_inputs
        self.refused: BaseException | None = None
        """Why the job was not started: its inputs."""
        self.error: BaseException | None = None
        """How the job ended: None on success, else its exception."""
        self.outputs: list[np.ndarray] | None = None


class QueueRequest:
    """A request of the OPENVINO queue, as ``queue[id]`` and the callback see it: the
    last job's ``results``, ``error`` and ``userdata``, its ``state``, its tensors and
    profiling; ``wait()`` and ``wait_for()`` as on any request. Jobs are started through
    the queue only."""

    def __init__(self, request: JobRequest, owner: OpenVINOQueue) -> None:
        self._request = request
        self._owner = owner
        self._index = len(owner)
        self._outputs: list[np.ndarray] | None = None
        """The last job's outputs, until :attr:`results` is first read after it."""
        self.userdata: Any = None
        """The userdata of the last job."""
        self.error: BaseException | None = None
        """How the last job ended: None on success, else its exception."""
        self.callback_error: BaseException | None = None
        """The exception the queue's callback raised for the last job, if it did."""

    @property
    def compiled_model(self) -> Any:
        """The compiled model the queue runs."""
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
        """BUSY while a job (or its callback) runs on this request, IDLE, or CLOSED."""
        return self._owner.request_state(self._index)

    @property
    def results(self) -> InferResults | None:
        """The results of the last job that completed (None before the first)."""
        if self._outputs is not None:
            # Made when read: most jobs' results are read by nobody.
            self._request.set_results(self._outputs)
            self._outputs = None
        return self._request.results

    async def wait(self) -> InferResults | None:
        """Wait until the running job (and its callback) ended; its results (None before
        the first job).

        Raises:
            Exception: the last job's exception, else its callback's, until the next job.
        """
        while self.state is RequestState.BUSY:
            await self._owner.wait_for_change()
        if self.error is not None:
            raise self.error
        if self.callback_error is not None:
            raise self.callback_error
        return self.results

    async def wait_for(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds; True when the request is not running a job
        (a timeout cancels nothing).

        Raises:
            Exception: as :meth:`wait`, when the job ended.
        """
        with anyio.move_on_after(timeout):
            await self.wait()
        return self.state is not RequestState.BUSY

    def get_tensor(self, key: str | int | Port) -> np.ndarray:
        """An input of the running or last job, or an output of the last completed one."""
        self.results  # noqa: B018  (makes the last results)
        return self._request.get_tensor(key)

    def get_profiling_info(self) -> list[dict[str, Any]]:
        """Per-stage durations (and node timings with ``PERF_COUNT``) of the last job."""
        return self._request.get_profiling_info()

    def publish(self, job: _Job) -> None:
        """Show ``job``'s end (on the loop, in the order the jobs ended)."""
        self.userdata = job.userdata
        self.error = job.error
        self.callback_error = None
        if job.outputs is not None:
            self._outputs = job.outputs


_THREAD = threading.local()


def keep_thread_state() -> None:
    """Keep the Python thread state of the OpenVINO thread this runs on (see the
    module): one more ``PyGILState_Ensure`` than releases, once per thread, so that the
    binding's next calls find it instead of making and freeing one each."""
    if not getattr(_THREAD, "kept", False):
        pythonapi = getattr(ctypes, "pythonapi", None)  # CPython's, as OpenVINO's wheels
        if pythonapi is not None:
            pythonapi.PyGILState_Ensure()
        _THREAD.kept = True


def _on_completion(owner: weakref.ref[OpenVINOQueue], index: int) -> Callable[[Any], None]:
    """Request ``index``'s OpenVINO callback; it holds the queue weakly, so that an
    unclosed queue is collected."""

    def completed(_: Any) -> None:
        keep_thread_state()
        engine = owner()
        if engine is not None:
            engine.completed(index)

    return completed


_RUNNING: set[OpenVINOQueue] = set()
"""The queues with jobs in OpenVINO: kept alive until the failure watch saw them end.
A queue collected meanwhile would free OpenVINO's requests while a callback of theirs
waits for the GIL the freeing thread holds, and OpenVINO's request waits for its job."""


class _FailureWatch:
    """The thread that finds the jobs that failed (see the module): it sleeps while no
    job runs, and holds the queue only while it looks."""

    def __init__(self, owner: weakref.ref[OpenVINOQueue]) -> None:
        self.running = threading.Event()
        """Set while jobs may run (by a job's launch; cleared when none runs)."""
        self.stopped = False
        self.thread = threading.Thread(
            target=self._look, args=(owner,), name="aioinfer-openvino-queue", daemon=True
        )
        self.thread.start()

    def _look(self, owner: weakref.ref[OpenVINOQueue]) -> None:
        while True:
            self.running.wait()
            time.sleep(FAILURE_CHECK_SECONDS)
            engine = owner()
            if engine is None or self.stopped:
                return
            engine.find_failures()
            del engine

    def stop(self) -> None:
        """Let the thread end."""
        self.stopped = True
        self.running.set()


class OpenVINOQueue(QueueErrors):
    """The engine of an ``AsyncInferQueue`` on the OPENVINO device (see the module).

    Its methods are those of ``AsyncInferQueue``, with the same semantics, except that
    ``start_async`` returns once its job started or was queued (see :meth:`start_async`):
    a queued job is started by whoever frees a request first (OpenVINO's thread that
    ended the request's last job, or the loop after a callback), in the order the jobs
    came. No job stays queued while a request is idle: a request becomes idle (under the
    lock) only when no job is queued.
    """

    def __init__(self, compiled_model: JobModel, jobs: int) -> None:
        self._requests: list[QueueRequest] = []
        self._syncs: list[JobRequest] = []
        for _ in range(jobs):
            sync = compiled_model.create_sync_infer_request()
            self._syncs.append(sync)
            self._requests.append(QueueRequest(sync, self))
        self.userdata: list[Any] = [None] * jobs
        """The userdata of the job each request ran last."""
        self._executor = compiled_model.callback_executor
        self._room = QUEUED_PER_REQUEST * jobs
        """How many jobs may be queued (see :meth:`start_async`)."""
        self._checker = _Checker(compiled_model)
        """Checks the inputs of the jobs queued while every request is busy."""
        self._lock = threading.Lock()
        """Guards the fields the request threads share with the loop (below)."""
        self._idle: deque[int] = deque(range(jobs))
        self._waiting: deque[_Job] = deque()
        """Jobs queued while every request was busy (at most ``_room``), first
        come first started by the request that frees first (see :meth:`start_async`).
        Never holds a job while a request is idle: whoever idles a request (under the
        lock) takes the first queued job instead, so none is stranded."""
        self._ended: deque[tuple[int, _Job, _Job | None]] = deque()
        """(request, its job that ended, the waiting job started on it) for the loop."""
        self._scheduled = False
        self._running: list[_Job | None] = [None] * jobs
        """Each request's job, from its start until the loop has seen its end."""
        self._current: list[_Job | None] = [None] * jobs
        """Each request's job as OpenVINO's side sees it: set (under the lock) before it
        is launched, taken by whoever ends it (its callback, or the failure watch)."""
        self._callback: Callback | None = None
        self._held = [False] * jobs
        """Requests kept busy until their job's callback returned (on the loop)."""
        self._errors: list[BaseException] = []
        self._closed = False
        self._wake: LoopWake | None = None
        """Schedules :meth:`_on_loop` on the event loop (any thread)."""
        self._changed: LoopEvent | None = None
        """Set when a request became idle or the queue closed (for waiting callers)."""
        self._callbacks_running = 0
        owner = weakref.ref(self)
        for index, sync in enumerate(self._syncs):
            sync.ov_request.set_callback(_on_completion(owner, index), None)
        self._watch = _FailureWatch(owner)
        self._stop_watch = weakref.finalize(self, self._watch.stop)
        stop_at_exit(self)

    def __len__(self) -> int:
        return len(self._requests)

    def stop_at_exit(self) -> None:
        """Cancel the running jobs and wait until OpenVINO let go of them, so that no
        callback comes once the interpreter finalizes; end the failure watch (at
        interpreter exit: see :func:`.bridge.stop_threads_at_exit`)."""
        with self._lock:
            self._closed = True  # no job is launched any more
        for sync in self._syncs:
            sync.cancel()
        for sync in self._syncs:
            try:
                sync.ov_request.wait()  # returns once the job's callback returned
            except RuntimeError:
                let_go(sync.ov_request)
        self._stop_watch()
        self._watch.thread.join(EXIT_JOIN_SECONDS)

    def __getitem__(self, index: int) -> QueueRequest:
        return self._requests[index]

    def request_state(self, index: int) -> RequestState:
        """The state of request ``index`` (see :attr:`QueueRequest.state`)."""
        if self._closed:
            return RequestState.CLOSED
        busy = self._running[index] is not None or self._held[index]
        return RequestState.BUSY if busy else RequestState.IDLE

    def set_callback(self, callback: Callback | None) -> None:
        """As ``AsyncInferQueue.set_callback``."""
        with self._lock:  # the request threads read it when a job ends
            self._callback = callback

    def is_ready(self) -> bool:
        """As ``AsyncInferQueue.is_ready``."""
        return bool(self._idle) and not self._waiting

    async def get_idle_request_id(self) -> int:
        """As ``AsyncInferQueue.get_idle_request_id``: a request idle on OpenVINO's side
        is named once the loop has published its last job's end (its results, its
        error, its callback)."""
        self._raise_pending()
        while True:
            with self._lock:
                index = self._idle[0] if self._idle else -1
            if index >= 0 and self.request_state(index) is RequestState.IDLE:
                return index
            await self.wait_for_change()
            self._raise_pending()

    async def start_async(
        self, inputs: Inputs | None, userdata: Any, *, share_inputs: bool = False
    ) -> None:
        """As ``AsyncInferQueue.start_async``, except that it returns once its job
        started or, while every request is busy, once it is checked and queued (up to
        :data:`QUEUED_PER_REQUEST` jobs per request; beyond that it waits for room): the
        request that frees first starts it on OpenVINO's thread, in the order the jobs
        came. A job whose ``start_async`` is cancelled while it waits is not started."""
        self._raise_pending()
        self._check_open()
        if self._wake is None:
            self._wake = _waker(weakref.ref(self))
        job = _Job(inputs, userdata, share_inputs)
        while True:
            with self._lock:
                if self._idle and not self._waiting:
                    index = self._idle.popleft()
                    break
                if len(self._waiting) < self._room:
                    index = -1
                    break
            await self.wait_for_change()
            self._check_open()
        if index >= 0:
            if not self._prepare(index, job):
                with self._lock:
                    self._idle.appendleft(index)
                assert job.refused is not None
                raise job.refused
            self._run(index, job)
            return
        # Checked here, so that bad inputs raise from this call; copied unless shared,
        # so that the caller may refill its arrays at once.
        checked = self._checker.validated(inputs or {}, share_inputs=share_inputs)
        job.inputs = {i: value for i, value in enumerate(checked) if value is not None}
        job.share_inputs = True  # the job's own arrays (or the caller's, shared)
        with self._lock:
            index = self._idle.popleft() if self._idle and not self._waiting else -1
            if index < 0:
                self._waiting.append(job)
        if index >= 0:  # a request became idle while the inputs were checked
            if not self._prepare(index, job):  # checked already: cannot happen
                with self._lock:
                    self._idle.appendleft(index)
                assert job.refused is not None
                raise job.refused
            self._run(index, job)

    async def wait_all(self) -> None:
        """As ``AsyncInferQueue.wait_all``."""
        while self._busy():
            await self.wait_for_change()
        self._raise_pending()

    async def close(self) -> None:
        """As ``AsyncInferQueue.close``: cancel the running jobs, wait until OpenVINO let
        go of them, refuse the waiting ones."""
        if self._closed:
            return
        with self._lock:
            self._closed = True  # no request thread starts a job any more
            self._waiting.clear()  # queued jobs are dropped, as cancelled ones
        for sync, idle in zip(self._syncs, self._idle_now()):
            if not idle:
                sync.cancel()
        with anyio.CancelScope(shield=True):
            while self._busy():  # the cancelled jobs end through the failure watch
                await self.wait_for_change()
        _RUNNING.discard(self)  # every job ended
        self._stop_watch()
        if self._wake is not None:
            self._wake.detach()
        self._notify()

    # -- OpenVINO's threads ----------------------------------------------------------------

    def _prepare(self, index: int, job: _Job) -> bool:
        """Set ``job``'s inputs on idle request ``index`` (any thread); False when they
        were refused (``job.refused``)."""
        try:
            self._syncs[index].prepare_job(job.inputs, share_inputs=job.share_inputs)
        except Exception as exc:
            job.refused = exc
            return False
        finally:
            job.inputs = None  # keeps no caller's array alive
        return True

    def _launch(self, index: int, job: _Job) -> bool:
        """Start OpenVINO on the job prepared on request ``index`` (any thread); False
        when it could not (``job.error``: cancelled by :meth:`close`, or OpenVINO refused
        it): the job then ended at once."""
        with self._lock:
            closed = self._closed  # its prepare may have undone the cancel of close()
            if not closed:
                self._current[index] = job
                if not self._watch.running.is_set():
                    _RUNNING.add(self)
                    self._watch.running.set()
        try:
            if closed:
                raise InferCancelledError("the inference was cancelled")
            self._syncs[index].launch_job()
        except Exception as exc:
            with self._lock:
                if self._current[index] is job:
                    self._current[index] = None
            job.error = exc
            return False
        return True

    def completed(self, index: int) -> None:
        """On OpenVINO's thread, in request ``index``'s callback (its job succeeded):
        copy the outputs, end the job. Never raises (OpenVINO would count the job as
        failed)."""
        with self._lock:
            job, self._current[index] = self._current[index], None
        if job is None:
            return  # not launched by this queue (cannot happen)
        try:
            job.outputs = self._syncs[index].finish_job(True)
        except Exception as exc:
            job.error = exc
        self._end(index, job)

    def find_failures(self) -> None:
        """On the failure watch's thread: end each job that failed or was cancelled (no
        callback comes for it) with its error; stop looking while no job runs."""
        with self._lock:
            current = list(self._current)
            if not any(job is not None for job in current):
                self._watch.running.clear()  # a launch sets both again
                _RUNNING.discard(self)
                return
        for index, job in enumerate(current):
            if job is None:
                continue
            sync = self._syncs[index]
            try:
                sync.ov_request.wait_for(0)
                continue  # running, or ended well (then its callback took it)
            except RuntimeError:
                pass
            with self._lock:
                if self._current[index] is not job:
                    continue  # ended meanwhile: the failure was the next job's
                self._current[index] = None
            let_go(sync.ov_request)  # a cancelled request's wait() raises before it ended
            try:
                job.outputs = sync.finish_job(False)  # raises the failure
            except Exception as exc:
                job.error = exc
            self._end(index, job)

    def _end(self, index: int, job: _Job) -> None:
        """Hand ``job``'s end to the loop and start a waiting job on the request (unless
        a callback must run first)."""
        started: _Job | None = None
        with self._lock:
            held = self._callback is not None
            self._held[index] = held
            if not held:
                started = self._next_waiting(index)
        urgent = held or job.error is not None
        while started is not None and not self._prepare(index, started):
            # Its inputs were refused: it ends now, and the next waiting job gets a turn.
            urgent = True
            with self._lock:
                self._ended.append((index, _NOTHING, started))
                started = self._next_waiting(index)
        with self._lock:
            # Before the launch: the started job may end (on another thread) before
            # the launch returns, and the loop must see it start first.
            self._ended.append((index, job, started))
            # The loop is told once the queue has room for half its jobs again, or at
            # once when someone may wait for this end: a callback, an error, an idle
            # request (the last job ended, or a waiter of get_idle_request_id).
            schedule = not self._scheduled and (
                urgent or started is None or len(self._waiting) <= self._room // 2
            )
            if schedule:
                self._scheduled = True
        # Launched before the loop is woken: waking it releases the GIL (a write to its
        # socket), and the loop, once awake, would keep it from this thread for its
        # whole turn while the stream waits for the next job.
        launched = started is None or self._launch(index, started)
        if schedule:
            assert self._wake is not None  # set by the start_async that started the job
            self._wake()
        if not launched:
            assert started is not None
            self._end(index, started)  # it ended at once

    def _next_waiting(self, index: int) -> _Job | None:
        """Under the lock: the waiting job to start on request ``index``, or None after
        marking it idle."""
        if self._waiting and not self._closed:
            return self._waiting.popleft()
        self._idle.append(index)
        return None

    # -- the loop -------------------------------------------------------------------------

    def _on_loop(self) -> None:
        """Publish the jobs that ended, in order; wake their waiting callers."""
        with self._lock:
            ended, self._ended = self._ended, deque()
            self._scheduled = False
        held: list[tuple[int, _Job]] = []
        for index, job, started in ended:
            if job is not _NOTHING:
                self._running[index] = None
                if self._held[index]:
                    held.append((index, job))
                else:
                    self._publish(index, job)
            if started is not None:
                if started.refused is None:
                    self._running[index] = started
                    self.userdata[index] = started.userdata
                else:
                    self._errors.append(started.refused)
        if held:
            self._callbacks_running += 1
            spawn_detached(lambda: self._call_back(held))
        self._notify()

    def _publish(self, index: int, job: _Job) -> None:
        self._requests[index].publish(job)
        self.userdata[index] = job.userdata
        if job.error is not None:
            self._errors.append(job.error)

    async def _call_back(self, ended: list[tuple[int, _Job]]) -> None:
        """Run the callback of each job in ``ended`` in turn, then free its request."""
        try:
            with anyio.CancelScope(shield=True):
                for index, job in ended:
                    self._publish(index, job)
                    callback = self._callback
                    if callback is not None:
                        request = self._requests[index]
                        try:
                            await invoke_callback(callback, request, job.userdata, self._executor)  # type: ignore[arg-type]
                        except Exception as exc:
                            request.callback_error = exc
                            self._errors.append(exc)
                    self._free(index)
        finally:
            self._callbacks_running -= 1
            self._notify()

    def _free(self, index: int) -> None:
        """Request ``index``'s callback returned: start a waiting job on it, or idle it."""
        with self._lock:
            self._held[index] = False
            started = self._next_waiting(index)
        while started is not None and not self._prepare(index, started):
            assert started.refused is not None  # checked already: cannot happen
            self._errors.append(started.refused)
            with self._lock:
                started = self._next_waiting(index)
        if started is not None:
            self._run(index, started)

    def _run(self, index: int, job: _Job) -> None:
        """On the loop: launch ``job``, prepared on request ``index``."""
        self._running[index] = job
        self.userdata[index] = job.userdata
        if not self._launch(index, job):
            self._end(index, job)

    def _idle_now(self) -> list[bool]:
        with self._lock:
            idle = set(self._idle)
        return [index in idle for index in range(len(self))]

    def _busy(self) -> bool:
        return (
            any(job is not None for job in self._running)
            or any(self._held)
            or self._callbacks_running > 0
            or bool(self._waiting)
        )

    async def wait_for_change(self) -> None:
        """Wait until a job ended, a request became idle or the queue closed."""
        if self._changed is None:
            self._changed = loop_event()
        await self._changed.wait()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None


class _Checker(SyncInferRequest):
    """Checks inputs as an inference would (:meth:`validated`); it never runs."""

    def start_pipeline(self) -> None:
        raise NotImplementedError("the queue's input checker runs nothing")

    def infer_postprocess(self) -> None:
        raise NotImplementedError("the queue's input checker runs nothing")


_NOTHING = _Job(None, None, False)
"""Stands for "no job ended" in a hand-off that only reports a refused waiting job."""


def _waker(owner: weakref.ref[OpenVINOQueue]) -> LoopWake:
    """Schedules the queue's ``_on_loop`` on the running event loop from any thread (see
    :mod:`.wake`). What the loop keeps of a call (trio keeps the last one, asyncio its
    reader) does not keep the queue."""

    def call() -> None:
        engine = owner()
        if engine is not None:
            engine._on_loop()

    return loop_wake(call)
