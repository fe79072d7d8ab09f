"""Short runs on one intra-op thread.

With one stream (the LATENCY hint) a session gets every core as intra-op threads, and
splits each kernel between them. On a short run that can cost more than it saves: the
other threads must be woken for the run (and for each kernel with spinning off), and
the kernels of a small model are too small to split well. On 2 cores of an AMD EPYC the
bundled tiny CNN ran in 22 us on a one-thread session against 29-31 us on a two-thread
one, a small LSTM in 144 against 167-173 us; a 64x64 CNN was 10-15% faster on two.

So a compiled model with several intra-op threads per stream keeps a second, one-thread
session for runs shorter than ``ORT_SINGLE_THREAD_RUN_US``, made on a thread of its own
(never on the event loop) the first time a run is that short, and used for the input
shapes on which it measures faster: per input shapes, a running average of the run
time on each session (one that rises slowly: a run stretched by the machine's load
barely moves it); a run goes to the faster one, and one run in
:data:`RETRY_EVERY` to the other, so that a measurement a burst of load spoiled does not
decide for good. The two sessions compute the same graph; a
model whose serialized size is above :data:`MAX_MODEL_BYTES` never gets the second one
(its weights would be held twice).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import Any

import onnxruntime as ort

from aioinfer.plugin.inline import RunTimes
from aioinfer.properties import Property, non_negative_int

ORT_SINGLE_THREAD_RUN_US = Property(
    "ORT_SINGLE_THREAD_RUN_US",
    "ORT device with one stream and several intra-op threads: inferences whose runs "
    "take less than this many microseconds may run on a second session with one "
    "intra-op thread, for the input shapes on which it measures faster (waking the "
    "other threads costs a short run more than they save); 0: never.",
    default=500,
    parse=non_negative_int,
)

MAX_MODEL_BYTES = 32 << 20
"""A model larger than this (serialized) keeps one session: the second would hold its
weights again."""

WEIGHT = 0.25
"""Weight of the latest run in the running averages, when it is faster than the average."""

RISE_WEIGHT = 0.05
"""Weight of a run slower than the average (counted for at most twice the average): on a
loaded machine a run stretched by a lost time slice is common, more so on the session
that needs every core, and with one weight for both directions the averages swung with
it. Measured on the 2-core Xeon under a load average of 6: openWakeWord's mel
spectrogram (108 us on two threads, 148 on one) went to the one-thread session for 45% of
its runs, the averages trading places every few hundred runs."""

RETRY_EVERY = 50
"""One run in this many (per input shapes) goes to the slower session, to measure it
again."""

MAX_SHAPES = 64
"""Input shapes whose run counts are remembered (the averages forget as
:class:`~aioinfer.plugin.inline.RunTimes` does)."""


class SingleThreadRuns:
    """The one-thread session of a compiled model and which session each input shapes
    run on (see the module). Used from any thread; the dictionaries change under the
    GIL only, and the session is made once."""

    def __init__(self, limit_seconds: float, make: Callable[[], ort.InferenceSession]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._started = False
        self._thread: threading.Thread | None = None
        self.session: ort.InferenceSession | None = None
        """The one-thread session, once made."""
        self.failed: BaseException | None = None
        """Why the session could not be made (then every run stays on the other)."""
        self.wide = RunTimes(limit_seconds, weight=WEIGHT, rise_weight=RISE_WEIGHT)
        """Per input shapes, the average run time on the compiled model's session."""
        self.single = RunTimes(limit_seconds, weight=WEIGHT, rise_weight=RISE_WEIGHT)
        """The same on the one-thread session."""
        self.runs: dict[Any, int] = {}
        """Per input shapes, the runs decided on both averages."""

    def use_single(self, shapes: Any) -> bool:
        """Whether the next run on ``shapes`` goes to the one-thread session."""
        wide = self.wide.seconds.get(shapes)
        if wide is None or wide >= self.wide.budget:  # not measured yet, or long
            return False
        if self.session is None:
            self._start()
            return False
        single = self.single.seconds.get(shapes)
        if single is None:
            return True  # measure it
        if len(self.runs) >= MAX_SHAPES and shapes not in self.runs:
            self.runs.clear()
        runs = self.runs[shapes] = self.runs.get(shapes, 0) + 1
        return (single <= wide) != (runs % RETRY_EVERY == 0)

    def record(self, shapes: Any, seconds: float, single: bool) -> None:
        """Note the time of a run on ``shapes`` on the one-thread session (``single``)
        or the other."""
        (self.single if single else self.wide).record(shapes, seconds)

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
            thread = threading.Thread(target=self._build, name="aioinfer-ort-single", daemon=True)
            self._thread = thread
            _building.add(thread)
        thread.start()

    def _build(self) -> None:
        try:
            self.session = self._make()
        except Exception as exc:  # the compiled model's session loaded the same model
            self.failed = exc
        finally:
            _building.discard(threading.current_thread())

    def join(self) -> None:
        """Wait until the session being made (if any) is made. Blocks: run it on a
        thread from async code."""
        thread = self._thread
        if thread is not None:
            thread.join()


_building: set[threading.Thread] = set()
"""Threads making a one-thread session now."""


@atexit.register
def _join_builders() -> None:
    """At exit, wait for the sessions being made: onnxruntime aborts the process
    ("terminate called without an active exception") when the interpreter ends while a
    daemon thread is inside its session constructor."""
    for thread in list(_building):
        thread.join()
