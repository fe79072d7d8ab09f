"""The AUTO device's own properties, and the default priority list."""

from __future__ import annotations

from typing import Any

from aioinfer.properties import Property

DEFAULT_PRIORITIES = ("ORT", "OPENVINO", "CPU")
"""The devices AUTO tries, in order, when ``DEVICE_PRIORITIES`` is not given: the
engines first (each only when its package is installed), then the numpy ``CPU`` device,
which needs nothing beyond aioinfer's own dependencies. Measured with
``benchmarks/devices.py`` (docs/auto.md has the figures): ``ORT`` had the lowest latency
over the benchmark set and the highest queue throughput at batch 1."""


def _priorities(value: Any) -> tuple[str, ...]:
    """``"ORT,CPU"`` or a sequence of device names -> a tuple of names, in order."""
    if isinstance(value, str):
        names = [part.strip() for part in value.split(",")]
    elif isinstance(value, (list, tuple)):
        names = list(value)
    else:
        raise ValueError(f"expected device names such as 'ORT,CPU', not {type(value).__name__}")
    if not names or not all(isinstance(name, str) and name for name in names):
        raise ValueError(f"expected device names such as 'ORT,CPU', got {value!r}")
    if any(name.partition(":")[0] == "AUTO" for name in names):
        raise ValueError(f"AUTO cannot be one of its own devices, got {value!r}")
    return tuple(names)


DEVICE_PRIORITIES = Property(
    "DEVICE_PRIORITIES",
    "The devices AUTO tries, in order: the first that loads here and compiles the model "
    "runs it ('ORT,CPU'; 'AUTO:ORT,CPU' sets it). Default: ORT, OPENVINO, CPU.",
    default=DEFAULT_PRIORITIES,
    parse=_priorities,
)
EXECUTION_DEVICES = Property(
    "EXECUTION_DEVICES",
    "The device a compiled model runs on (AUTO: the device it chose), as a tuple.",
    configurable=False,
)
PASSED_OVER_DEVICES = Property(
    "PASSED_OVER_DEVICES",
    "The devices of DEVICE_PRIORITIES AUTO tried before the one it chose, each with why "
    "it was passed over (not available here, nodes it cannot run, or its compile error), "
    "as a tuple of (device, reason) pairs in priority order; empty when AUTO's first "
    "device runs the model or the model was imported from a blob.",
    configurable=False,
)
