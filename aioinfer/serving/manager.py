"""The model manager: which models of a repository are loaded, under a memory budget.

A repository may hold more models than the memory of one process: per-customer
fine-tunes, a zoo of small models. The manager loads a model when a request needs it
and, when the load would pass the budget, first unloads the least recently used models
that no request uses. A request for a model that is not loaded waits for its load
(bounded by ``load_wait`` seconds, the server's deadline for it, and by the model's
``max_queue`` waiting requests: beyond, a retryable UNAVAILABLE) instead of failing.

Policy, per model (its ``config.json``): ``"pinned": true`` is never unloaded by the
manager; ``"idle_unload_s": N`` is unloaded once idle for N seconds, even under the
budget; ``"memory_bytes"`` is what it is accounted at instead of what its load
measures; ``"memory_budget"`` is the most its load may measure.

**What a model holds.** No device reports its memory, so the manager measures it: the
resident memory of the server's process and its children (a ``PROCESS`` device's
worker) just before and just after the load; the difference (its weights as the device
keeps them, its plans, an engine's session), at least the size of its model files, is
the model's. Loads and unloads therefore run one at a time in the process, off the
event loop: they never hold up the requests of the loaded models. What else runs during
a load can only add to its measure, so a model's known size is the least of its loads'.

**What its inferences allocate.** Under a budget, a load ends with a warm-up inference
on example inputs (zeros; see :func:`~aioinfer.serving.service.example_inputs`) whose
peak resident memory, sampled on a thread, gives what the model's inferences allocate
per byte of their inputs. Each inference then holds its share (that ratio times its
inputs' bytes) of the budget while it runs: when the loaded models and the running
inferences leave too little, it waits (up to ``load_wait``; idle models are unloaded
meanwhile), and a load waits for the running inferences to give back what it needs.
For that memory to go back to the system after each run, the service turns off
onnxruntime's arena for the models it serves under a budget, and the manager sets
glibc to return freed memory at once (:func:`return_memory_promptly`). What is still
not accounted (the requests' bodies, the libraries an engine loads on first use, what
a load measured short) is caught by the resident memory itself: while the server has
gained more than the budget since before its first load, idle models are unloaded,
least recently used first. After an unload the manager collects the garbage and gives
the allocator's free pages back to the system (``malloc_trim`` on glibc).

**Never under a request.** A model with requests in flight or open sequences (a
stateful model's, a generation's) is busy: eviction picks the least recently used idle
model, and only when none is idle does it take the least recently used busy one, whose
requests then finish before it is closed (new ones wait for its next load). Models that
are pinned, loading or being unloaded are never picked.

**A load that fails** answers the requests that waited for it with its error; the
next request after a backoff (1 s, doubling up to a minute) tries again, those that
come sooner get the same error at once. A model that alone needs more than the budget
(its files, or its declared ``memory_bytes``) is refused with a
:class:`~aioinfer.errors.ModelMemoryError` that names both sizes.

The :class:`~aioinfer.serving.service.InferenceService` gives the manager its one way
to load a model (``compile``: its ``_compile``) and to close one (``retire``: the drain
and close of its versions); the manager decides when.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import enum
import gc
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import psutil
from anyio.abc import TaskGroup

from aioinfer.errors import ErrorKind, ModelMemoryError, ServiceError
from aioinfer.serving.metrics import ServerMetrics
from aioinfer.serving.models import ServedModel
from aioinfer.serving.repository import ModelEntry, ModelRepository

_logger = logging.getLogger(__name__)

FIRST_RETRY_S = 1.0
"""Seconds after a failed load before a request may try again (doubled per failure)."""
LAST_RETRY_S = 60.0
"""The longest wait between the tries of a model that keeps failing to load."""
FIRST_LOAD_FACTOR = 4
"""What a model's first load is taken to hold at once, in times its model files: the
read model, its serialized copy for the engine and the engine's own (onnxruntime held
3.9-4.0 times the weights of the benchmark's generated MatMul models while it loaded
them). Its later loads reserve what the first one measured."""


def format_bytes(size: float) -> str:
    """``size`` bytes for a message: ``"412.5 MiB (432537600 bytes)"``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit} ({int(size)} bytes)"
    return f"{int(size)} bytes"


def resident_memory() -> int:
    """The resident memory of this process and its children (bytes): a ``PROCESS``
    device's worker holds its model in a child."""
    process = psutil.Process()
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # it ended meanwhile
            total += child.memory_info().rss
    return total


def model_file_bytes(entry: ModelEntry) -> int:
    """The size of the served versions' model files, with their external data
    (``model.onnx_data``, ``model.onnx.data`` beside them): the least a load holds."""
    total = 0
    for path in entry.served_versions().values():
        for file in path.parent.iterdir():
            if file == path or (file.name.startswith(path.name) and file.is_file()):
                total += file.stat().st_size
    return total


_LIBC = ctypes.util.find_library("c")
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameters (malloc.h)."""
RETURN_THRESHOLD = 128 * 2**10
"""Under a budget, allocations from this size up are mapped on their own and unmapped
when freed, and free memory at the top of the heap beyond it goes back to the system:
glibc's defaults move the first threshold up to 32 MiB as blocks are freed, after which
the memory of engines' runs stays in the heap (the benchmark's accounts fell from 720
to 445 MiB with this)."""


def return_memory_promptly() -> None:
    """Make glibc's allocator give freed memory back to the system at once (for the
    whole process: the budget is the process's), instead of keeping it for reuse."""
    if _LIBC is not None:
        mallopt = getattr(ctypes.CDLL(_LIBC), "mallopt", None)
        if mallopt is not None:
            mallopt(_M_MMAP_THRESHOLD, RETURN_THRESHOLD)
            mallopt(_M_TRIM_THRESHOLD, RETURN_THRESHOLD)


def release_free_memory() -> None:
    """Collect the garbage and give the allocator's free pages back to the system: after
    an unload, the resident memory falls back (glibc keeps freed memory otherwise)."""
    gc.collect()
    if _LIBC is not None:
        trim = getattr(ctypes.CDLL(_LIBC), "malloc_trim", None)
        if trim is not None:
            trim(0)


class ModelState(enum.Enum):
    """A model's state in the repository index (Triton's words)."""

    READY = "READY"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


class PeakMemory:
    """The highest :func:`resident_memory` while the block runs, sampled every
    ``interval`` seconds on a thread of its own (the block may run on the event loop)."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.highest = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="aioinfer-peak-memory")

    def __enter__(self) -> PeakMemory:
        self.highest = resident_memory()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self.highest = max(self.highest, resident_memory())

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(psutil.Error):
                self.highest = max(self.highest, resident_memory())


@dataclass(eq=False)
class ManagedModel:
    """One model of the repository as the manager sees it."""

    name: str
    state: ModelState = ModelState.UNAVAILABLE
    reason: str = "unloaded"
    """Why the model is UNAVAILABLE (the repository index's ``reason``)."""
    bytes: int = 0
    """What the model holds while loaded (or reserves while it loads)."""
    known_bytes: int = 0
    """What its last load measured: the estimate of its next one."""
    loading_bytes: int = 0
    """The most its load held at once (the compile's copies of the weights included,
    which it frees before it ends), at the least measured: reserved with its load."""
    run_bytes: int = 0
    """What its warm-up inference allocated on top (its activations, at the least
    measured): reserved with its load."""
    run_bytes_per_input_byte: float = 0.0
    """What its inferences allocate per byte of their inputs (its warm-up's measure):
    what each of its inferences reserves of the budget while it runs."""
    last_used: float = 0.0
    """When a request last came for it (``time.perf_counter()``)."""
    waiting: int = 0
    """Requests waiting for its load."""
    loaded_once: bool = False
    """It loaded at least once (the manager may have unloaded it since)."""
    held_back: bool = False
    """An operator unloaded it: it loads again only when an operator loads it."""
    failure: ServiceError | None = None
    """What requests get while its failed load is not tried again."""
    failed_at: float = 0.0
    failures: int = 0
    retry_at: float = 0.0
    changed: anyio.Event = field(default_factory=anyio.Event)
    """Set (and replaced) at each change of state."""

    def notify(self) -> None:
        changed, self.changed = self.changed, anyio.Event()
        changed.set()


class ModelManager:
    """Loads and unloads the models of ``repository`` under ``budget`` bytes (None: no
    budget).

    Args:
        repository: the models.
        metrics: where the loads, unloads, evictions, hits, misses and bytes are counted.
        compile: loads one model: its versions, compiled (the service's ``_compile``).
        retire: closes the versions of an unloaded model once their requests ended,
            waiting up to the timeout it is given (None: as long as they run).
        idle_since: None while model ``name`` is busy (requests in flight, open
            sequences); else when its last request ended (``time.perf_counter()``).
        warm_up: runs one example inference on each version of a model just loaded
            and returns the bytes of the inputs it gave them (0: none ran; see
            :meth:`InferenceService._warm_up`); None: no warm-up.
        budget: the bytes the loaded models may hold together.
        on_demand: whether a request may load a model that never loaded (one the
            manager unloaded, idle or evicted, is loaded again on demand anyway).
        load_wait: the longest a request waits for its model's load (seconds).
        drain_timeout: how long an operator's unload lets requests finish.
    """

    def __init__(
        self,
        repository: ModelRepository,
        metrics: ServerMetrics,
        *,
        compile: Callable[[ModelEntry], Awaitable[dict[str, ServedModel]]],
        retire: Callable[[list[ServedModel], float | None], Awaitable[None]],
        idle_since: Callable[[str], float | None],
        warm_up: Callable[[dict[str, ServedModel]], Awaitable[int]] | None = None,
        budget: int | None = None,
        on_demand: bool = True,
        load_wait: float = 60.0,
        drain_timeout: float = 30.0,
    ) -> None:
        self.repository = repository
        self.metrics = metrics
        metrics.memory_budget = budget
        self.budget = budget
        self.on_demand = on_demand
        self.load_wait = load_wait
        self.drain_timeout = drain_timeout
        self.models: dict[str, dict[str, ServedModel]] = {}
        """Model name -> version -> the served model, for the loaded models."""
        self._compile = compile
        self._retire = retire
        self._idle_since = idle_since
        self._warm_up = warm_up
        self._running = 0
        """What the inferences running now reserved of the budget (bytes)."""
        self._wanted: list[tuple[int]] = []
        """The inferences waiting for memory, first come first: what each needs."""
        self._freed = anyio.Event()
        """Set (and replaced) when reserved memory is given back or a model unloaded."""
        self._wake = anyio.Event()
        """Set to run the watch at once (an inference waits for memory)."""
        self._managed: dict[str, ManagedModel] = {}
        self._lock = anyio.Lock()
        self._group: TaskGroup | None = None
        self._own: int | None = None
        """The resident memory of the server before its first load (bytes)."""

    def managed(self, name: str) -> ManagedModel:
        """The manager's record of model ``name``."""
        found = self._managed.get(name)
        if found is None:
            found = self._managed[name] = ManagedModel(name)
        return found

    def state(self, name: str) -> tuple[ModelState, str]:
        """Model ``name``'s state and, for UNAVAILABLE, why."""
        if name in self.models:
            return ModelState.READY, ""
        found = self._managed.get(name)
        if found is None:
            return ModelState.UNAVAILABLE, "unloaded"
        return found.state, found.reason if found.state is ModelState.UNAVAILABLE else ""

    def used_bytes(self) -> int:
        """What the loaded (and loading, and unloading) models hold."""
        return sum(managed.bytes for managed in self._managed.values())

    def running_bytes(self) -> int:
        """What the inferences running now reserved of the budget."""
        return self._running

    def _notify_freed(self) -> None:
        freed, self._freed = self._freed, anyio.Event()
        freed.set()

    # -- the lifetime -------------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the loads that requests start and the idle unloads; at the end, stop them
        (the service closes what is loaded)."""
        # The events and lock bind to the event loop that first waits on them: an app
        # whose lifespan runs again on another loop (a test server started twice, an
        # app mounted again) gets new ones.
        self._freed, self._wake, self._lock = anyio.Event(), anyio.Event(), anyio.Lock()
        for managed in self._managed.values():
            managed.changed = anyio.Event()
        async with anyio.create_task_group() as group:
            self._group = group
            group.start_soon(self._unload_idle)
            try:
                yield
            finally:
                self._group = None
                group.cancel_scope.cancel()

    async def load_at_start(self, names: Iterable[str]) -> None:
        """Load ``names`` in this order; under a budget, while they fit (without
        unloading any): the others load on demand.

        Raises:
            AioinferError: a model cannot be read or compiled (the message names it).
        """
        for name in names:
            if name in self.models:
                continue
            entry = self.repository.models[name]
            if self.budget is not None:
                least = entry.config.memory_bytes or model_file_bytes(entry)
                need = max(self.managed(name).known_bytes, least)
                if self.used_bytes() + need > self.budget:
                    _logger.info(
                        "model %r not loaded at the start: it needs about %s and the "
                        "budget has %s left (it loads on its first request)",
                        name,
                        format_bytes(need),
                        format_bytes(self.budget - self.used_bytes()),
                    )
                    continue
            await self.load(name, entry)

    def clear(self) -> None:
        """Forget what was loaded (the service closed the models)."""
        self.models.clear()
        for managed in self._managed.values():
            managed.state, managed.reason, managed.bytes = ModelState.UNAVAILABLE, "unloaded", 0
            managed.notify()
        self.metrics.clear_memory()

    # -- requests -----------------------------------------------------------------------

    def touch(self, name: str) -> None:
        """A request came for model ``name``, which is loaded (a hit)."""
        managed = self._managed.get(name)
        if managed is not None:
            managed.last_used = time.perf_counter()
            self.metrics.loads_of(name).hits += 1

    async def acquire(self, name: str) -> None:
        """Wait until model ``name`` is loaded, loading it if nobody does: on return (with
        no await between) it is in :attr:`models`. Returns at once, leaving the model
        unloaded, for a model the manager does not load on demand (unknown, or unloaded
        by an operator): the caller's lookup says NOT_FOUND.

        Raises:
            ServiceError: UNAVAILABLE, ``max_queue`` requests wait for its load already,
                it did not load within ``load_wait`` seconds, or its load failed (the
                error; those coming during the backoff get it too);
                :class:`~aioinfer.errors.ModelMemoryError` (RESOURCE_EXHAUSTED), it does
                not fit the budget.
        """
        entry = self.repository.models.get(name)
        if entry is None:
            return
        managed = self.managed(name)
        # Without on_demand, a model the manager unloaded (idle, evicted) comes back still.
        if managed.held_back or not (self.on_demand or managed.loaded_once):
            return
        if managed.waiting >= entry.config.max_queue:
            raise ServiceError(
                f"model {name!r} is not loaded and {managed.waiting} requests wait for its "
                f"load (its max_queue); retry later",
                ErrorKind.UNAVAILABLE,
            )
        self.metrics.loads_of(name).misses += 1
        arrived = time.perf_counter()
        managed.waiting += 1
        try:
            with anyio.fail_after(self.load_wait):
                while name not in self.models:
                    if managed.held_back:
                        return
                    if managed.state is ModelState.UNAVAILABLE:
                        failed = managed.failure is not None
                        if failed and managed.failed_at >= arrived:  # the load it waited for
                            raise self._failed(managed)
                        if failed and time.perf_counter() < managed.retry_at:
                            raise self._failed(managed)
                        if self._start_load(managed, entry):
                            with anyio.CancelScope(shield=True):
                                await self._load_on_demand(name, entry)
                            continue
                    await managed.changed.wait()
        except TimeoutError:
            raise ServiceError(
                f"model {name!r} did not load within {self.load_wait:g} s "
                f"(state {managed.state.value}); retry later",
                ErrorKind.UNAVAILABLE,
            ) from None
        finally:
            managed.waiting -= 1
        managed.last_used = time.perf_counter()

    @asynccontextmanager
    async def inference_memory(self, name: str, input_bytes: int) -> AsyncIterator[None]:
        """Hold, while the block runs, what an inference of model ``name`` on
        ``input_bytes`` bytes of inputs allocates (what its warm-up allocated per input
        byte) against the budget. When the loaded models and the running inferences
        leave too little, it waits for them to give memory back (idle models are
        unloaded meanwhile), up to ``load_wait`` seconds, behind the inferences that
        waited first (a large one is not passed by small ones forever); when no other
        inference runs, it runs whatever it needs (nothing it could wait for would
        free memory).

        Raises:
            ServiceError: UNAVAILABLE, the memory did not free within ``load_wait``
                seconds (retryable).
        """
        managed = self._managed.get(name)
        budget = self.budget
        need = 0
        if managed is not None and budget is not None:
            need = int(managed.run_bytes_per_input_byte * input_bytes)
        if need == 0 or budget is None:
            yield
            return

        def fits() -> bool:
            return not self._running or self.used_bytes() + self._running + need <= budget

        if self._wanted or not fits():
            place = (need,)  # this inference's place in the line (compared by identity)
            self._wanted.append(place)
            self._wake.set()
            try:
                with anyio.fail_after(self.load_wait):
                    while self._wanted[0] is not place or not fits():
                        await self._freed.wait()
            except TimeoutError:
                raise ServiceError(
                    f"model {name!r}: its inference needs {format_bytes(need)} of the memory "
                    f"budget, which the loaded models and the running inferences did not "
                    f"leave within {self.load_wait:g} s; retry later",
                    ErrorKind.UNAVAILABLE,
                ) from None
            finally:
                self._wanted = [other for other in self._wanted if other is not place]
                self._notify_freed()  # the next in line looks again
        self._running += need
        try:
            yield
        finally:
            self._running -= need
            self._notify_freed()

    def _failed(self, managed: ManagedModel) -> ServiceError:
        failure = managed.failure
        assert failure is not None
        wait = max(0.0, managed.retry_at - time.perf_counter())
        return type(failure)(f"{failure} (the next load in {wait:.1f} s)", failure.kind)

    def _start_load(self, managed: ManagedModel, entry: ModelEntry) -> bool:
        """Mark the model LOADING and start its load in the manager's task group; True
        when no lifespan runs one (the caller loads it itself)."""
        managed.state, managed.reason = ModelState.LOADING, ""
        managed.notify()
        if self._group is None:
            return True
        self._group.start_soon(self._load_on_demand, managed.name, entry)
        return False

    async def _load_on_demand(self, name: str, entry: ModelEntry) -> None:
        try:
            await self.load(name, entry)
        except Exception as exc:
            _logger.warning("model %r: on-demand load failed: %s", name, exc)

    # -- loading and unloading ----------------------------------------------------------

    async def load(self, name: str, entry: ModelEntry) -> None:
        """Load model ``name`` as ``entry`` describes it (replacing its loaded versions,
        which are closed once their requests ended), first unloading the least recently
        used models as the budget needs; one load or unload at a time.

        Raises:
            ModelMemoryError: the model alone passes the budget (or its own
                ``memory_budget``), or the budget is held by models that cannot be
                unloaded.
            AioinferError: it cannot be read or compiled (the message names it).
        """
        managed = self.managed(name)
        managed.held_back = False
        figures = self.metrics.loads_of(name)
        async with self._lock:
            replaced = self.models.get(name)
            if replaced is None:
                managed.state, managed.reason = ModelState.LOADING, ""
                managed.notify()
            started = time.perf_counter()
            held = managed.bytes  # a replaced model's, until it is closed
            try:
                # Refused on what it certainly holds (its files, or its declared size);
                # room is made for what it held last time, up to the whole budget.
                least = entry.config.memory_bytes or model_file_bytes(entry)
                self._check_fits(name, least, entry)
                loading = managed.loading_bytes
                if not loading and entry.config.memory_bytes is None:  # a first load
                    loading = FIRST_LOAD_FACTOR * least
                need = self._estimate(managed, least, managed.run_bytes, loading)
                await self._make_room(need, name, f"to load {name!r}")
                managed.bytes = held + need  # reserved while it loads and warms up
                # Inferences running now give their memory back first (new ones wait).
                while self._running and self.used_bytes() + self._running > (self.budget or 0):
                    await self._freed.wait()
                if self._own is None and self.budget is not None:
                    return_memory_promptly()
                before = resident_memory()
                if self._own is None:
                    self._own = before
                with PeakMemory() as peak:
                    versions = await self._compile(entry)
                loading = peak.highest - before
                managed.loading_bytes = min(managed.loading_bytes or loading, loading)
                if self._warm_up is not None and self.budget is not None:
                    await self._measure_warm_up(managed, versions)
                measured = resident_memory() - before
            except BaseException as exc:
                managed.bytes = held
                figures.failed_loads += 1
                if replaced is None:
                    self._record_failure(managed, exc)
                raise
            size = entry.config.memory_bytes or max(measured, model_file_bytes(entry))
            if size > (entry.config.memory_budget or self.budget or size):
                _logger.warning(
                    "model %r: its load measured %s, over its budget (what else ran "
                    "meanwhile counts too; the resident memory is watched)",
                    name,
                    format_bytes(size),
                )
            # What else ran during the load only adds to a measure: keep the least.
            managed.known_bytes = min(managed.known_bytes or size, size)
            managed.bytes = held + size
            managed.failure, managed.failures = None, 0
            managed.loaded_once = True
            managed.last_used = time.perf_counter()
            self.models[name] = versions
            managed.state, managed.reason = ModelState.READY, ""
            managed.notify()
            figures.loads += 1
            figures.bytes = size
            figures.load_time.observe(time.perf_counter() - started)
            _logger.info("loaded model %r: it holds %s", name, format_bytes(size))
            del versions
            if replaced is not None:
                closing = list(replaced.values())
                del replaced
                await self._close(closing, self.drain_timeout)
                managed.bytes = size
            # It may have measured more than its estimate: make up for it with idle models.
            await self._make_room(0, name, f"after {name!r} loaded", idle_only=True)

    async def _measure_warm_up(
        self, managed: ManagedModel, versions: dict[str, ServedModel]
    ) -> None:
        """Run the warm-up of the versions of ``managed`` just loaded, and keep what it
        allocated above the loaded model's resident memory (the least of the loads'
        measures: what else runs meanwhile only adds to it)."""
        assert self._warm_up is not None
        loaded = resident_memory()
        with PeakMemory() as peak:
            input_bytes = await self._warm_up(versions)
        ran = max(0, peak.highest - loaded)
        if input_bytes <= 0 or ran <= 0:
            return
        per_input_byte = ran / input_bytes
        managed.run_bytes = min(managed.run_bytes or ran, ran)
        self.metrics.loads_of(managed.name).inference_bytes = managed.run_bytes
        known = managed.run_bytes_per_input_byte
        managed.run_bytes_per_input_byte = min(known or per_input_byte, per_input_byte)
        _logger.info(
            "model %r: its warm-up on %s of inputs allocated %s",
            managed.name,
            format_bytes(input_bytes),
            format_bytes(ran),
        )

    def _record_failure(self, managed: ManagedModel, failure: BaseException) -> None:
        managed.state, managed.reason = ModelState.UNAVAILABLE, f"load failed: {failure}"
        managed.failed_at = time.perf_counter()
        managed.failures += 1
        backoff = FIRST_RETRY_S * 2 ** (managed.failures - 1)
        managed.retry_at = managed.failed_at + min(LAST_RETRY_S, backoff)
        # Kept without its traceback, whose frames would keep what the load made alive.
        if isinstance(failure, ServiceError):
            managed.failure = type(failure)(str(failure), failure.kind)
        else:
            managed.failure = ServiceError(
                f"model {managed.name!r} failed to load: {failure}", ErrorKind.UNAVAILABLE
            )
        managed.notify()

    async def unload(self, name: str, reason: str = "unloaded", held_back: bool = False) -> bool:
        """Unload model ``name`` if it is loaded (its requests may finish, for up to
        ``drain_timeout``); ``held_back``: an operator's unload, after which requests do not
        load it again. Whether it was loaded."""
        managed = self.managed(name)
        managed.held_back = held_back
        async with self._lock:
            if name not in self.models:
                if held_back:
                    managed.reason = reason
                    managed.notify()
                return False
            await self._unload(managed, reason, self.drain_timeout)
            return True

    def _estimate(
        self, managed: ManagedModel, least: int, running: int = 0, loading: int = 0
    ) -> int:
        """What a load of ``managed`` will hold: what its last load measured, at least
        ``least`` (its files or its declared size), with ``running`` bytes of an
        inference on top, or the ``loading`` bytes the load itself held at once if
        more; at most the budget."""
        need = max(max(managed.known_bytes, least) + running, loading)
        return need if self.budget is None else min(need, self.budget)

    def _check_fits(self, name: str, size: int, entry: ModelEntry) -> None:
        how = "it needs at least"
        own = entry.config.memory_budget
        if own is not None and size > own:
            raise ModelMemoryError(
                f"model {name!r} does not fit its memory_budget: {how} {format_bytes(size)}, "
                f"its memory_budget is {format_bytes(own)}"
            )
        if self.budget is not None and size > self.budget:
            raise ModelMemoryError(
                f"model {name!r} does not fit the memory budget: {how} {format_bytes(size)}, "
                f"the budget is {format_bytes(self.budget)}"
            )

    def _over_budget(self, need: int) -> bool:
        """Whether ``need`` more bytes pass the budget: by the models' accounts, or by
        the resident memory the server gained since before its first load (what the
        accounts miss: arenas grown by requests, what a load measured short)."""
        if self.budget is None:
            return False
        gained = 0 if self._own is None else resident_memory() - self._own
        return max(self.used_bytes() + self._running, gained) + need > self.budget

    async def _make_room(self, need: int, keep: str, why: str, idle_only: bool = False) -> None:
        """Unload the least recently used models until ``need`` more bytes fit; only
        idle ones with ``idle_only``, or when only the resident memory is over."""
        budget = self.budget
        while budget is not None and self._over_budget(need):
            candidates = sorted(
                (
                    managed
                    for managed in self._managed.values()
                    if managed.name in self.models
                    and managed.name != keep
                    and managed.state is ModelState.READY
                    and not self.repository.models[managed.name].config.pinned
                ),
                key=lambda managed: managed.last_used,
            )
            idle = [m for m in candidates if self._idle_since(m.name) is not None]
            accounted = self.used_bytes() + need > budget
            victims = idle or ([] if idle_only or not accounted else candidates)
            if not victims:
                if idle_only or not accounted:
                    return
                held = self.used_bytes()
                raise ModelMemoryError(
                    f"model {keep!r} needs {format_bytes(need)}, but the loaded models "
                    f"hold {format_bytes(held)} of the budget of {format_bytes(budget)} "
                    "and none can be unloaded (pinned, or loading)"
                )
            victim = victims[0]
            self.metrics.loads_of(victim.name).evictions += 1
            await self._unload(victim, f"evicted: least recently used, {why}", None)

    async def _unload(self, managed: ManagedModel, reason: str, timeout: float | None) -> None:
        closing = list(self.models.pop(managed.name).values())
        managed.state = ModelState.UNLOADING
        managed.notify()
        try:
            await self._close(closing, timeout)
        finally:
            managed.state, managed.reason, managed.bytes = ModelState.UNAVAILABLE, reason, 0
            managed.notify()
            self._notify_freed()
            figures = self.metrics.loads_of(managed.name)
            figures.unloads += 1
            figures.bytes = 0
            _logger.info("unloaded model %r (%s)", managed.name, reason)

    async def _close(self, models: list[ServedModel], timeout: float | None) -> None:
        """Retire ``models`` and give their memory back to the system; ``models`` is
        emptied (the caller must hold no other reference: the memory would stay)."""
        await self._retire(models, timeout)
        models.clear()
        await anyio.to_thread.run_sync(release_free_memory)

    async def _unload_idle(self) -> None:
        """Every tick (at once when an inference waits for memory): the idle models past
        their ``idle_unload_s``, then, while the server's resident memory (or what the
        waiting inferences need) is over the budget, the least recently used idle ones."""
        while True:
            limits = [
                entry.config.idle_unload_s
                for entry in self.repository.models.values()
                if entry.config.idle_unload_s is not None
            ]
            tick = 0.25 if self.budget is not None else 1.0
            with anyio.move_on_after(min(tick, max(0.01, min(limits, default=1.0) / 4))):
                await self._wake.wait()
            self._wake = anyio.Event()
            wanted = max((need for (need,) in self._wanted), default=0)
            if self._over_budget(wanted):
                why = "for a running inference" if wanted else "the server's memory over the budget"
                async with self._lock:
                    await self._make_room(wanted, "", why, True)
            now = time.perf_counter()
            for name in list(self.models):
                config = self.repository.models[name].config
                if config.idle_unload_s is None or config.pinned:
                    continue
                ended = self._idle_since(name)
                managed = self.managed(name)
                if ended is None or now - max(ended, managed.last_used) < config.idle_unload_s:
                    continue
                async with self._lock:
                    if name in self.models and self._idle_since(name) is not None:
                        reason = f"idle for {config.idle_unload_s:g} s"
                        await self._unload(managed, reason, None)
