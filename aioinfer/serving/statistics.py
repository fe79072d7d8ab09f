"""Per model version statistics in the shape of Triton's statistics extension.

The counters are the ones the Prometheus metrics read (:class:`ModelMetrics`, kept on
the event loop's thread by :class:`~aioinfer.serving.service.InferCall`); this module
only turns them into ``{"model_stats": [...]}`` as ``GET /v2/models[/{m}[/versions/{v}]]
/stats`` answers and tritonclient's ``get_inference_statistics`` parses. The phases of
an answered request map onto Triton's as: ``queue`` the wait for a free slot, request
and batch; ``compute_input`` from arrival to the start of the inference (reading and
decoding the request); ``compute_infer`` the inference less its wait; ``compute_output``
from its end to the response (encoding).
"""

from __future__ import annotations

import time
from typing import Any

from aioinfer.serving.metrics import ModelMetrics
from aioinfer.serving.models import ServedModel


def _duration(count: int, seconds: float) -> dict[str, int]:
    return {"count": count, "ns": int(seconds * 1e9)}


def model_statistics(model: ServedModel, metrics: ModelMetrics) -> dict[str, Any]:
    """The ``$model_stat`` object of one model version."""
    answered = sum(metrics.latency.counts)
    failed = sum(metrics.failures.values())
    batches = model.batch_sizes()
    last = 0
    if metrics.last_inference:  # a perf_counter() reading: to the wall clock
        last = int((time.time() - (time.perf_counter() - metrics.last_inference)) * 1000)
    return {
        "name": model.name,
        "version": model.version,
        "last_inference": last,
        "inference_count": sum(rows * count for rows, count in batches.items()),
        "execution_count": sum(batches.values()),
        "inference_stats": {
            "success": _duration(answered, metrics.latency.sum),
            "fail": _duration(failed, metrics.failed_seconds),
            "queue": _duration(answered, metrics.queue_time.sum),
            "compute_input": _duration(answered, metrics.compute_input),
            "compute_infer": _duration(answered, metrics.compute_infer),
            "compute_output": _duration(answered, metrics.compute_output),
            "cache_hit": _duration(0, 0.0),
            "cache_miss": _duration(0, 0.0),
        },
        # Rows per execution are counted (``aioinfer_batch_size`` in /metrics), their
        # compute time per batch size is not: no batch_stats rather than made-up times.
        "batch_stats": [],
    }
