"""The BATCH device's own properties, and the one a device declares to let the Core batch
its models automatically (``ALLOW_AUTO_BATCHING``)."""

from __future__ import annotations

from aioinfer.properties import Property, non_negative_float, positive_int, yes_no

MAX_BATCH_SIZE = Property(
    "MAX_BATCH_SIZE",
    "BATCH device: the most rows (first-dimension entries) one batch holds.",
    default=32,
    parse=positive_int,
)
BATCH_TIMEOUT_MS = Property(
    "BATCH_TIMEOUT_MS",
    "BATCH device: the longest the oldest waiting request waits (ms) for its batch "
    "to fill once the device is free; a batch starts sooner when no other request can "
    "join it or none is expected in time (0: run what is queued at once).",
    default=1.0,
    parse=non_negative_float,
)
ALLOW_AUTO_BATCHING = Property(
    "ALLOW_AUTO_BATCHING",
    "With the THROUGHPUT hint, let the Core batch concurrent requests of a batchable "
    "model on the BATCH device (a device opts in by declaring this property).",
    default=True,
    parse=yes_no,
)
