"""A fixed-bucket histogram for Prometheus: counted on the hot path, rendered at scrape
time (the serving metrics and the generation scheduler's timings)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence


class Histogram:
    """Observations counted into fixed buckets (upper bounds, inclusive), and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        """Observations per bucket; the last one is above every bound."""
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count one observation."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, float]]:
        """The Prometheus buckets: (upper bound, observations at or below it)."""
        buckets, total = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts):
            total += count
            buckets.append((bound, float(total)))
        return buckets
