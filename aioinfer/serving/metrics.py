"""Prometheus metrics of the server, served in the text format at ``/metrics``.

The hot path only adds to plain counters (no locks, no label lookups: everything runs on
the event loop's thread); the Prometheus families are built from them at scrape time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from aioinfer.errors import DeviceUnavailableError, ErrorKind
from aioinfer.generation.scheduler import schedulers_of
from aioinfer.histogram import Histogram
from aioinfer.serving.models import ServedModel

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LOAD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120)

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


class ModelLoadMetrics:
    """The loads and unloads of one model (all its versions) since the app started: the
    model manager's figures (:mod:`aioinfer.serving.manager`)."""

    __slots__ = (
        "bytes",
        "evictions",
        "failed_loads",
        "hits",
        "inference_bytes",
        "load_time",
        "loads",
        "misses",
        "unloads",
    )

    def __init__(self) -> None:
        self.bytes = 0
        """What the model holds now (0: not loaded)."""
        self.inference_bytes = 0
        """What its warm-up inference at load allocated on top (0: not measured)."""
        self.loads = 0
        """Loads that succeeded."""
        self.failed_loads = 0
        """Loads that failed (or were refused by the memory budget)."""
        self.unloads = 0
        """Unloads, whatever the cause (evictions, idle unloads, an operator's)."""
        self.evictions = 0
        """Unloads to make room for another model under the memory budget."""
        self.hits = 0
        """Requests that found the model loaded."""
        self.misses = 0
        """Requests that waited for the model's load."""
        self.load_time = Histogram(LOAD_BUCKETS)
        """Seconds each successful load took (the evictions it needed included)."""


class ServerMetrics:
    """The metrics of one app (a registry of its own, so that several apps in one process
    do not mix their figures)."""

    def __init__(self, models: Callable[[], Iterable[ServedModel]]) -> None:
        self._models = models
        self._of: dict[tuple[str, str], ModelMetrics] = {}
        self._loads: dict[str, ModelLoadMetrics] = {}
        self.memory_budget: int | None = None
        """The model manager's budget (bytes; None: none)."""
        self.registry = CollectorRegistry()
        self.registry.register(_Collector(self))

    def of(self, model: ServedModel) -> ModelMetrics:
        """The metrics of one served model version."""
        key = (model.name, model.version)
        found = self._of.get(key)
        if found is None:
            found = self._of[key] = ModelMetrics()
        return found

    def figures_of(self, model: ServedModel) -> ModelMetrics | None:
        """The metrics of one served model version, None before its first request."""
        return self._of.get((model.name, model.version))

    def figures(self) -> Iterator[tuple[tuple[str, str], ModelMetrics]]:
        """((model, version), metrics) of every model version that received requests."""
        yield from self._of.items()

    def loads_of(self, name: str) -> ModelLoadMetrics:
        """The load figures of model ``name``."""
        found = self._loads.get(name)
        if found is None:
            found = self._loads[name] = ModelLoadMetrics()
        return found

    def load_figures(self) -> Iterator[tuple[str, ModelLoadMetrics]]:
        """(model, load figures) of every model the manager saw."""
        yield from self._loads.items()

    def clear_memory(self) -> None:
        """Every model unloaded (the service closed them): none holds memory."""
        for figures in self._loads.values():
            figures.bytes = 0

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
        yield from self._generation()
        yield from self._model_loads()

    def _model_loads(self) -> Iterator[Metric]:
        """The model manager's figures: memory per model, loads, unloads, evictions,
        hits and misses, load time."""
        labels = ["model"]
        memory = GaugeMetricFamily(
            "aioinfer_model_memory_bytes",
            "Memory a loaded model holds (measured at its load; 0: not loaded).",
            labels=labels,
        )
        inference = GaugeMetricFamily(
            "aioinfer_model_inference_memory_bytes",
            "Memory the warm-up inference at a model's load allocated on top of the model "
            "(under a memory budget; 0: not measured).",
            labels=labels,
        )
        counters = {
            name: CounterMetricFamily(f"aioinfer_model_{name}", text, labels=labels)
            for name, text in LOAD_COUNTERS.items()
        }
        load_time = HistogramMetricFamily(
            "aioinfer_model_load_duration_seconds",
            "Time a model's load took (the unloads it needed included).",
            labels=labels,
        )
        for name, figures in sorted(self._metrics.load_figures()):
            memory.add_metric([name], figures.bytes)
            inference.add_metric([name], figures.inference_bytes)
            for attribute, family in counters.items():
                family.add_metric([name], getattr(figures, attribute))
            load_time.add_metric([name], figures.load_time.cumulative(), figures.load_time.sum)
        yield from (memory, inference, *counters.values(), load_time)
        if self._metrics.memory_budget is not None:
            budget = GaugeMetricFamily(
                "aioinfer_memory_budget_bytes", "The memory the loaded models may hold."
            )
            budget.add_metric([], self._metrics.memory_budget)
            yield budget

    def _generation(self) -> Iterator[Metric]:
        """The generation schedulers' figures, named as vLLM names them (``aioinfer:``
        for ``vllm:``)."""
        labels = ("model", "version")
        running = GaugeMetricFamily(
            "aioinfer:num_requests_running",
            "Generations with a place in the running batch (prefilling and paused included).",
            labels=labels,
        )
        waiting = GaugeMetricFamily(
            "aioinfer:num_requests_waiting", "Generations waiting for a place.", labels=labels
        )
        prompt = CounterMetricFamily(
            "aioinfer:prompt_tokens", "Prompt tokens prefilled.", labels=labels
        )
        generated = CounterMetricFamily(
            "aioinfer:generation_tokens", "Tokens generated.", labels=labels
        )
        histograms = {
            name: HistogramMetricFamily(f"aioinfer:{name}", text, labels=labels)
            for name, text in GENERATION_HISTOGRAMS.items()
        }
        for model in self._metrics.models():
            schedulers = schedulers_of(model.compiled)
            if not schedulers:
                continue
            key = [model.name, model.version]
            counts = [s.counts() for s in schedulers]
            running.add_metric(key, sum(c.running for c in counts))
            waiting.add_metric(key, sum(c.waiting for c in counts))
            prompt.add_metric(key, sum(c.prompt_tokens for c in counts))
            generated.add_metric(key, sum(c.generated_tokens for c in counts))
            for name, family in histograms.items():
                attribute = name.removesuffix("_seconds")
                merged = _merged([getattr(s.statistics, attribute) for s in schedulers])
                family.add_metric(key, merged.cumulative(), merged.sum)
        yield from (running, waiting, prompt, generated, *histograms.values())

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


LOAD_COUNTERS = {
    "loads": "Loads of a model that succeeded.",
    "failed_loads": "Loads of a model that failed or that the memory budget refused.",
    "unloads": "Unloads of a model (evictions, idle unloads, an operator's).",
    "evictions": "Unloads of a model to make room for another under the memory budget.",
    "hits": "Inference requests that found their model loaded.",
    "misses": "Inference requests that waited for their model's load.",
}
"""The model manager's counters (``aioinfer_model_`` + name, ``_total`` in the text
format) and their help."""


GENERATION_HISTOGRAMS = {
    "time_to_first_token_seconds": "Time from a generation's arrival to its first token.",
    "inter_token_latency_seconds": "Time between a generation's consecutive tokens.",
    "e2e_request_latency_seconds": "Time from a generation's arrival to its end.",
    "request_queue_time_seconds": "Time a generation waited for a place.",
    "request_prefill_time_seconds": "Time from a generation's prefill start to its first token.",
    "request_decode_time_seconds": "Time from a generation's first token to its end.",
    "batch_size": "Rows per decode step of a generation scheduler.",
    "iteration_tokens": "Tokens per step of a generation scheduler (decode rows and prefill).",
}
"""The generation histograms (``aioinfer:`` + name) and their help."""


def _merged(histograms: list[Histogram]) -> Histogram:
    if len(histograms) == 1:
        return histograms[0]
    merged = Histogram(histograms[0].bounds)
    for histogram in histograms:
        merged.counts = [a + b for a, b in zip(merged.counts, histogram.counts)]
        merged.sum += histogram.sum
    return merged
