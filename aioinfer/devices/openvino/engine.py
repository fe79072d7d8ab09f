"""OpenVINO's exceptions and values, as aioinfer speaks them.

OpenVINO raises ``RuntimeError`` for everything, its message a stack of source locations
around the one line that says what went wrong; its property values are enums and
element types. These helpers keep the line that matters, name the ONNX node a failure
happened in, and turn values into plain Python (what ``get_property`` returns and what
the PROCESS device pickles).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_NOISE = re.compile(
    r"Exception from \S+:\d+:|Check '.*?' failed at \S+:\d+:|Caught exception:\s*|"
    r"To facilitate the conversion.*$|Encountered unconverted operation.*$"
)
_NODE = re.compile(r"node with name '([^']+)'")
_UNCONVERTED = re.compile(r"No conversion rule found for operations: (.+)")


def engine_message(exc: BaseException) -> str:
    """The words of OpenVINO's exception without its source locations."""
    lines = (_NOISE.sub("", line).strip() for line in str(exc).splitlines())
    return " ".join(line for line in lines if line) or type(exc).__name__


def unconverted_operators(exc: BaseException) -> str | None:
    """The operators OpenVINO's ONNX frontend has no conversion for, as it lists them
    (None when that is not why it failed)."""
    match = _UNCONVERTED.search(str(exc))
    return match.group(1).strip() if match else None


def failure_message(exc: BaseException, producers: Mapping[str, str]) -> str:
    """The message of an inference that failed in OpenVINO, naming the ONNX node.

    OpenVINO names a node by the tensor it produces (its friendly name); ``producers``
    maps each tensor name of the ONNX graph to the node that produces it.
    """
    message = engine_message(exc)
    match = _NODE.search(message)
    if match is not None:
        # A node OpenVINO split or renamed keeps its name with a suffix: 'y.0'.
        name = match.group(1)
        for tensor in (name, name.rpartition(".")[0]):
            if tensor in producers:
                return f"node {producers[tensor]!r} failed in OpenVINO: {message}"
    return f"OpenVINO failed: {message}"


def is_property_error(exc: BaseException) -> bool:
    """Whether OpenVINO refused a property (its name or value) rather than the model."""
    text = str(exc)
    return "for property key" in text or "Unsupported property" in text


def plain(value: Any) -> Any:
    """An OpenVINO property value as plain Python: numbers, strings and booleans stay,
    enums become their name, element types their short name (``"f32"``)."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    get_type_name = getattr(value, "get_type_name", None)
    if callable(get_type_name):
        return str(get_type_name())
    name = getattr(value, "name", None)
    return name if isinstance(name, str) else str(value)
