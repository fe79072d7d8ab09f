"""Profiling: per-node timings of one inference, next to the per-stage durations.

With the ``PERF_COUNT`` property on, a device records one :class:`NodeTiming` per
executed node of the last inference; ``request.get_profiling_info()`` then lists them
after the stage entries. With it off (the default) nothing is recorded: the device runs
its ordinary loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

EXECUTION_TYPES = ("native", "fused", "fallback")
"""How a node ran: a native kernel, a kernel of a fused node (one node standing for
several of the original graph), or the onnx reference implementation (slow path)."""


@dataclass(frozen=True)
class NodeTiming:
    """How long one node of the executed graph took."""

    name: str
    op_type: str
    execution_type: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """The entry ``get_profiling_info`` returns for this node."""
        return {
            "name": self.name,
            "type": "node",
            "op_type": self.op_type,
            "execution_type": self.execution_type,
            "seconds": self.seconds,
        }


class NodeProfile:
    """Collects the node timings of one inference (a device fills it while it runs)."""

    __slots__ = ("timings",)

    def __init__(self) -> None:
        self.timings: list[NodeTiming] = []

    def add(self, name: str, op_type: str, execution_type: str, seconds: float) -> None:
        """Record one executed node."""
        self.timings.append(NodeTiming(name, op_type, execution_type, seconds))


def profiling_info(
    stages: Sequence[str], durations: Mapping[str, float], nodes: Iterable[NodeTiming] = ()
) -> list[dict[str, Any]]:
    """The entries of ``get_profiling_info``: one per stage that ran (``"type": "stage"``),
    in pipeline order, then one per node (``"type": "node"``, with ``op_type`` and
    ``execution_type``), in execution order. Durations are in seconds."""
    entries = [
        {"name": name, "type": "stage", "seconds": durations[name]}
        for name in stages
        if name in durations
    ]
    entries += [timing.to_dict() for timing in nodes]
    return entries
