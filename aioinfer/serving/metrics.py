"""Prometheus metrics of the server, served in the text format at ``/metrics``.

The hot path only adds to plain counters (no locks, no label lookups: everything runs on
the event loop's thread); the Prometheus families are built from them at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from aioinfer.errors import DeviceUnavailableError, ErrorKind
from aioinfer.serving.models import ServedModel

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

FAILURE_REASONS = {
    ErrorKind.INVALID_ARGUMENT: "bad_request",
    ErrorKind.NOT_FOUND: "bad_request",
    ErrorKind.TOO_LARGE: "bad_request",
    ErrorKind.UNSUPPORTED_MEDIA: "bad_request",
    ErrorKind.UNAUTHENTICATED: "bad_request",
    ErrorKind.UNAVAILABLE: "busy",
    ErrorKind.RESOURCE_EXHAUSTED: "busy",
    ErrorKind.CANCELLED: "cancelled",
    ErrorKind.ABORTED: "shutdown",
    ErrorKind.INTERNAL: "error",
}
"""The ``reason`` label of ``aioinfer_inference_failures`` for each kind of error."""


def failure_reason(kind: ErrorKind, error: BaseException | None = None) -> str:
    """The ``reason`` label for a failure of ``kind``: ``unavailable`` when ``error`` is (or
    was caused by) a :class:`~aioinfer.errors.DeviceUnavailableError` (the device
    recovers), else that of :data:`FAILURE_REASONS`."""
    for cause in (error, getattr(error, "__cause__", None)):
        if isinstance(cause, DeviceUnavailableError):
            return "unavailable"
    return FAILURE_REASONS[kind]


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


class ModelMetrics:
    """The figures of one model version since the app started."""

    __slots__ = (
        "compute_infer",
        "compute_input",
        "compute_output",
        "failed_seconds",
        "failures",
        "in_flight",
        "last_inference",
        "latency",
        "queue_time",
        "requests",
    )

    def __init__(self) -> None:
        self.requests = 0
        """Inference requests received."""
        self.failures: Counter[str] = Counter()
        """Requests that did not succeed, by reason."""
        self.in_flight = 0
        """Requests being handled now."""
        self.latency = Histogram(LATENCY_BUCKETS)
        """Seconds from receiving a request to having its response ready."""
        self.queue_time = Histogram(LATENCY_BUCKETS)
        """Seconds a request waited before computing."""
        self.compute_input = 0.0
        """Seconds answered requests spent before their inference (reading, decoding)."""
        self.compute_infer = 0.0
        """Seconds answered requests spent computing (their inference, less its wait)."""
        self.compute_output = 0.0
        """Seconds answered requests spent after their inference (encoding)."""
        self.failed_seconds = 0.0
        """Seconds failed requests took, from arrival to failure."""
        self.last_inference = 0.0
        """When the last request ended (``time.perf_counter()``, cheaper on the hot path
        than the wall clock; 0: none yet)."""

    def fail(self, reason: str) -> None:
        """Count one failure with the given reason."""
        self.failures[reason] += 1


class ServerMetrics:
    """The metrics of one app (a registry of its own, so that several apps in one process
    do not mix their figures)."""

    def __init__(self, models: Callable[[], Iterable[ServedModel]]) -> None:
        self._models = models
        self._of: dict[tuple[str, str], ModelMetrics] = {}
        self.registry = CollectorRegistry()
        self.registry.register(_Collector(self))

    def of(self, model: ServedModel) -> ModelMetrics:
        """The metrics of one served model version."""
        key = (model.name, model.version)
        found = self._of.get(key)
        if found is None:
            found = self._of[key] = ModelMetrics()
        return found

    def figures(self) -> Iterator[tuple[tuple[str, str], ModelMetrics]]:
        """((model, version), metrics) of every model version that received requests."""
        yield from self._of.items()

    def models(self) -> Iterable[ServedModel]:
        """The served models (for the figures read from the models at scrape time)."""
        return self._models()

    def render(self) -> bytes:
        """The metrics in the Prometheus text format."""
        return generate_latest(self.registry)


class _Collector(Collector):
    """Builds the Prometheus families from the counters at scrape time."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "version"]
        requests = CounterMetricFamily(
            "aioinfer_inference_requests", "Inference requests received.", labels=labels
        )
        failures = CounterMetricFamily(
            "aioinfer_inference_failures",
            "Inference requests that did not succeed, by reason (bad_request: the "
            "client's error, 4xx; busy; cancelled; shutdown; unavailable: the device is "
            "recovering, 503, retryable; error: a fault of the server, 500).",
            labels=[*labels, "reason"],
        )
        latency = HistogramMetricFamily(
            "aioinfer_request_duration_seconds",
            "Time from receiving an inference request to having its response ready.",
            labels=labels,
        )
        queue_time = HistogramMetricFamily(
            "aioinfer_queue_duration_seconds",
            "Time an inference waited before computing (for a free request, then for its batch).",
            labels=labels,
        )
        in_flight = GaugeMetricFamily(
            "aioinfer_inference_requests_in_flight",
            "Inference requests being handled.",
            labels=labels,
        )
        for (name, version), figures in self._metrics.figures():
            key = [name, version]
            requests.add_metric(key, figures.requests)
            for reason, count in sorted(figures.failures.items()):
                failures.add_metric([*key, reason], count)
            latency.add_metric(key, figures.latency.cumulative(), figures.latency.sum)
            queue_time.add_metric(key, figures.queue_time.cumulative(), figures.queue_time.sum)
            in_flight.add_metric(key, figures.in_flight)
        yield from (requests, failures, latency, queue_time, in_flight)
        yield self._batch_sizes()

    def _batch_sizes(self) -> Metric:
        """``aioinfer_batch_size``: rows per execution on the device."""
        family = HistogramMetricFamily(
            "aioinfer_batch_size",
            "Rows per execution on the device (BATCH: per batch; else per inference).",
            labels=("model", "version"),
        )
        for model in self._metrics.models():
            sizes = model.batch_sizes()
            buckets = [
                (str(bound), sum(n for rows, n in sizes.items() if rows <= bound))
                for bound in BATCH_BUCKETS
            ]
            buckets.append(("+Inf", sum(sizes.values())))
            rows = sum(rows * n for rows, n in sizes.items())
            family.add_metric([model.name, model.version], buckets, rows)
        return family
