"""Prometheus metrics of the server, served in the text format at ``/metrics``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from aioinfer.serving.models import ServedModel

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    """The counters and histograms of one app (a registry of its own, so that several
    apps in one process do not mix their figures)."""

    def __init__(self, models: Callable[[], Iterable[ServedModel]]) -> None:
        self.registry = CollectorRegistry()
        labels = ("model", "version")
        self.requests = Counter(
            "aioinfer_inference_requests",
            "Inference requests received.",
            labels,
            registry=self.registry,
        )
        self.failures = Counter(
            "aioinfer_inference_failures",
            "Inference requests that did not succeed, by reason (bad_request, busy, "
            "cancelled, shutdown, error).",
            (*labels, "reason"),
            registry=self.registry,
        )
        self.latency = Histogram(
            "aioinfer_request_duration_seconds",
            "Time from receiving an inference request to having its response ready.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue_time = Histogram(
            "aioinfer_queue_duration_seconds",
            "Time an inference waited before computing (for a free request, then for its batch).",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "aioinfer_inference_requests_in_flight",
            "Inference requests being handled.",
            labels,
            registry=self.registry,
        )
        self.registry.register(_BatchSizes(models))
        self._bound: dict[tuple[str, str], ModelMetrics] = {}

    def of(self, model: ServedModel) -> ModelMetrics:
        """The metrics of one served model (label lookups done once)."""
        key = (model.name, model.version)
        found = self._bound.get(key)
        if found is None:
            found = self._bound[key] = ModelMetrics(
                self.requests.labels(*key),
                self.latency.labels(*key),
                self.queue_time.labels(*key),
                self.in_flight.labels(*key),
                lambda reason: self.failures.labels(*key, reason).inc(),
            )
        return found

    def render(self) -> bytes:
        """The metrics in the Prometheus text format."""
        return generate_latest(self.registry)


@dataclass(frozen=True)
class ModelMetrics:
    """The metrics of one model version, bound to its labels."""

    requests: Counter
    latency: Histogram
    queue_time: Histogram
    in_flight: Gauge
    fail: Callable[[str], None]
    """Count one failure with the given reason."""


class _BatchSizes(Collector):
    """``aioinfer_batch_size``: rows per execution on the device, read at scrape time."""

    def __init__(self, models: Callable[[], Iterable[ServedModel]]) -> None:
        self._models = models

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "aioinfer_batch_size",
            "Rows per execution on the device (BATCH: per batch; else per inference).",
            labels=("model", "version"),
        )
        for model in self._models():
            sizes = model.batch_sizes()
            buckets = [
                (str(bound), sum(n for rows, n in sizes.items() if rows <= bound))
                for bound in BATCH_BUCKETS
            ]
            buckets.append(("+Inf", sum(sizes.values())))
            rows = sum(rows * n for rows, n in sizes.items())
            family.add_metric([model.name, model.version], buckets, rows)
        yield family
