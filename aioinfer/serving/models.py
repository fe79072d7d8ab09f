"""A served model version: its compiled model, bounded admission, its sequences.

The service's policy for one model version, whatever the transport: how many
inferences run at once and wait, which request a sequence runs on, how many sequences
stay open. Refusals are :class:`~aioinfer.errors.ServiceError` with a kind.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np

from aioinfer.errors import DeviceUnavailableError, ErrorKind, ServiceError
from aioinfer.generation.config import GenerationConfig
from aioinfer.plugin.async_request import AsyncInferRequest
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.results import InferResults
from aioinfer.serving.messages import datatype
from aioinfer.serving.repository import ModelConfig


@dataclass(frozen=True)
class SequenceFlags:
    """The sequence parameters of one infer request (``sequence_id`` and its flags)."""

    id: int | str
    start: bool
    end: bool

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, Any]) -> SequenceFlags | None:
        """The flags in a request's parameters; None when it names no sequence (id 0 or "").

        Raises:
            ServiceError: INVALID_ARGUMENT, a sequence id that is not an integer or a
                string.
        """
        sequence_id = parameters.get("sequence_id", 0)
        if isinstance(sequence_id, bool) or not isinstance(sequence_id, (int, str)):
            raise ServiceError(
                f"sequence_id must be an integer or a string, got {sequence_id!r}",
                ErrorKind.INVALID_ARGUMENT,
            )
        if sequence_id in (0, ""):
            return None
        return cls(
            sequence_id,
            bool(parameters.get("sequence_start", False)),
            bool(parameters.get("sequence_end", False)),
        )


class _Admission:
    """At most ``limit`` holders at once; the others wait in arrival order.

    Cheaper than a semaphore on the hot path: taking a free slot does not yield to the
    event loop, and a released slot goes straight to the longest waiter.
    """

    def __init__(self, limit: int) -> None:
        self.free = limit
        self._waiters: deque[anyio.Event] = deque()

    @property
    def waiting(self) -> int:
        """How many wait for a slot."""
        return len(self._waiters)

    def try_acquire(self) -> bool:
        """Take a free slot if one is free and nobody waits; else False."""
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return True
        return False

    async def acquire(self) -> None:
        if self.try_acquire():
            return
        event = anyio.Event()
        self._waiters.append(event)
        try:
            await event.wait()
        except anyio.get_cancelled_exc_class():
            if event.is_set():  # the slot arrived as we were cancelled: pass it on
                self.release()
            else:
                self._waiters.remove(event)
            raise

    def release(self) -> None:
        if self._waiters:
            self._waiters.popleft().set()
        else:
            self.free += 1


class _Sequence:
    """The request that keeps one sequence's state, used by one inference at a time."""

    def __init__(self, request: AsyncInferRequest) -> None:
        self.request = request
        self.lock = anyio.Lock()
        self.last_used = time.monotonic()


DEFAULT_MAX_SEQUENCES = 1000
"""Open sequences a model keeps when neither its config nor the server says otherwise."""


class ServedModel:
    """One version of a model as the server runs it.

    At most ``max_concurrency`` inferences run at once (each on a pooled request); up to
    ``max_queue`` more wait in arrival order; beyond that :meth:`infer` refuses
    (UNAVAILABLE). A request naming a sequence runs on that sequence's own request, which keeps its
    state between the sequence's inferences and is dropped at ``sequence_end`` or after
    ``sequence_idle_timeout_s`` without use. At most ``max_sequences`` (the config's, else
    the argument) are open at once: a new one beyond is refused (RESOURCE_EXHAUSTED).
    """

    def __init__(
        self,
        name: str,
        version: str,
        compiled: CompiledModel,
        config: ModelConfig,
        max_sequences: int = DEFAULT_MAX_SEQUENCES,
    ) -> None:
        self.name = name
        self.version = version
        self.compiled = compiled
        self.config = config
        self.max_concurrency = config.max_concurrency or _default_concurrency(compiled, config)
        self.max_sequences = config.max_sequences or max_sequences
        self.output_names = [port.name for port in compiled.outputs]
        """The compiled model's output names, in order."""
        self.input_datatypes = {port.name: datatype(port.dtype) for port in compiled.inputs}
        """The protocol datatype of each input, by name."""
        self._slots = _Admission(self.max_concurrency)
        self._sequences: dict[int | str, _Sequence] = {}
        self._executed: Counter[int] = Counter()
        self._count_rows = compiled.batch_statistics() is None
        """Whether :meth:`batch_sizes` counts executions here (the device does not)."""

    @property
    def inputs(self) -> list[Any]:
        """The compiled model's input ports."""
        return self.compiled.inputs

    @property
    def outputs(self) -> list[Any]:
        """The compiled model's output ports."""
        return self.compiled.outputs

    @property
    def sequences(self) -> dict[int | str, AsyncInferRequest]:
        """The live sequences and the request each runs on."""
        return {key: sequence.request for key, sequence in self._sequences.items()}

    def ready(self) -> bool:
        """Whether the model takes inferences now (not while its device recovers, e.g.
        while a new PROCESS worker starts)."""
        return self.compiled.ready()

    def describe(self, decided: Sequence[str] = ()) -> str:
        """One line for the startup log: the device (and the one ``AUTO`` chose), the
        hint, streams, batching and admission, and what the server ``decided`` itself
        (the defaults it applied: see ``ModelConfig.compile_plan``)."""
        compiled = self.compiled
        supported = compiled.supported_properties()
        device = str(compiled.get_property("DEVICE_NAME"))
        if "EXECUTION_DEVICES" in supported:
            device += f" on {', '.join(compiled.get_property('EXECUTION_DEVICES'))}"
        parts = [f"model {self.name!r} version {self.version}: {device}"]
        if "PERFORMANCE_HINT" in supported:
            parts.append(f"hint {compiled.get_property('PERFORMANCE_HINT')}")
        parts.append(f"{compiled.streams} stream(s)")
        batch = compiled.max_batch_size()
        if batch is not None:
            parts.append(f"batches of up to {batch} rows")
        parts.append(f"{self.max_concurrency} inferences at once")
        line = ", ".join(parts)
        if decided:
            line += f" (server defaults: {', '.join(decided)})"
        return line

    def batch_sizes(self) -> dict[int, int]:
        """Executions so far by number of rows: the BATCH device's batches, or else each
        inference's first-dimension size."""
        batches = self.compiled.batch_statistics()
        return dict(self._executed) if batches is None else batches

    async def infer(
        self, inputs: dict[str, np.ndarray], sequence: SequenceFlags | None
    ) -> tuple[InferResults, float]:
        """Run one inference; return its results and the seconds it waited to start.

        Raises:
            ServiceError: UNAVAILABLE when the queue is full; RESOURCE_EXHAUSTED when a
                new sequence would exceed ``max_sequences``; INVALID_ARGUMENT for a
                sequence that is not active and has no ``sequence_start``.
            DeviceUnavailableError: the device failed to run it and recovers (the message
                names the model and the cause): retryable.
            The errors of ``AsyncInferRequest.infer`` (bad input, failed kernel).
        """
        arrived = 0.0
        if not self._slots.try_acquire():
            if self._slots.waiting >= self.config.max_queue:
                raise self._at_capacity()
            arrived = time.perf_counter()
            await self._slots.acquire()
        try:
            if sequence is not None:
                return await self._infer_in_sequence(inputs, sequence, arrived)
            waited = time.perf_counter() - arrived if arrived else 0.0
            # BATCH: straight into the batch queue; other devices: a pooled request.
            results, queued = await self.compiled.infer_timed(inputs, share_inputs=True)
            self._count(inputs)
            return results, waited + queued
        except DeviceUnavailableError as exc:
            raise type(exc)(f"model {self.name!r} version {self.version}: {exc}") from exc
        finally:
            self._slots.release()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[float]:
        """Hold one of the model's ``max_concurrency`` slots (waiting in its queue) for work
        of several inferences, such as a generation's steps; gives the seconds it waited.

        Raises:
            ServiceError: UNAVAILABLE when the queue is full.
        """
        arrived = time.perf_counter()
        if not self._slots.try_acquire():
            if self._slots.waiting >= self.config.max_queue:
                raise self._at_capacity()
            await self._slots.acquire()
        try:
            yield time.perf_counter() - arrived
        finally:
            self._slots.release()

    @property
    def waiting(self) -> int:
        """Inferences admitted to the model's queue, waiting for one of its
        ``max_concurrency`` slots."""
        return self._slots.waiting

    def check_admission(self) -> None:
        """Refuse now what :meth:`infer` would refuse for a full queue: the server asks
        before it reads a request's body, so that a full model parses no bodies.

        Raises:
            ServiceError: UNAVAILABLE when every slot is taken and the queue is full.
        """
        if self._slots.free <= 0 and self._slots.waiting >= self.config.max_queue:
            raise self._at_capacity()

    def _at_capacity(self) -> ServiceError:
        return ServiceError(
            f"model {self.name!r} is at capacity: {self.max_concurrency} inferences "
            f"running and {self.config.max_queue} waiting (the queue limit)",
            ErrorKind.UNAVAILABLE,
        )

    async def _infer_in_sequence(
        self, inputs: dict[str, np.ndarray], flags: SequenceFlags, arrived: float
    ) -> tuple[InferResults, float]:
        sequence = self._sequences.get(flags.id)
        if flags.start:
            if sequence is not None:
                await self._drop(flags.id, sequence)
            elif len(self._sequences) >= self.max_sequences:
                raise ServiceError(
                    f"model {self.name!r} has {len(self._sequences)} open sequences, its "
                    f"limit (max_sequences {self.max_sequences}): end one (sequence_end) or "
                    f"wait until one is idle for {self.config.sequence_idle_timeout_s:g} s",
                    ErrorKind.RESOURCE_EXHAUSTED,
                )
            sequence = _Sequence(self.compiled.create_infer_request())
            self._sequences[flags.id] = sequence
        elif sequence is None:
            raise ServiceError(
                f"sequence {flags.id!r} of model {self.name!r} is not active: its first "
                f"request must set sequence_start (or it ended, or was idle for more than "
                f"{self.config.sequence_idle_timeout_s:g} s)",
                ErrorKind.INVALID_ARGUMENT,
            )
        locked = time.perf_counter()
        async with sequence.lock:
            waited = time.perf_counter() - (arrived or locked)
            try:
                results = await sequence.request.infer(inputs, share_inputs=True)
            finally:
                sequence.last_used = time.monotonic()
                if flags.end and self._sequences.get(flags.id) is sequence:
                    await self._drop(flags.id, sequence)
        self._count(inputs)
        return results, waited + sequence.request.queued_seconds

    async def _drop(self, key: int | str, sequence: _Sequence) -> None:
        del self._sequences[key]
        with anyio.CancelScope(shield=True):
            await sequence.request.close()

    async def drop_idle_sequences(self) -> None:
        """Drop the sequences unused for longer than the idle timeout."""
        limit = time.monotonic() - self.config.sequence_idle_timeout_s
        for key, sequence in list(self._sequences.items()):
            if sequence.last_used < limit and not sequence.lock.locked():
                await self._drop(key, sequence)

    def _count(self, inputs: dict[str, np.ndarray]) -> None:
        if self._count_rows:
            first = next(iter(inputs.values()))
            self._executed[int(first.shape[0]) if first.ndim else 1] += 1

    async def close(self) -> None:
        """Close every request and the compiled model (in-flight work is cancelled)."""
        with anyio.CancelScope(shield=True):
            await self.compiled.close()


def _default_concurrency(compiled: CompiledModel, config: ModelConfig) -> int:
    batch = compiled.max_batch_size()
    if batch is not None:
        # Enough inferences in flight to fill a batch per stream, twice over.
        return batch * compiled.streams * 2
    requests = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
    if config.generate is None:
        return requests
    # A generation holds a slot while it runs: every generation the scheduler takes
    # (running or waiting there) must get one, or a decoder compiled for latency (one
    # request) would batch nothing; the scheduler's own limits refuse the rest.
    generate = config.generate
    if not isinstance(generate, GenerationConfig):
        generate = GenerationConfig.from_mapping(generate)
    return max(requests, generate.max_running_sequences + generate.max_waiting_sequences)
