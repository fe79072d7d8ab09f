"""The ORT device's own properties (the shared ones are in :mod:`aioinfer.properties`)."""

from __future__ import annotations

import sys
from typing import Any

from aioinfer.properties import Property, integer, non_negative_int, yes_no


def _names(value: Any) -> tuple[str, ...]:
    """A non-empty list of names, or one string of comma-separated names."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"expected a list of names, not {type(value).__name__}")
    names = tuple(str(item).strip() for item in items)
    if not names or not all(names):
        raise ValueError("expected a non-empty list of non-empty names")
    return names


def _nice(value: Any) -> int:
    """0 to 19, on Linux (elsewhere priorities are per process, not per thread)."""
    number = integer(value)
    if not 0 <= number <= 19:
        raise ValueError("expected an integer from 0 (off) to 19")
    if number and not sys.platform.startswith("linux"):
        raise ValueError("thread priorities need Linux (per-thread nice values)")
    return number


ORT_PROVIDERS = Property(
    "ORT_PROVIDERS",
    "ORT device: onnxruntime execution providers, in order of preference (a list or "
    "a comma-separated string). Read back: the providers the session uses.",
    default=("CPUExecutionProvider",),
    parse=_names,
)
ORT_ALLOW_SPINNING = Property(
    "ORT_ALLOW_SPINNING",
    "ORT device: onnxruntime's idle intra-op threads spin for up to 200 us before they "
    "sleep, so that the parallel sections of a run and back-to-back runs find them "
    "awake (on by default; onnxruntime's own default spins for milliseconds after the "
    "last run, holding cores the event loop needs). Off: they sleep after every "
    "parallel section, and waking them for the next costs a run of many kernels much "
    "of its speed on a virtual machine.",
    default=True,
    parse=yes_no,
    mutable=True,
)
ORT_CPU_MEM_ARENA = Property(
    "ORT_CPU_MEM_ARENA",
    "ORT device: onnxruntime keeps the memory of a run's intermediate tensors in its "
    "CPU arena for the next runs (on by default). Off: each run allocates them and "
    "gives them back, so that the process's resident memory falls back after every run "
    "(what a server under a memory budget needs); it costs a model of microseconds per "
    "run up to twice its time, a model of milliseconds nothing measurable "
    "(docs/benchmarks.md, Many models).",
    default=True,
    parse=yes_no,
)
ORT_INLINE_RUN_US = Property(
    "ORT_INLINE_RUN_US",
    "ORT device with one stream: a run whose last run on inputs of the same shapes "
    "took less than this many microseconds runs on the event loop's thread when no "
    "other run is in flight, saving the hop to a compute thread (0: never).",
    default=500,
    parse=non_negative_int,
    mutable=True,
)
ORT_THREAD_NICE = Property(
    "ORT_THREAD_NICE",
    "ORT device: lower the scheduling priority (Linux nice value, 0-19) of the compute "
    "threads (the task executor's and onnxruntime's intra-op pool) by this much, so "
    "that the event loop's thread gets a core first when the cores are oversubscribed "
    "(0: off, the default: they then also yield to every other process).",
    default=0,
    parse=_nice,
    mutable=True,
)
