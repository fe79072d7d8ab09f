"""The BATCH device's own properties.

``ALLOW_AUTO_BATCHING``, which a device declares to let the Core batch its models on
BATCH, is a shared declaration of :mod:`aioinfer.properties`; importing it from here
still works and warns (``DeprecationWarning``)."""

from __future__ import annotations

import warnings
from typing import Any

from aioinfer.properties import Property, non_negative_float, positive_int

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


def __getattr__(name: str) -> Any:
    if name != "ALLOW_AUTO_BATCHING":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        "aioinfer.devices.batch.properties.ALLOW_AUTO_BATCHING moved to "
        "aioinfer.properties.ALLOW_AUTO_BATCHING",
        DeprecationWarning,
        stacklevel=2,
    )
    from aioinfer.properties import ALLOW_AUTO_BATCHING

    return ALLOW_AUTO_BATCHING
