"""PERF_COUNT on the ORT device: node timings of each run, from onnxruntime's profiler.

onnxruntime profiles a whole session and hands the events over once, as a JSON file,
when ``end_profiling()`` is called; after that the session records nothing more. So
:class:`SessionProfiler` keeps one profiling session at a time and reads its events
only when someone asks for the timings of a run (``get_profiling_info()``):

- each run records its thread (runs execute their nodes on the calling thread) and its
  start and end time; a node event of that thread between them belongs to that run;
- to read the events, the profiler retires the current session (runs that start from
  then on create a new one, on their compute thread), waits until the runs still
  computing on the retired session have finished, ends its profiling and hands every
  run recorded on it its node timings.

So reading timings costs a session creation for the next run, and runs are only
profiled while PERF_COUNT is on: off, the device uses a plain session and records
nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import onnxruntime as ort

from aioinfer.plugin.profiling import NodeProfile, NodeTiming


class RunRecord:
    """One profiled run: where and when it ran, and (once read) its node timings."""

    __slots__ = ("__weakref__", "end_ns", "start_ns", "thread", "timings")

    def __init__(self, thread: int, start_ns: int, end_ns: int) -> None:
        self.thread = thread
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.timings: list[NodeTiming] | None = None
        """None until the session's profile was read."""


class _Generation:
    """One profiling session and the runs recorded on it."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session
        self.running = 0
        self.records: weakref.WeakSet[RunRecord] = weakref.WeakSet()


class SessionProfiler:
    """Runs inferences on a profiling session and reads their node timings on demand.

    ``create`` makes a new profiling session (its profile goes to this profiler's
    directory, removed by :meth:`close`).
    """

    def __init__(self, create: Callable[[], ort.InferenceSession], directory: str) -> None:
        self._create = create
        self.directory = directory
        self._lock = threading.Condition()
        self._read_lock = threading.Lock()
        self._create_lock = threading.Lock()
        self._current: _Generation | None = _Generation(create())

    @property
    def session(self) -> ort.InferenceSession:
        """The profiling session runs start on now (created if none is)."""
        return self._begin(count=False).session

    def _begin(self, count: bool = True) -> _Generation:
        while True:
            with self._lock:
                if self._current is not None:
                    self._current.running += count
                    return self._current
            # Created outside the lock: runs on the retired session finish meanwhile.
            with self._create_lock:
                if self._current is None:
                    generation = _Generation(self._create())
                    with self._lock:
                        self._current = self._current or generation

    def run(
        self,
        output_names: Sequence[str],
        feed: dict[str, Any],
        options: ort.RunOptions,
        profile: RunProfile,
    ) -> list[Any]:
        """``session.run`` on the current profiling session, recorded for ``profile``."""
        generation = self._begin()
        start = time.time_ns()
        try:
            return generation.session.run(output_names, feed, options)
        finally:
            record = RunRecord(threading.get_native_id(), start, time.time_ns())
            profile.record = record
            with self._lock:
                generation.records.add(record)
                generation.running -= 1
                self._lock.notify_all()

    def resolve(self, record: RunRecord) -> list[NodeTiming]:
        """The node timings of ``record``'s run (reads the profile when needed: waits
        for the runs computing on the current session)."""
        with self._read_lock:
            if record.timings is None:
                self._read_current()
        return record.timings or []

    def _read_current(self) -> None:
        with self._lock:
            generation, self._current = self._current, None
            if generation is None:
                return
            while generation.running:
                self._lock.wait()
        start_ns = generation.session.get_profiling_start_time_ns()
        path = generation.session.end_profiling()
        try:
            with open(path, encoding="utf-8") as file:
                events = json.load(file)
        finally:
            with contextlib.suppress(OSError):
                os.remove(path)
        nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
        for record in list(generation.records):
            record.timings = [
                _timing(event)
                for event in nodes
                if event["tid"] == record.thread
                and record.start_ns <= start_ns + event["ts"] * 1000 <= record.end_ns
            ]

    def close(self) -> None:
        """End profiling and remove the profile directory."""
        with self._lock:
            generation, self._current = self._current, None
        if generation is not None:
            with contextlib.suppress(Exception):  # a failed end leaves nothing to clean
                generation.session.end_profiling()
        shutil.rmtree(self.directory, ignore_errors=True)


def _timing(event: dict[str, Any]) -> NodeTiming:
    args = event.get("args", {})
    op_type = str(args.get("op_name", ""))
    name = event["name"][: -len("_kernel_time")] or f"{op_type}_{args.get('node_index', '')}"
    return NodeTiming(name, op_type, "native", event["dur"] / 1e6)


def profile_directory() -> str:
    """A new private directory for a session's profile files."""
    return tempfile.mkdtemp(prefix="aioinfer-ort-profile-")


class RunProfile(NodeProfile):
    """A request's node timings, read from the session profile when first asked for."""

    __slots__ = ("_timings", "profiler", "record")

    def __init__(self, profiler: SessionProfiler) -> None:
        self.profiler = profiler
        self.record: RunRecord | None = None
        super().__init__()

    @property
    def timings(self) -> list[NodeTiming]:
        """The node timings of the request's last run ([] before the first)."""
        if self.record is None:
            return self._timings
        return self.profiler.resolve(self.record)

    @timings.setter
    def timings(self, value: list[NodeTiming]) -> None:
        self._timings = value
        self.record = None
