"""One loop per compiled decoder: every running sequence advances in one batched step.

Concurrent ``generate`` calls on one compiled model (and one :class:`GenerationConfig`)
submit their sequences to its :class:`GenerationScheduler`. A task of the event loop runs
while there is work; each iteration:

1. *Rebatch.* Rows that finished (length, stop token), whose consumer went away, or whose
   consumer fell ``max_buffered_tokens`` behind (*paused*: the row's cache is kept aside)
   leave the running batch; prefilled and resumed sequences join it. The batch's cache
   stays in the variables of one infer request (the *decode* request) between steps; a
   change of rows reads them, repacks them left-padded (:mod:`.cache`) and sets them
   back: one copy, only when rows change.
2. *Prefill.* Waiting sequences, in arrival order, are admitted as a group while places
   are free (``max_running_sequences``), their padded prompts fit the step's token
   budget left by the running rows (``max_step_tokens``) and the padding is no more than
   the prompts' own tokens; the group runs on a second
   request, left-padded, a chunk of columns per iteration when the prompts are longer
   than the budget. Its first tokens are picked when its last chunk ran, and it joins the
   batch at the next rebatch (taking over the decode request as it is when no batch
   runs: no copy).
3. *Decode.* One inference for every running row: each feeds its last token, with its
   ``attention_mask`` (zeros over its left padding) and ``position_ids``; each row's
   logits go to its own :class:`~aioinfer.generation.sampling.Sampling` and Generator.

Compute runs on the device's executors, as for any inference; a step whose every
sequence went away is cancelled. A sequence's tokens wait in its buffer for its consumer.
"""

from __future__ import annotations

import asyncio
import enum
import time
import weakref
from collections import deque
from collections.abc import Sequence as Rows
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import numpy as np

from aioinfer.errors import QueueFullError
from aioinfer.generation.cache import Block, attention_mask, repack, sequence_axes
from aioinfer.generation.config import GenerationConfig
from aioinfer.generation.sampling import Sampling, Step, last_logits
from aioinfer.histogram import Histogram
from aioinfer.plugin.async_request import AsyncInferRequest, RequestState
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.plugin.executors import spawn_detached


class Phase(enum.Enum):
    """Where a sequence is in the scheduler."""

    WAITING = "waiting"
    PREFILL = "prefill"
    RUNNING = "running"
    PAUSED = "paused"
    DONE = "done"


@dataclass(frozen=True)
class SchedulerCounts:
    """What a scheduler holds and has done (see :meth:`GenerationScheduler.counts`)."""

    running: int
    """Sequences with a place: in the running batch, being prefilled, or paused."""
    waiting: int
    """Sequences waiting for a place, in arrival order."""
    paused: int
    """Running sequences set aside until their consumer catches up."""
    steps: int
    """Decode steps run (one batched inference each)."""
    prompt_tokens: int
    """Prompt tokens prefilled."""
    generated_tokens: int
    """Tokens generated."""


TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 20, 40, 80)
"""Upper bounds (seconds) of the timing histograms."""
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
"""Upper bounds of the rows and tokens per step histograms."""


class GenerationStatistics:
    """What a scheduler measured since it was made (vLLM's figures; see docs/generation.md).
    Times are the scheduler's: when it produced a token, not when its consumer read it."""

    def __init__(self) -> None:
        self.time_to_first_token = Histogram(TIME_BUCKETS)
        """From a sequence's arrival to its first token."""
        self.inter_token_latency = Histogram(TIME_BUCKETS)
        """Between a sequence's consecutive tokens."""
        self.e2e_request_latency = Histogram(TIME_BUCKETS)
        """From a sequence's arrival to its end (finished, withdrawn or failed)."""
        self.request_queue_time = Histogram(TIME_BUCKETS)
        """From a sequence's arrival to the start of its prefill."""
        self.request_prefill_time = Histogram(TIME_BUCKETS)
        """From the start of a sequence's prefill to its first token."""
        self.request_decode_time = Histogram(TIME_BUCKETS)
        """From a sequence's first token to its end."""
        self.batch_size = Histogram(BATCH_BUCKETS)
        """Rows per decode step."""
        self.iteration_tokens = Histogram(BATCH_BUCKETS)
        """Tokens per step (the decode rows and the prefill chunk's padded tokens)."""


class GeneratedSequence:
    """One generation in a scheduler: its prompt, sampling, generator, and the tokens
    generated ahead of its consumer."""

    def __init__(self, scheduler: GenerationScheduler, prompt: list[int], sampling: Sampling):
        self.scheduler = scheduler
        self.prompt = prompt
        self.sampling = sampling
        self.picker = sampling.picker()
        self.phase = Phase.WAITING
        self.buffer: deque[Step] = deque()
        self.produced = 0
        self.finished = False
        """No token will be added (the last one is in the buffer or was read)."""
        self.error: BaseException | None = None
        self.length = 0
        """Positions in its cache."""
        self.next_token = 0
        """The token its next step feeds."""
        self.cache: list[np.ndarray] | None = None
        """Its cache while paused (one array per variable, one row)."""
        self.arrived = time.perf_counter()
        self.admitted = 0.0
        self.first_token = 0.0
        self.last_token = 0.0
        self.recorded = False
        """Whether its end was counted in the statistics."""
        self._wake: anyio.Event | None = None

    @property
    def gone(self) -> bool:
        """Whether it needs no more steps (finished, failed or withdrawn)."""
        return self.finished or self.phase is Phase.DONE

    async def next(self) -> Step | None:
        """The next token (None after the last one), waiting for the step that makes it.

        Raises:
            The error of a step that failed for this sequence.
        """
        while not self.buffer:
            if self.error is not None:
                raise self.error
            if self.finished or self.phase is Phase.DONE:
                return None
            self._wake = anyio.Event()
            await self._wake.wait()
        token = self.buffer.popleft()
        if self.phase is Phase.PAUSED and len(self.buffer) <= self.scheduler.resume_below:
            self.scheduler.notify()
        return token

    def push(self, step: Step) -> None:
        """Add a generated token; the sequence finishes after its last one."""
        token = step.token
        now = time.perf_counter()
        statistics = self.scheduler.statistics
        if self.produced == 0:
            self.first_token = now
            statistics.time_to_first_token.observe(now - self.arrived)
            statistics.request_prefill_time.observe(now - self.admitted)
        else:
            statistics.inter_token_latency.observe(now - self.last_token)
        self.last_token = now
        self.produced += 1
        self.buffer.append(step)
        self.next_token = token
        if self.sampling.finish_reason(token, self.produced) is not None:
            self.finished = True
            self.record_end()
        self.wake()

    def record_end(self) -> None:
        """Count the sequence's end in the statistics (once)."""
        if self.recorded:
            return
        self.recorded = True
        now = time.perf_counter()
        statistics = self.scheduler.statistics
        statistics.e2e_request_latency.observe(now - self.arrived)
        if self.produced:
            statistics.request_decode_time.observe(now - self.first_token)

    def fail(self, error: BaseException) -> None:
        """End the sequence with ``error`` (raised by :meth:`next` once the buffer is
        read)."""
        if not self.gone:
            self.error = error
        self.phase = Phase.DONE
        self.record_end()
        self.wake()

    def wake(self) -> None:
        """Wake the consumer waiting in :meth:`next`."""
        if self._wake is not None:
            self._wake.set()
            self._wake = None


class GenerationScheduler:
    """The scheduler of one compiled decoder and one config (see the module); made by
    :func:`scheduler_of`."""

    def __init__(self, compiled: CompiledModel, config: GenerationConfig, axes: list[int]):
        self.compiled = compiled
        self.config = config
        self.axes = axes
        self.resume_below = config.max_buffered_tokens // 2
        """A paused sequence resumes when its buffer holds at most this many tokens."""
        ports = {port.name: port for port in compiled.inputs}
        self._dtypes = {name: ports[name].dtype for name in ports}
        self.waiting: deque[GeneratedSequence] = deque()
        self.running: list[GeneratedSequence] = []
        """The rows of the decode batch, in order."""
        self.prefilling: list[GeneratedSequence] = []
        self.prefilled: list[GeneratedSequence] = []
        """The group whose prefill ran, to join at the next rebatch."""
        self.paused: list[GeneratedSequence] = []
        self._width = 0
        self._prefill_width = 0
        self._prefill_done = 0
        self._decode: AsyncInferRequest | None = None
        self._prefill: AsyncInferRequest | None = None
        self._loop: object | None = None
        self._changed: anyio.Event | None = None
        self._step_scope: anyio.CancelScope | None = None
        self._step_rows: list[GeneratedSequence] = []
        self._steps = 0
        self._prompt_tokens = 0
        self._generated_tokens = 0
        self.statistics = GenerationStatistics()
        """Its timings, rows and tokens per step."""

    # -- the consumers' side ------------------------------------------------------------

    def counts(self) -> SchedulerCounts:
        """The sequences it holds now and the work it did so far."""
        # A finished or withdrawn row no longer counts, though it leaves at the next step.
        placed = [*self.running, *self.prefilling, *self.prefilled]
        return SchedulerCounts(
            running=sum(not s.gone for s in placed) + len(self.paused),
            waiting=len(self.waiting),
            paused=len(self.paused),
            steps=self._steps,
            prompt_tokens=self._prompt_tokens,
            generated_tokens=self._generated_tokens,
        )

    def serves_here(self) -> bool:
        """Whether a sequence submitted from the current event loop can run here (its
        loop runs in this event loop, or in none)."""
        return self._loop is None or self._loop is _event_loop()

    def submit(self, prompt: list[int], sampling: Sampling) -> GeneratedSequence:
        """Queue a sequence, in arrival order, and start the loop when it is not running.

        Raises:
            QueueFullError: it would wait, and ``max_waiting_sequences`` wait already.
        """
        config = self.config
        counts = self.counts()
        must_wait = counts.running + counts.waiting + 1 > config.max_running_sequences
        if must_wait and counts.waiting >= config.max_waiting_sequences:
            raise QueueFullError(
                f"model {self.compiled.name!r}: {counts.running} sequences run and "
                f"{counts.waiting} wait, the most it takes (max_running_sequences "
                f"{config.max_running_sequences}, max_waiting_sequences "
                f"{config.max_waiting_sequences}); retry later"
            )
        sequence = GeneratedSequence(self, prompt, sampling)
        self.waiting.append(sequence)
        if self._loop is None:
            self._loop = _event_loop()
            spawn_detached(self._run)
        else:
            self.notify()
        return sequence

    def withdraw(self, sequence: GeneratedSequence) -> None:
        """Take ``sequence`` out (its consumer went away): it leaves before the next step,
        and a step that only it still needed is cancelled."""
        if sequence.phase is Phase.WAITING:
            self.waiting.remove(sequence)
        elif sequence.phase is Phase.PAUSED:
            self.paused.remove(sequence)
        sequence.phase = Phase.DONE
        sequence.record_end()
        sequence.buffer.clear()
        sequence.cache = None
        if self._step_scope is not None and all(s.gone for s in self._step_rows):
            self._step_scope.cancel()
        self.notify()

    def notify(self) -> None:
        """Wake the loop when it waits for a change."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    # -- the loop -----------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while self.waiting or self.running or self.prefilling or self.prefilled or self.paused:
                # The consumers the last step woke read their tokens before buffers are
                # judged full.
                await anyio.lowlevel.checkpoint()
                await self._rebatch()
                self._admit()
                worked = False
                if self.prefilling:
                    await self._prefill_chunk()
                    worked = True
                if self.prefilled and not self.prefilling:
                    await self._rebatch()
                if self.running:
                    await self._decode_step()
                    worked = True
                if not worked and not self._can_progress():
                    self._changed = anyio.Event()
                    await self._changed.wait()
        except BaseException as exc:  # the event loop ends, or the model was closed
            self._fail_all(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._loop = None
            self._changed = None
            for request in (self._decode, self._prefill):
                if request is not None and request.state is RequestState.IDLE:
                    request.reset_state()  # an idle scheduler holds no cache

    def _can_progress(self) -> bool:
        resumable = any(len(s.buffer) <= self.resume_below for s in self.paused)
        return bool(resumable or self.prefilled or (self.waiting and self._free() > 0))

    def _free(self) -> int:
        return self.config.max_running_sequences - self.counts().running

    def _admit(self) -> None:
        """Start prefilling the next group of waiting sequences (see the module)."""
        if self.prefilling or self.prefilled or not self.waiting:
            return
        budget = max(1, self.config.max_step_tokens - len(self.running))
        group: list[GeneratedSequence] = []
        longest = real = 0
        free = self._free()
        while self.waiting and len(group) < free:
            length = len(self.waiting[0].prompt)
            candidate = max(longest, length)
            padded = (len(group) + 1) * candidate
            # Together while the padding is at most the prompts' own tokens: beyond, a
            # group of its own costs less than computing that many padded positions.
            if group and (padded > budget or padded > 2 * (real + length)):
                break
            real += length
            sequence = self.waiting.popleft()
            sequence.phase = Phase.PREFILL
            sequence.admitted = time.perf_counter()
            self.statistics.request_queue_time.observe(sequence.admitted - sequence.arrived)
            group.append(sequence)
            longest = candidate
        if group:
            self.prefilling, self._prefill_width, self._prefill_done = group, longest, 0

    async def _prefill_chunk(self) -> None:
        group = self.prefilling
        if all(s.gone for s in group):
            self.prefilling = []
            return
        width, start = self._prefill_width, self._prefill_done
        budget = max(1, self.config.max_step_tokens - len(self.running))
        stop = min(width, start + max(1, budget // len(group)))
        if self._prefill is None:
            self._prefill = self.compiled.create_infer_request()
        if start == 0:
            self._prefill.reset_state()
        lengths = [len(s.prompt) for s in group]
        ids = np.zeros((len(group), width), np.int64)
        for row, sequence in enumerate(group):
            ids[row, width - len(sequence.prompt) :] = sequence.prompt
        pads = width - np.asarray(lengths, np.int64)
        columns = np.arange(start, stop)
        config = self.config
        inputs = {config.input_ids: ids[:, start:stop].astype(self._dtypes[config.input_ids])}
        if config.attention_mask is not None:
            mask = attention_mask(lengths, width, self._dtypes[config.attention_mask])
            inputs[config.attention_mask] = mask[:, :stop]
        if config.position_ids is not None:
            positions = np.maximum(columns[None, :] - pads[:, None], 0)
            inputs[config.position_ids] = positions.astype(self._dtypes[config.position_ids])
        self.statistics.iteration_tokens.observe(len(group) * (stop - start))
        results = await self._step(self._prefill, inputs, group)
        if results is None:  # every sequence of the group went away
            self.prefilling = []
            return
        self._prefill_done = stop
        if stop < width:
            return
        self._prompt_tokens += sum(lengths)
        await self._pick(group, last_logits(results[config.logits], config.logits))
        for sequence, length in zip(group, lengths):
            sequence.length = length
        self.prefilling, self.prefilled = [], group

    async def _decode_step(self) -> None:
        rows = self.running
        config = self.config
        lengths = [s.length + 1 for s in rows]
        ids = np.array([[s.next_token] for s in rows], self._dtypes[config.input_ids])
        inputs = {config.input_ids: ids}
        if config.attention_mask is not None:
            dtype = self._dtypes[config.attention_mask]
            inputs[config.attention_mask] = attention_mask(lengths, self._width + 1, dtype)
        if config.position_ids is not None:
            positions = np.array([[s.length] for s in rows], self._dtypes[config.position_ids])
            inputs[config.position_ids] = positions
        assert self._decode is not None
        self.statistics.batch_size.observe(len(rows))
        self.statistics.iteration_tokens.observe(len(rows))
        results = await self._step(self._decode, inputs, rows)
        if results is None:
            return  # everyone left: the rebatch empties the batch
        self._steps += 1
        self._width += 1
        for sequence in rows:
            sequence.length += 1
        await self._pick(rows, last_logits(results[config.logits], config.logits))

    async def _step(
        self, request: AsyncInferRequest, inputs: dict[str, np.ndarray], rows: list[Any]
    ) -> Any:
        """The results of one inference for ``rows`` (None when it was cancelled because
        they all went away); a failed inference fails those rows."""
        self._step_rows = rows
        try:
            with anyio.CancelScope() as scope:
                self._step_scope = scope
                try:
                    return await request.infer(inputs, share_inputs=True)
                except Exception as exc:
                    if request.state is RequestState.CLOSED:
                        raise
                    for sequence in rows:
                        sequence.fail(exc)
                    request.reset_state()
                    return None
            return None
        finally:
            self._step_scope = None
            self._step_rows = []
            if request.state is RequestState.IDLE:
                request.clear_inputs()

    async def _pick(self, rows: Rows[GeneratedSequence], logits: np.ndarray) -> None:
        """Each live row's next token: plain greedy rows here, the others (a softmax over
        the vocabulary each: sampling, penalties, log-probabilities) in a worker
        thread."""
        live = [(row, s) for row, s in enumerate(rows) if not s.gone]
        greedy = np.argmax(logits, axis=-1)
        sampled = [(row, s) for row, s in live if not s.sampling.plain]

        def draw() -> dict[int, Step]:
            return {row: s.picker.choose(logits[row]) for row, s in sampled}

        drawn = await anyio.to_thread.run_sync(draw) if sampled else {}
        for row, sequence in live:
            if sequence.gone:  # withdrawn while the tokens were drawn
                continue
            step = drawn[row] if row in drawn else Step(int(greedy[row]))
            self._generated_tokens += 1
            sequence.push(step)

    async def _rebatch(self) -> None:
        """Rows leave (finished, withdrawn, paused) and join (prefilled, resumed); the
        decode request's variables are repacked when the rows change (the arrays are
        moved in a worker thread: a large cache takes milliseconds to copy)."""
        limit = self.config.max_buffered_tokens
        keep: list[int] = []
        pause: list[tuple[int, GeneratedSequence]] = []
        for row, sequence in enumerate(self.running):
            if sequence.gone:
                sequence.phase = Phase.DONE
            elif len(sequence.buffer) >= limit:
                pause.append((row, sequence))
            else:
                keep.append(row)
        resumed = [s for s in self.paused if len(s.buffer) <= self.resume_below and not s.gone]
        prefilled = self.prefilled
        joining = [row for row, s in enumerate(prefilled) if not s.gone]
        for sequence in prefilled:
            if sequence.gone:
                sequence.phase = Phase.DONE
        if len(keep) == len(self.running) and not resumed and not prefilled:
            return
        rows = [self.running[row] for row in keep]
        rows += [prefilled[row] for row in joining] + resumed
        for _, sequence in pause:
            sequence.phase = Phase.PAUSED
            self.paused.append(sequence)
        for sequence in resumed:
            self.paused.remove(sequence)
        for sequence in rows:
            sequence.phase = Phase.RUNNING
        self.prefilled = []
        self.running = rows
        self._width = max((s.length for s in rows), default=0)
        if not rows and not pause:
            return
        swap = bool(joining) and not keep and not resumed
        if swap:
            # The prefill request's variables hold the new batch: it becomes the decode
            # request, its variables set only when some of its rows left.
            self._decode, self._prefill = self._prefill, self._decode
            source = self._prefill
        else:
            source = self._decode
        if self._decode is None:
            self._decode = self.compiled.create_infer_request()
        target = self._decode
        spare = None if self.prefilling else self._prefill  # not during a chunked prefill

        def move() -> None:
            blocks: list[Block] = []
            if keep or pause:
                assert source is not None
                values = [state.state for state in source.query_state()]
                for row, sequence in pause:
                    sequence.cache = repack(self.axes, [Block(values, [row])], sequence.length)
                if keep:
                    blocks.append(Block(values, keep))
            if joining:
                prefill = self._decode if swap else self._prefill
                assert prefill is not None
                blocks.append(Block([state.state for state in prefill.query_state()], joining))
            for sequence in resumed:
                assert sequence.cache is not None
                blocks.append(Block(sequence.cache, [0]))
                sequence.cache = None
            if not blocks:
                return
            packed = repack(self.axes, blocks, self._width)
            if not (swap and all(p is v for p, v in zip(packed, blocks[0].values))):
                for state, value in zip(target.query_state(), packed):
                    state.state = value
            if spare is not None:
                spare.reset_state()  # holds no cache until the next prefill

        await anyio.to_thread.run_sync(move)

    def _fail_all(self, error: BaseException) -> None:
        everyone = [*self.waiting, *self.prefilling, *self.prefilled, *self.running, *self.paused]
        for sequence in everyone:
            sequence.fail(error if isinstance(error, Exception) else _stopped())
        self.waiting.clear()
        self.prefilling, self.prefilled, self.running, self.paused = [], [], [], []
        self._width = 0


def _event_loop() -> object:
    """The running event loop (asyncio's loop, or trio's token)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        import trio  # the only other backend anyio supports

        return trio.lowlevel.current_trio_token()


def _stopped() -> Exception:
    from aioinfer.errors import GenerationError

    return GenerationError("the generation stopped: its scheduler's event loop ended")


_schedulers: weakref.WeakKeyDictionary[
    CompiledModel, dict[GenerationConfig, GenerationScheduler | None]
] = weakref.WeakKeyDictionary()


def schedulers_of(compiled: CompiledModel) -> list[GenerationScheduler]:
    """The schedulers made so far for ``compiled`` (one per config its generations used)."""
    return [s for s in _schedulers.get(compiled, {}).values() if s is not None]


def scheduler_of(compiled: CompiledModel, config: GenerationConfig) -> GenerationScheduler | None:
    """The scheduler of ``compiled`` for ``config`` (made on first use), or None when its
    generations cannot be batched: ``config.batching`` is off, the decoder has no
    ``attention_mask`` (left padding needs it) or keeps no cache in its request, or a
    cache variable is not ``[batch, ..., sequence, ...]`` with those two dynamic."""
    if not config.batching or config.attention_mask is None:
        return None
    known = _schedulers.setdefault(compiled, {})
    if config not in known:
        known[config] = _make(compiled, config)
    return known[config]


def _make(compiled: CompiledModel, config: GenerationConfig) -> GenerationScheduler | None:
    request = compiled.create_infer_request()
    request.reset_state()
    try:
        initial = [state.state for state in request.query_state()]
    except Exception:  # a variable without an initial value: its layout is unknown
        return None
    axes = sequence_axes(initial) if initial else None
    if axes is None:
        return None
    scheduler = GenerationScheduler(compiled, config, axes)
    scheduler._decode = request
    return scheduler
