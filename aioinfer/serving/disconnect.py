"""Moved to :mod:`aioinfer.serving.rest.disconnect` (the REST transport's); this name
still works, with a ``DeprecationWarning``."""

from __future__ import annotations

import warnings
from typing import Any

from aioinfer.serving.rest import disconnect as _moved


def __getattr__(name: str) -> Any:
    warnings.warn(
        "aioinfer.serving.disconnect moved to aioinfer.serving.rest.disconnect",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(_moved, name)
