"""Deprecated: the pass pipeline is the CPU device's,
:func:`aioinfer.devices.cpu.passes.pipeline.compile_passes`; import it from there."""

from __future__ import annotations

import importlib
import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    if name != "compile_passes":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        "aioinfer.transforms.pipelines.compile_passes moved to "
        "aioinfer.devices.cpu.passes.pipeline.compile_passes",
        DeprecationWarning,
        stacklevel=2,
    )
    # Imported by name, when asked: the shared passes import nothing of a device.
    return importlib.import_module("aioinfer.devices.cpu.passes.pipeline").compile_passes
