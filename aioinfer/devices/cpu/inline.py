"""Where a CPU request's plan runs: a compute thread, or, when it is known to be short,
the event loop's own thread.

The hop to a compute thread and back (two thread wake-ups, and the GIL handed between
the loop and the compute thread around every numpy call) cost 100-150 us per inference
on a loaded 2-core machine, as much as the bundled tiny CNN's whole plan (125-160 us). A
plan holds the GIL for most of such a short run anyway, so a second stream adds little
parallelism; running it inline adds no hop. A run on input shapes whose runs took less
than ``CPU_INLINE_RUN_US`` of their thread's CPU time on average (not wall time, which
a loaded machine stretches) runs inline, whatever else runs: the requests of a queue
would otherwise keep one another on threads. Anything else, and the first run of new
input shapes, goes to the task executor. The executor, and how inline runs share the
loop, are the plugin API's (:mod:`aioinfer.plugin.inline`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aioinfer.plugin.inline import RunTimes
from aioinfer.properties import Property, non_negative_int

CPU_INLINE_RUN_US = Property(
    "CPU_INLINE_RUN_US",
    "CPU device: a plan whose last run on inputs of the same shapes took less than this "
    "many microseconds of CPU time runs on the event loop's thread, saving the hop to a "
    "compute thread (0: never).",
    default=300,
    parse=non_negative_int,
)

WEIGHT = 0.25
"""Weight of the latest run in the running average of run times: one run slowed by the
machine's load does not send the next ones to a thread."""


def cpu_run_times(config: Mapping[str, Any]) -> RunTimes:
    """The run times of a CPU compiled model: CPU seconds, a running average per input
    shapes, inline whatever else runs (see the module)."""
    return RunTimes(int(config["CPU_INLINE_RUN_US"]) / 1e6, weight=WEIGHT)
