"""When an OPENVINO inference runs inline: OpenVINO's synchronous ``infer()`` on the
event loop's thread, with no hop through the waiter thread and the loop's wake-up.

Measured on a 2-core AMD EPYC (LATENCY hint, medians of alternating rounds): on the tiny
CNN, OpenVINO's ``infer()`` takes 43 µs, its ``start_async()`` + ``wait()`` 48 µs, 59
with a Python callback set, and the awaited path (a thread woken, the loop woken
thread-safely, the task resumed) adds 30-60 µs to that. But ``infer()``
computes on the calling thread, outside OpenVINO's stream threads, and was 1.2-2x slower
than ``start_async()`` on the small CNN and the LSTM (0.3 ms models).

So with one stream (the LATENCY hint: inferences of a compiled model run one at a time
anyway), inputs of given shapes are first awaited; when OpenVINO's time for that
(``InferRequest.latency``) was below ``OPENVINO_INLINE_RUN_US``, the next ones run
inline while no other inference of the compiled model is in flight: the loop is held
for about the budget at most (the GIL is released meanwhile), and no parallelism is
lost. Inline means ``infer()`` while its time stays below the awaited time plus
:data:`AWAIT_COST`, else ``start_async()`` + a blocking ``wait()`` (a slower ``infer()``
is tried again later: see :meth:`InlineRuns.method`).
"""

from __future__ import annotations

MAX_SHAPES = 64
"""Input shapes whose times are remembered (beyond: forgotten, measured again)."""
AWAIT_COST = 30e-6
"""Seconds the awaited path adds to OpenVINO's own time at the least (see the module)."""
RETRY_DECAY = 0.9
"""How an inline time that lost shrinks at each awaited inference instead."""


class InlineRuns:
    """A compiled model's inference times per input shapes (awaited: OpenVINO's own
    measure; ``infer()``: the call's) and its inferences in flight on OpenVINO's threads
    (changed on the event loop's thread only)."""

    __slots__ = ("awaited", "budget", "in_flight", "inline")

    def __init__(self, budget_seconds: float) -> None:
        self.budget = budget_seconds
        self.awaited: dict[tuple[object, ...], float] = {}
        self.inline: dict[tuple[object, ...], float] = {}
        self.in_flight = 0

    def record(self, shapes: tuple[object, ...], seconds: float, inline: bool) -> None:
        """Note how long an inference on inputs of ``shapes`` took: awaited (OpenVINO's
        measure) or by ``infer()``."""
        table = self.inline if inline else self.awaited
        if len(table) >= MAX_SHAPES and shapes not in table:
            table.clear()
        table[shapes] = seconds

    def last(self, shapes: tuple[object, ...]) -> float | None:
        """OpenVINO's time for the last awaited inference on ``shapes`` (None: none yet)."""
        return self.awaited.get(shapes)

    def short(self, shapes: tuple[object, ...]) -> bool:
        """Whether an inference on ``shapes`` runs inline now."""
        if self.in_flight or not self.budget:
            return False
        awaited = self.awaited.get(shapes)
        return awaited is not None and awaited < self.budget

    def method(self, shapes: tuple[object, ...]) -> bool:
        """For an inline inference on ``shapes``: True for ``infer()``, False for
        ``start_async()`` + ``wait()``."""
        inline = self.inline.get(shapes)
        if inline is None or inline < self.awaited.get(shapes, 0.0) + AWAIT_COST:
            return True
        # A slower infer() (its first call on the loop's thread is, by milliseconds) is
        # tried again once its time has decayed, after a few dozen inferences.
        self.inline[shapes] = inline * RETRY_DECAY
        return False
