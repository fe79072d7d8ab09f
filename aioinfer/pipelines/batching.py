"""Batching by tokens: the texts of concurrent calls share batches of similar lengths.

An encoder's cost grows with the padded tokens of a batch (its size times its longest
text), not with the real ones: mixed lengths batched in arrival order are padded to about
twice what they hold. :class:`TokenBatcher` keeps the texts of every pending call in one
pool and forms each batch around the oldest pending text, adding the pooled texts whose
lengths pad least (neighbours in length order) while the padded tokens stay under a
budget; the rows are split back to their calls. Seeding with the oldest text serves calls
in arrival order: a call's texts of several lengths are done within a few batches of
its turn, and a call arriving while others wait cannot take the next batch before them.

There is no scheduler task: any caller with texts not yet done runs the next batch while
fewer than ``batches_in_flight`` run, so a batch starts as soon as a slot frees, and the
calls that arrived meanwhile are merged into it. A caller whose texts went into others'
batches waits for them. A long text is padded only with texts near its length and is
taken in its turn, so one long text holds the others back by at most one batch.

A caller cancelled while its batch runs cancels that inference; the other calls' texts of
that batch go back to the pool in their place, and another caller runs them.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import anyio

from aioinfer.errors import InvalidPropertyValueError
from aioinfer.text.tokenizer import Encoding

R = TypeVar("R")


@dataclass(frozen=True)
class TokenBatching:
    """How a text pipeline batches the texts of concurrent calls.

    Attributes:
        max_batch_tokens: the most padded tokens (texts times the longest text's tokens)
            in one batch; a single text longer than that runs alone.
        max_batch_size: the most texts in one batch.
        batches_in_flight: how many batches run at once (each on its own infer request
            of the compiled model).
        max_padding: how much padding a batch may add, as a fraction of its real
            tokens: a text is added to a batch only while the batch's padded tokens stay
            within ``(1 + max_padding)`` times its real ones (a text of another length
            waits for a batch of its own).
    """

    max_batch_tokens: int = 4096
    max_batch_size: int = 64
    batches_in_flight: int = 2
    max_padding: float = 0.25

    def __post_init__(self) -> None:
        if not isinstance(self.max_padding, (int, float)) or not self.max_padding >= 0:
            raise InvalidPropertyValueError(
                f"TokenBatching.max_padding: expected a number >= 0, got {self.max_padding!r}"
            )
        for name in ("max_batch_tokens", "max_batch_size", "batches_in_flight"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidPropertyValueError(
                    f"TokenBatching.{name}: expected a positive int, got {value!r}"
                )


@dataclass
class BatchStatistics:
    """What a text pipeline computed since it was loaded.

    Attributes:
        batches: batches run on the device.
        texts: texts (or text pairs) in them.
        tokens: their real tokens.
        padded_tokens: the tokens the device computed (each batch's texts times its
            longest); ``padded_tokens / tokens`` is the padding's overhead.
        batch_sizes: how many batches ran of each number of texts.
    """

    batches: int = 0
    texts: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    batch_sizes: Counter[int] = field(default_factory=Counter)


@dataclass(eq=False)
class _Call:
    remaining: int
    error: BaseException | None = None


@dataclass(eq=False)
class _Item(Generic[R]):
    encoding: Encoding
    call: _Call
    arrival: int
    result: R | None = None


class TokenBatcher(Generic[R]):
    """Runs ``compute`` over batches of the encodings of concurrent :meth:`run` calls.

    ``compute`` takes a batch of encodings and returns one result per encoding, in
    order; it runs as a stage of the caller that formed the batch (cancelling that
    caller cancels it).
    """

    def __init__(
        self,
        compute: Callable[[Sequence[Encoding]], Awaitable[Sequence[R]]],
        batching: TokenBatching,
    ) -> None:
        self._compute = compute
        self.batching = batching
        self.statistics = BatchStatistics()
        self._pending: list[_Item[R]] = []
        self._in_flight = 0
        self._arrivals = itertools.count()
        self._changed: anyio.Event | None = None

    async def run(self, encodings: Sequence[Encoding]) -> list[R]:
        """The results of ``compute`` for ``encodings``, computed in batches shared with
        the concurrent calls.

        Raises:
            Whatever ``compute`` raised for a batch holding one of these encodings.
        """
        call = _Call(len(encodings))
        items = [_Item[R](e, call, next(self._arrivals)) for e in encodings]
        self._pending.extend(items)
        self._notify()
        try:
            while call.remaining and call.error is None:
                if self._pending and self._in_flight < self.batching.batches_in_flight:
                    # around the oldest waiting text, whoever's it is: calls end in
                    # arrival order rather than all together once the pool drains
                    await self._run_batch(self._take_batch(self._pending[0]), call)
                else:
                    await self._wait_for_change()
        finally:
            if call.remaining:
                self._pending = [item for item in self._pending if item.call is not call]
        if call.error is not None:
            raise call.error
        return [item.result for item in items]  # type: ignore[misc]  # all done

    def _take_batch(self, seed: _Item[R]) -> list[_Item[R]]:
        """The batch around ``seed``: pooled items adjacent in length, the one that pads
        least first, within the token, size and padding budgets; removed from the pool."""
        ordered = sorted(self._pending, key=lambda item: (len(item.encoding), item.arrival))
        low = high = ordered.index(seed)
        longest = real = len(seed.encoding)
        settings = self.batching
        slack = 1.0 + settings.max_padding
        while high - low + 1 < settings.max_batch_size:
            count = high - low + 1
            options = []  # (padding added, side, new longest)
            if low > 0:  # shorter: pads itself to the longest
                length = len(ordered[low - 1].encoding)
                options.append((longest - length, -1, longest, length))
            if high + 1 < len(ordered):  # longer: pads every text already in
                length = len(ordered[high + 1].encoding)
                options.append(((length - longest) * count, 1, length, length))
            fitting = [
                option
                for option in options
                if (count + 1) * option[2] <= settings.max_batch_tokens
                and (count + 1) * option[2] <= slack * (real + option[3])
            ]
            if not fitting:
                break
            _, side, longest, length = min(fitting)
            real += length
            if side < 0:
                low -= 1
            else:
                high += 1
        batch = ordered[low : high + 1]
        taken = set(map(id, batch))
        self._pending = [item for item in self._pending if id(item) not in taken]
        return batch

    async def _run_batch(self, batch: list[_Item[R]], call: _Call) -> None:
        self._in_flight += 1
        try:
            results = await self._compute([item.encoding for item in batch])
        except Exception as exc:
            for item in batch:
                item.call.error = exc
        except BaseException:
            # This caller was cancelled: the others' texts go back to the pool.
            others = [item for item in batch if item.call is not call]
            self._pending = sorted(self._pending + others, key=lambda item: item.arrival)
            raise
        else:
            lengths = [len(item.encoding) for item in batch]
            stats = self.statistics
            stats.batches += 1
            stats.texts += len(batch)
            stats.tokens += sum(lengths)
            stats.padded_tokens += len(batch) * max(lengths)
            stats.batch_sizes[len(batch)] += 1
            for item, result in zip(batch, results):
                item.result = result
                item.call.remaining -= 1
        finally:
            self._in_flight -= 1
            self._notify()

    async def _wait_for_change(self) -> None:
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
