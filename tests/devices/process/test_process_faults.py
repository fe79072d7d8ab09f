"""The PROCESS device heals itself: real worker processes, real signals.

A worker killed (SIGKILL) between inferences is replaced, and the next inference works;
killed during one, that inference fails with ``WorkerDiedError`` (retryable) and the
next works; stopped (SIGSTOP) past ``WORKER_TIMEOUT_S``, it is killed and replaced, the
inference it held fails with ``WorkerTimeoutError``, and the event loop kept its pace
meanwhile: a ticker's worst lateness is compared with the same ticker's on the idle loop
of the same test, with a margin of a quarter of the timeout (a loop blocked by the
worker would lose the whole timeout). Results are compared with onnx.reference within
``rtol=1e-4, atol=1e-5``. Each test compiles its own model (its worker gets killed).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import numpy as np
import onnx
import pytest

import aioinfer as ai
from aioinfer.devices.batch import BatchCompiledModel
from aioinfer.devices.process import ProcessCompiledModel
from tests.helpers import all_threads_stopped, chain_model, process_alive, reference_outputs

pytestmark = pytest.mark.anyio

WIDTH = 64
LONG = chain_model(600, WIDTH, seed=3)
"""600 (MatMul, Tanh) steps: 2048 rows take about a second of CPU time."""
SHORT = chain_model(20, WIDTH, seed=4)
TIMEOUT = 2.0
"""WORKER_TIMEOUT_S of the tests that stop a worker."""
COMPUTING = 3
"""Clock ticks of CPU time (30 ms at 100 Hz) an idle worker takes only once it computes:
the tests kill it then, in the middle of an inference (which takes hundreds)."""
HANG_BOUND = 60.0
"""Seconds after which a wait counts as a hang (never reached when things work)."""


def feeds(rows: int, seed: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((rows, WIDTH)).astype(np.float32)}


def check(model: onnx.ModelProto, inputs: dict[str, np.ndarray], results: ai.InferResults) -> None:
    (expected,) = reference_outputs(model, inputs)
    np.testing.assert_allclose(results["y"], expected, rtol=1e-4, atol=1e-5)


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    with anyio.move_on_after(HANG_BOUND):
        while not condition():
            await anyio.sleep(0.01)
        return
    raise AssertionError(f"waited {HANG_BOUND:g} s for {what}")


def cpu_ticks(pid: int) -> int:
    """The CPU time process ``pid`` has used, in clock ticks (user and system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])


async def stop_process(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until all its threads have stopped."""
    os.kill(pid, signal.SIGSTOP)
    await wait_until(lambda: all_threads_stopped(pid), f"every thread of {pid} to stop")


def compile_process(
    core: ai.Core, model: onnx.ModelProto, **config: object
) -> ProcessCompiledModel:
    compiled = core.compile_model(model, "PROCESS:CPU", {"NUM_STREAMS": 1, **config})
    assert isinstance(compiled, ProcessCompiledModel)
    return compiled


@contextlib.asynccontextmanager
async def closing(compiled: ai.CompiledModel) -> AsyncIterator[None]:
    """Close the model at the end; first continue (SIGCONT) a worker that a failed test
    left stopped, so that it exits when asked."""
    pids = {getattr(compiled, "worker_pid", None)}
    try:
        yield
    finally:
        pids.add(getattr(compiled, "worker_pid", None))
        for pid in pids - {None}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        await compiled.close()


class Ticker:
    """Ticks on the event loop every ``interval`` seconds; ``worst`` is the most a tick
    woke up late."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.ticks = 0
        self.worst = 0.0

    async def run(self) -> None:
        while True:
            start = time.perf_counter()
            await anyio.sleep(self.interval)
            self.worst = max(self.worst, time.perf_counter() - start - self.interval)
            self.ticks += 1

    async def idle(self, ticks: int) -> None:
        """Tick ``ticks`` times on a loop with nothing else to do (the control)."""
        async with anyio.create_task_group() as group:
            group.start_soon(self.run)
            while self.ticks < ticks:
                await anyio.sleep(self.interval)
            group.cancel_scope.cancel()


# -- SIGKILL ----------------------------------------------------------------------------


async def test_killed_between_inferences_the_next_works(core: ai.Core) -> None:
    compiled = compile_process(core, SHORT)
    async with closing(compiled):
        kept = compiled.create_infer_request()
        inputs = feeds(3)
        await kept.infer(inputs)
        old = compiled.worker_pid
        assert old is not None and compiled.ready() and compiled.worker_restarts == 0
        os.kill(old, signal.SIGKILL)
        # Once the death is seen (the pid is None while a new worker starts), nothing is
        # lost: inferences wait for the new worker, on the request that had a connection
        # to the old one, on a pooled one and on the synchronous path.
        await wait_until(lambda: compiled.worker_pid != old, "the death to be seen")
        check(SHORT, inputs, await kept.infer(inputs))
        check(SHORT, inputs, await compiled.infer(inputs))
        check(SHORT, inputs, await anyio.to_thread.run_sync(kept.infer_sync, inputs))
        assert compiled.worker_pid not in (None, old)
        assert compiled.worker_restarts == 1
        assert compiled.ready()


async def test_killed_during_an_inference_it_fails_retryably(core: ai.Core) -> None:
    compiled = compile_process(core, LONG)
    async with closing(compiled):
        request = compiled.create_infer_request()
        slow = feeds(2048)
        await request.infer(slow)
        old = compiled.worker_pid
        assert old is not None

        async def kill_while_it_computes() -> None:
            computed = cpu_ticks(old)
            while cpu_ticks(old) < computed + COMPUTING:
                await anyio.sleep(0.005)
            os.kill(old, signal.SIGKILL)

        async with anyio.create_task_group() as group:
            group.start_soon(kill_while_it_computes)
            with pytest.raises(ai.WorkerDiedError) as died:
                await request.infer(slow)
        assert isinstance(died.value, ai.DeviceUnavailableError)
        assert isinstance(died.value, ai.InferenceError)  # what callers caught before
        message = str(died.value)
        for words in (f"PROCESS:CPU worker process (pid {old})", "SIGKILL", "exit code -9"):
            assert words in message, message
        assert "retry" in message
        assert not compiled.ready()  # a new worker is starting
        # The same request runs again on the new worker (its inference waits for it).
        small = feeds(2)
        check(LONG, small, await request.infer(small))
        assert compiled.ready() and compiled.worker_pid not in (None, old)


def test_killed_during_a_synchronous_inference(core: ai.Core) -> None:
    compiled = compile_process(core, LONG)
    try:
        request = compiled.create_infer_request()
        slow = feeds(2048)
        request.infer_sync(slow)
        old = compiled.worker_pid
        assert old is not None
        computed = cpu_ticks(old)

        def kill_while_it_computes() -> None:
            while cpu_ticks(old) < computed + COMPUTING:
                time.sleep(0.005)
            os.kill(old, signal.SIGKILL)

        killer = threading.Thread(target=kill_while_it_computes)
        killer.start()
        with pytest.raises(ai.WorkerDiedError, match="SIGKILL"):
            request.infer_sync(slow)
        killer.join()
        small = feeds(2)
        check(LONG, small, request.infer_sync(small))
    finally:
        anyio.run(compiled.close)


# -- SIGSTOP ----------------------------------------------------------------------------


async def test_stopped_worker_is_killed_and_replaced_while_the_loop_ticks(
    core: ai.Core,
) -> None:
    compiled = compile_process(core, SHORT, WORKER_TIMEOUT_S=TIMEOUT)
    assert compiled.get_property("WORKER_TIMEOUT_S") == TIMEOUT
    async with closing(compiled):
        small, large = feeds(2), feeds(8192)  # 2 MB: more than a socket takes at once
        kept, loaded = compiled.create_infer_request(), compiled.create_infer_request()
        await kept.infer(small)
        await loaded.infer(small)
        control = Ticker()
        await control.idle(100)
        old = compiled.worker_pid
        assert old is not None
        await stop_process(old)

        ticker = Ticker()
        outcomes: dict[str, object] = {}

        async def run(name: str, infer: Callable[[], object]) -> None:
            try:
                outcomes[name] = await infer()  # type: ignore[misc]
            except ai.AioinferError as exc:
                outcomes[name] = exc

        with anyio.fail_after(HANG_BOUND):
            async with anyio.create_task_group() as group:
                group.start_soon(ticker.run)
                async with anyio.create_task_group() as inferences:
                    # Sent whole, before the worker stopped reading: lost with the worker.
                    inferences.start_soon(run, "sent", lambda: kept.infer(small))
                    # A send the stopped worker never takes all of, and the handshake of
                    # a new connection: both wait off the loop, then go to the new worker.
                    inferences.start_soon(run, "large", lambda: loaded.infer(large))
                    fresh = compiled.create_infer_request()
                    inferences.start_soon(run, "fresh", lambda: fresh.infer(small))
                group.cancel_scope.cancel()

        error = outcomes["sent"]
        assert isinstance(error, ai.WorkerTimeoutError), error
        assert isinstance(error, ai.DeviceUnavailableError) and isinstance(error, TimeoutError)
        message = str(error)
        for words in (f"(pid {old})", f"within {TIMEOUT:g} s (WORKER_TIMEOUT_S)", "retry"):
            assert words in message, message
        check(SHORT, large, outcomes["large"])  # type: ignore[arg-type]
        check(SHORT, small, outcomes["fresh"])  # type: ignore[arg-type]
        assert not process_alive(old)  # killed, though stopped
        assert compiled.worker_pid not in (None, old)
        check(SHORT, small, await kept.infer(small))
        assert compiled.ready()
        # The loop kept ticking while the worker hung and was replaced: a loop that waited
        # for the hung worker would stall for TIMEOUT; the new worker's start competes with
        # the loop for the two cores, hence the margin.
        assert ticker.ticks > control.ticks
        assert ticker.worst < control.worst + TIMEOUT / 2, (ticker.worst, control.worst)


async def test_close_with_a_stopped_worker_ends(core: ai.Core) -> None:
    """The default timeout (30 s) is far away: close() itself ends the stopped worker,
    and the inference it held ends cancelled."""
    compiled = compile_process(core, SHORT)
    request = compiled.create_infer_request()
    inputs = feeds(2)
    await request.infer(inputs)
    old = compiled.worker_pid
    assert old is not None
    await stop_process(old)
    try:
        request.start_async(inputs)
        with anyio.fail_after(HANG_BOUND):
            await anyio.wait_all_tasks_blocked()
            await compiled.close()
            with pytest.raises(ai.InferCancelledError):
                await request.wait()
        assert not process_alive(old)
        assert not compiled.ready()
        with pytest.raises(ai.RequestClosedError):
            await compiled.infer(inputs)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(old, signal.SIGKILL)


# -- a caller's deadline against a stopped worker ------------------------------------------

DEADLINE = 0.5
"""The callers' deadline (``anyio.move_on_after``) in the tests below."""
MARGIN = 1.0
"""How much later than a deadline around a plain sleep (measured in the same test) a
deadline around an inference on a stopped worker may return: generous against a busy
machine, and below the heartbeat's period, which is the least a wait for the worker would
add (control returned five seconds late when the cancel waited for the worker)."""
REPLACE_TIMEOUT = 4.0
"""WORKER_TIMEOUT_S of the test that lets the heartbeat replace the stopped worker: a
deadline that waited for the heartbeat would return this much late."""


async def deadline_overshoot() -> float:
    """Seconds a ``DEADLINE`` around a sleep that never ends takes: the control."""
    started = time.perf_counter()
    with anyio.move_on_after(DEADLINE):
        await anyio.sleep_forever()
    return time.perf_counter() - started


async def give_up_after_the_deadline(requests: list[ai.AsyncInferRequest]) -> list[float]:
    """Each request's inference of ``feeds(2)`` at once, inside ``DEADLINE``: the seconds
    until each caller had control back (every one must time out)."""
    elapsed: list[float] = []

    async def give_up(request: ai.AsyncInferRequest) -> None:
        started = time.perf_counter()
        with anyio.move_on_after(DEADLINE) as scope:
            await request.infer(feeds(2))
        elapsed.append(time.perf_counter() - started)
        assert scope.cancelled_caught  # the stopped worker answered nothing

    with anyio.fail_after(HANG_BOUND):
        async with anyio.create_task_group() as group:
            for request in requests:
                group.start_soon(give_up, request)
    return elapsed


async def test_a_deadline_returns_in_time_while_the_heartbeat_replaces_the_worker(
    core: ai.Core,
) -> None:
    compiled = compile_process(core, SHORT, WORKER_TIMEOUT_S=REPLACE_TIMEOUT)
    async with closing(compiled):
        small = feeds(2)
        requests = [compiled.create_infer_request() for _ in range(3)]
        for request in requests:
            check(SHORT, small, await request.infer(small))
        control = await deadline_overshoot()
        old = compiled.worker_pid
        assert old is not None
        await stop_process(old)

        elapsed = await give_up_after_the_deadline(requests)
        assert max(elapsed) < control + MARGIN, (elapsed, control)
        assert process_alive(old)  # control came back before the heartbeat ended it

        # The heartbeat still kills and replaces the stopped worker; each request then
        # runs on the new one (the reply the old one owed is never awaited).
        await wait_until(lambda: compiled.worker_pid not in (None, old), "the new worker")
        assert not process_alive(old)
        for seed, request in enumerate(requests, 10):
            inputs = feeds(3, seed)
            check(SHORT, inputs, await request.infer(inputs))
        assert compiled.worker_restarts == 1


async def test_a_deadline_returns_in_time_and_the_continued_worker_answers_afresh(
    core: ai.Core,
) -> None:
    """The default WORKER_TIMEOUT_S (30 s): the worker is continued (SIGCONT) instead of
    replaced; the replies it then gives to the abandoned inferences are dropped, and each
    request's next inference gets its own results."""
    compiled = compile_process(core, SHORT)
    async with closing(compiled):
        small = feeds(2)
        requests = [compiled.create_infer_request() for _ in range(3)]
        for request in requests:
            check(SHORT, small, await request.infer(small))
        control = await deadline_overshoot()
        old = compiled.worker_pid
        assert old is not None
        await stop_process(old)
        try:
            elapsed = await give_up_after_the_deadline(requests)
        finally:
            os.kill(old, signal.SIGCONT)
        assert max(elapsed) < control + MARGIN, (elapsed, control)
        for seed, request in enumerate(requests, 10):
            inputs = feeds(5, seed)
            check(SHORT, inputs, await request.infer(inputs))
        # The pooled path too: compiled.infer gives up and the next call is answered.
        await stop_process(old)
        try:
            started = time.perf_counter()
            with anyio.fail_after(HANG_BOUND), anyio.move_on_after(DEADLINE):
                await compiled.infer(small)
            assert time.perf_counter() - started < control + MARGIN
        finally:
            os.kill(old, signal.SIGCONT)
        inputs = feeds(4, 20)
        check(SHORT, inputs, await compiled.infer(inputs))
        assert compiled.worker_pid == old and compiled.worker_restarts == 0


async def test_cancel_ends_the_wait_on_a_stopped_worker_on_both_paths(core: ai.Core) -> None:
    """``request.cancel()`` (from the loop, and from the loop for an inference that a
    thread waits for on the synchronous path) ends an inference held by a stopped worker
    at once: InferCancelledError, long before the heartbeat (30 s) would; the continued
    worker then answers afresh. Each request has its connection already (a new one's
    handshake would wait for the stopped worker: a deadline ends that wait, see above)."""
    compiled = compile_process(core, SHORT)
    async with closing(compiled):
        small = feeds(2)
        request, threaded = compiled.create_infer_request(), compiled.create_infer_request()
        check(SHORT, small, await request.infer(small))
        check(SHORT, small, await anyio.to_thread.run_sync(threaded.infer_sync, small))
        control = await deadline_overshoot() - DEADLINE
        old = compiled.worker_pid
        assert old is not None
        await stop_process(old)
        try:
            cancelled: list[float] = []

            async def cancel_once_waiting() -> None:
                await anyio.wait_all_tasks_blocked()
                cancelled.append(time.perf_counter())
                request.cancel()

            with anyio.fail_after(HANG_BOUND):
                async with anyio.create_task_group() as group:
                    group.start_soon(cancel_once_waiting)
                    with pytest.raises(ai.InferCancelledError):
                        await request.infer(small)
                    returned = time.perf_counter()
            assert returned - cancelled[0] < control + MARGIN, (returned - cancelled[0], control)

            def infer_sync() -> object:
                try:
                    return threaded.infer_sync(small)
                except ai.AioinferError as exc:
                    return exc

            with anyio.fail_after(HANG_BOUND):
                async with anyio.create_task_group() as group:

                    async def run() -> None:
                        cancelled.append(time.perf_counter())
                        outcome = await anyio.to_thread.run_sync(infer_sync)
                        cancelled.append(time.perf_counter())
                        assert isinstance(outcome, ai.InferCancelledError), outcome

                    group.start_soon(run)
                    while threaded.state is not ai.RequestState.BUSY:
                        await anyio.sleep(0.005)
                    await anyio.sleep(DEADLINE)  # the thread waits on the stopped worker
                    asked = time.perf_counter()
                    threaded.cancel()
            assert cancelled[-1] - asked < control + MARGIN, (cancelled[-1] - asked, control)
            assert process_alive(old) and compiled.worker_restarts == 0
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(old, signal.SIGCONT)
        for seed in (30, 31):
            inputs = feeds(3, seed)
            check(SHORT, inputs, await request.infer(inputs))
        check(SHORT, small, await anyio.to_thread.run_sync(threaded.infer_sync, small))
        assert compiled.worker_pid == old


# -- BATCH:PROCESS:CPU --------------------------------------------------------------------


async def test_batch_on_process_reports_not_ready_while_its_worker_restarts(
    core: ai.Core,
) -> None:
    compiled = core.compile_model(SHORT, "BATCH:PROCESS:CPU", {"MAX_BATCH_SIZE": 4})
    assert isinstance(compiled, BatchCompiledModel)
    target = compiled.target
    assert isinstance(target, ProcessCompiledModel)
    async with closing(compiled):
        inputs = feeds(1)
        check(SHORT, inputs, await compiled.infer(inputs))
        old = target.worker_pid
        assert old is not None and compiled.ready()
        os.kill(old, signal.SIGKILL)
        await wait_until(lambda: not compiled.ready(), "the model to report not ready")
        await wait_until(compiled.ready, "the new worker")
        check(SHORT, inputs, await compiled.infer(inputs))
        assert target.worker_restarts == 1


# -- the worker's own end -----------------------------------------------------------------


def test_a_worker_whose_parent_dies_before_connecting_exits(tmp_path: Path) -> None:
    """A parent can die between starting a worker and connecting to it (say, while it
    replaces a dead worker on a daemon thread as the application exits)."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import os, signal, subprocess, sys\n"
        "worker = subprocess.Popen([sys.executable, '-m', 'aioinfer.devices.process'],\n"
        "                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n"
        "worker.stdin.write(os.urandom(32).hex().encode() + b'\\n')\n"
        "worker.stdin.close()\n"
        "print(worker.pid, worker.stdout.readline().decode().strip(), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    root = str(Path(__file__).resolve().parents[3])
    # Not its stderr: the worker inherits it, and an orphan would hold it open.
    done = subprocess.run(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": root},
        timeout=HANG_BOUND,
    )
    assert done.returncode == -signal.SIGKILL
    pid, address = done.stdout.split()
    assert address  # it listened, and nobody will connect
    deadline = time.monotonic() + HANG_BOUND
    while process_alive(int(pid)):
        if time.monotonic() > deadline:
            os.kill(int(pid), signal.SIGKILL)
            raise AssertionError("the orphaned worker kept waiting for a connection")
        time.sleep(0.05)
