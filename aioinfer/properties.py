"""Properties: each declared once here; parsing, get_property and SUPPORTED_PROPERTIES follow.

A *configurable* property is given in the config of ``compile_model`` (and can be read
back); a *read-only* property is computed by the compiled model. A device lists the
names it supports; everything else about a property comes from its declaration.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aioinfer.errors import (
    InvalidPropertyValueError,
    ReadOnlyPropertyError,
    UnknownPropertyError,
)


@dataclass(frozen=True)
class Property:
    """The declaration of one property."""

    name: str
    doc: str
    default: Any = None
    configurable: bool = True
    parse: Callable[[Any], Any] = lambda value: value
    """Turns a user value into the canonical one, raising ValueError when it is invalid."""


def _choice(*allowed: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = str(getattr(value, "value", value)).upper()
        if text not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return text

    return parse


def _positive_int_or_auto(value: Any) -> int | str:
    if isinstance(value, str) and value.upper() == "AUTO":
        return "AUTO"
    number = _int(value)
    if number < 1:
        raise ValueError("expected a positive integer or 'AUTO'")
    return number


def _non_negative_int(value: Any) -> int:
    number = _int(value)
    if number < 0:
        raise ValueError("expected an integer >= 0 (0 means all cores)")
    return number


def _int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer, not a bool")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError("expected an integer") from None


PROPERTIES: dict[str, Property] = {
    p.name: p
    for p in (
        Property(
            "PERFORMANCE_HINT",
            "LATENCY: one stream using all cores; THROUGHPUT: several streams, cores split.",
            default="LATENCY",
            parse=_choice("LATENCY", "THROUGHPUT"),
        ),
        Property(
            "NUM_STREAMS",
            "Number of inferences the device runs in parallel ('AUTO' follows the hint).",
            default="AUTO",
            parse=_positive_int_or_auto,
        ),
        Property(
            "INFERENCE_NUM_THREADS",
            "Threads used for compute in total (0: all cores).",
            default=0,
            parse=_non_negative_int,
        ),
        Property("NETWORK_NAME", "The compiled model's name.", configurable=False),
        Property(
            "OPTIMAL_NUMBER_OF_INFER_REQUESTS",
            "How many requests in flight keep the device busy.",
            configurable=False,
        ),
        Property(
            "SUPPORTED_PROPERTIES",
            "The names of the properties this object supports.",
            configurable=False,
        ),
        Property("DEVICE_NAME", "The device the model is compiled for.", configurable=False),
        Property("NUM_CORES", "CPU cores available to this process.", configurable=False),
    )
}


def parse_config(config: Mapping[str, Any] | None, supported: Iterable[str]) -> dict[str, Any]:
    """Validate a compile config against the supported names; fill in the defaults.

    Raises:
        UnknownPropertyError: a name the device does not support (the message lists them).
        ReadOnlyPropertyError: a read-only property was given.
        InvalidPropertyValueError: a value the property does not accept.
    """
    supported = tuple(supported)
    configurable = [n for n in supported if PROPERTIES[n].configurable]
    values = {name: PROPERTIES[name].default for name in configurable}
    for raw_name, value in (config or {}).items():
        name = str(getattr(raw_name, "value", raw_name))
        prop = PROPERTIES.get(name)
        if prop is None or name not in supported:
            raise UnknownPropertyError(
                f"unknown property {name!r}; supported: {', '.join(sorted(supported))}"
            )
        if not prop.configurable:
            raise ReadOnlyPropertyError(f"property {name!r} is read-only")
        try:
            values[name] = prop.parse(value)
        except ValueError as exc:
            raise InvalidPropertyValueError(
                f"invalid value {value!r} for property {name!r}: {exc}"
            ) from None
    return values


def check_readable(name: str, supported: Iterable[str]) -> None:
    """Raise UnknownPropertyError when ``name`` is not among ``supported``."""
    supported = tuple(supported)
    if name not in supported:
        raise UnknownPropertyError(
            f"unknown property {name!r}; supported: {', '.join(sorted(supported))}"
        )


def num_cores() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
