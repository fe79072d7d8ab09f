"""Optional operators: an optional value in a plan slot is its element, or None when empty."""

from __future__ import annotations

from typing import Any

import numpy as np

from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel


@kernel("Optional", since=15)
def _optional(spec: NodeSpec) -> Kernel:
    return lambda value=None: (value,)


@kernel("OptionalHasElement", since=15)
def _has_element(spec: NodeSpec) -> Kernel:
    return lambda value=None: (np.array(value is not None),)


@kernel("OptionalGetElement", since=15)
def _get_element(spec: NodeSpec) -> Kernel:
    def get(value: Any) -> tuple[Any]:
        if value is None:
            raise ValueError("OptionalGetElement: the optional is empty")
        return (value,)

    return get
