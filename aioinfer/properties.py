"""Properties: how one is declared, the shared declarations, and config parsing.

A *configurable* property is given in the config of ``compile_model`` (and can be read
back); a *read-only* property is computed by the compiled model or the device. Each
plugin declares the properties it supports (its ``properties``): the common ones are
the shared declarations here (``PERFORMANCE_HINT``, ``NUM_STREAMS``, ``CACHE_DIR``, ...),
a device's own live in its package (``MAX_BATCH_SIZE`` with ``BATCH``). Parsing, the
defaults, ``get_property`` and ``SUPPORTED_PROPERTIES`` all derive from those
declarations, so a new property is one declaration where its owner lives.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
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
    auto: Any = None
    """A config value that lets the device decide; reading the property back gives what
    the device decided. None when the property has no such value."""
    mutable: bool = False
    """Whether the value may change once the model is compiled: a configurable property
    may then be given again to ``import_model`` (a run-time setting such as the hint or
    the streams; the others are fixed by the compile, ``STATEFUL`` for one); a read-only
    one changes while the model runs (``ACTIVATION_MEMORY_BYTES``), so a copy of its
    value must be read again."""

    def is_auto(self, value: Any) -> bool:
        """True when ``value`` is this property's let-the-device-decide value."""
        return self.auto is not None and type(value) is type(self.auto) and value == self.auto


# -- parsers: a user value to the canonical one (ValueError: invalid), for declarations
# here and in device packages


def choice(*allowed: str) -> Callable[[Any], str]:
    """A parser of one of ``allowed`` (any case, or an enum member with that value)."""

    def parse(value: Any) -> str:
        text = str(getattr(value, "value", value)).upper()
        if text not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return text

    return parse


def positive_int_or_auto(value: Any) -> int | str:
    """An integer >= 1, or ``"AUTO"`` (any case)."""
    if isinstance(value, str) and value.upper() == "AUTO":
        return "AUTO"
    number = integer(value)
    if number < 1:
        raise ValueError("expected a positive integer or 'AUTO'")
    return number


def non_negative_int(value: Any) -> int:
    """An integer >= 0 (0: all cores)."""
    number = integer(value)
    if number < 0:
        raise ValueError("expected an integer >= 0 (0 means all cores)")
    return number


def integer(value: Any) -> int:
    """An integer (not a bool)."""
    if isinstance(value, bool):
        raise ValueError("expected an integer, not a bool")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError("expected an integer") from None


def _stateful(value: Any) -> str | dict[str, str] | None:
    """``"AUTO"`` (any case) or a new dict {input name: output name}; None (no state, the
    default) stays None, so that the value read back is the value set."""
    if value is None:
        return None
    if isinstance(value, str):
        if value.upper() == "AUTO":
            return "AUTO"
        raise ValueError("expected 'auto' or a mapping {input name: output name}")
    if not isinstance(value, Mapping):
        raise ValueError(
            f"expected 'auto' or a mapping {{input name: output name}}, not {type(value).__name__}"
        )
    pairs: dict[str, str] = {}
    for input_name, output_name in value.items():
        if not isinstance(input_name, str) or not isinstance(output_name, str):
            raise ValueError(f"names must be strings, got {input_name!r}: {output_name!r}")
        if output_name in pairs.values():
            raise ValueError(f"output {output_name!r} is paired with two inputs")
        pairs[input_name] = output_name
    return pairs


def positive_int(value: Any) -> int:
    """An integer >= 1."""
    number = integer(value)
    if number < 1:
        raise ValueError("expected an integer >= 1")
    return number


def non_negative_float(value: Any) -> float:
    """A number >= 0 (not a bool, not NaN)."""
    if isinstance(value, bool):
        raise ValueError("expected a number, not a bool")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("expected a number") from None
    if not number >= 0:  # also rejects NaN
        raise ValueError("expected a number >= 0")
    return number


def positive_float(value: Any) -> float:
    """A number > 0 (not a bool, not NaN)."""
    if isinstance(value, bool):
        raise ValueError("expected a number, not a bool")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("expected a number") from None
    if not number > 0:  # also rejects NaN
        raise ValueError("expected a number > 0")
    return number


def yes_no(value: Any) -> bool:
    """A bool, or ``"YES"``/``"NO"``/``"TRUE"``/``"FALSE"`` (any case)."""
    if isinstance(value, bool):
        return value
    text = str(value).upper()
    if text in ("YES", "TRUE"):
        return True
    if text in ("NO", "FALSE"):
        return False
    raise ValueError("expected True/False or 'YES'/'NO'")


def _directory(value: Any) -> str:
    """A directory path as a string ('' or None: no directory)."""
    if value is None:
        return ""
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"expected a directory path, not {type(value).__name__}")
    path = os.fspath(value)
    if path and os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{path!r} exists and is not a directory")
    return str(path)


# -- the shared declarations

PERFORMANCE_HINT = Property(
    "PERFORMANCE_HINT",
    "LATENCY: one stream using all cores; THROUGHPUT: several streams, cores split.",
    default="LATENCY",
    parse=choice("LATENCY", "THROUGHPUT"),
    mutable=True,
)
NUM_STREAMS = Property(
    "NUM_STREAMS",
    "Number of inferences the device runs in parallel ('AUTO' follows the hint).",
    default="AUTO",
    parse=positive_int_or_auto,
    auto="AUTO",
    mutable=True,
)
INFERENCE_NUM_THREADS = Property(
    "INFERENCE_NUM_THREADS",
    "Threads used for compute in total (0: all cores).",
    default=0,
    parse=non_negative_int,
    auto=0,
    mutable=True,
)
STATEFUL = Property(
    "STATEFUL",
    "Input/output pairs kept as variable state in each request: a mapping "
    "{input name: output name}, or 'auto' (exporter conventions, see "
    "docs/stateful.md). Read back: the pairs made.",
    parse=_stateful,
)
LOGITS = Property(
    "LOGITS",
    "Which positions a decoder's 'logits' output holds: 'LAST' (the last one, "
    "[batch, 1, vocab]: a prefill projects one position per sequence onto the "
    "vocabulary) or 'ALL' (every position fed, as exported). Default: 'LAST' for a "
    "model that STATEFUL makes stateful and whose 'logits' come from a projection "
    "that can be sliced, 'ALL' otherwise (see docs/generation.md). The Core applies it "
    "before the device compiles; read it from the output's shape.",
    parse=lambda value: None if value is None else choice("LAST", "ALL")(value),
)
PERF_COUNT = Property(
    "PERF_COUNT",
    "Record per-node timings in get_profiling_info (off by default: no cost).",
    default=False,
    parse=yes_no,
    mutable=True,
)
CACHE_DIR = Property(
    "CACHE_DIR",
    "A directory where compiled models are kept: compiling the same model with the "
    "same device, config and aioinfer version again loads it from there ('' = off). "
    "The Core keeps the cache; a device that exports and imports declares it.",
    default="",
    parse=_directory,
    mutable=True,
)
LOADED_FROM_CACHE = Property(
    "LOADED_FROM_CACHE",
    "Whether compile_model loaded the compiled model from CACHE_DIR.",
    configurable=False,
)
NETWORK_NAME = Property("NETWORK_NAME", "The compiled model's name.", configurable=False)
OPTIMAL_NUMBER_OF_INFER_REQUESTS = Property(
    "OPTIMAL_NUMBER_OF_INFER_REQUESTS",
    "How many requests in flight keep the device busy.",
    configurable=False,
)
SUPPORTED_PROPERTIES = Property(
    "SUPPORTED_PROPERTIES",
    "The names of the properties this object supports.",
    configurable=False,
)
DEVICE_NAME = Property("DEVICE_NAME", "The device the model is compiled for.", configurable=False)
FULL_DEVICE_NAME = Property(
    "FULL_DEVICE_NAME",
    "A descriptive name of the device: for the CPU, the processor's model name.",
    configurable=False,
)
NUM_CORES = Property("NUM_CORES", "CPU cores available to this process.", configurable=False)
OPTIMIZATION_CAPABILITIES = Property(
    "OPTIMIZATION_CAPABILITIES",
    "What the device can do beyond compiling and running models, by OpenVINO's names: "
    "'EXPORT_IMPORT' when its compiled models export and import (and so CACHE_DIR).",
    configurable=False,
)

ALLOW_AUTO_BATCHING = Property(
    "ALLOW_AUTO_BATCHING",
    "With the THROUGHPUT hint, let the Core batch concurrent requests of a batchable "
    "model on the BATCH device (a device opts in by declaring this property).",
    default=True,
    parse=yes_no,
)
"""Shared by the devices whose models the Core may batch (``CPU``, ``AUTO``) and read by
the Core; not in :data:`COMMON`, since declaring it is how a device opts in (an engine
device that does not passes the name on to its engine)."""

COMMON: Mapping[str, Property] = MappingProxyType(
    {
        p.name: p
        for p in (
            PERFORMANCE_HINT,
            NUM_STREAMS,
            INFERENCE_NUM_THREADS,
            STATEFUL,
            PERF_COUNT,
            CACHE_DIR,
            LOADED_FROM_CACHE,
            NETWORK_NAME,
            OPTIMAL_NUMBER_OF_INFER_REQUESTS,
            SUPPORTED_PROPERTIES,
            DEVICE_NAME,
            FULL_DEVICE_NAME,
            NUM_CORES,
            OPTIMIZATION_CAPABILITIES,
        )
    }
)
"""The shared declarations, by name: properties that mean the same on every device that
supports them. A device's own properties are declared in the device's package."""


# -- tables and configs


def declare(*properties: Property) -> Mapping[str, Property]:
    """The declarations a device supports, by name, in the order given (a plugin's
    ``properties``).

    Raises:
        ValueError: two declarations share a name.
    """
    table: dict[str, Property] = {}
    for prop in properties:
        if prop.name in table:
            raise ValueError(f"property {prop.name!r} is declared twice")
        table[prop.name] = prop
    return MappingProxyType(table)


def property_name(name: Any) -> str:
    """The name of a property given as a string or as an enum member (``.value``)."""
    return str(getattr(name, "value", name))


def parse_config(
    config: Mapping[str, Any] | None, declared: Mapping[str, Property]
) -> dict[str, Any]:
    """Validate a compile config against the ``declared`` properties; fill in the
    defaults of the configurable ones.

    Raises:
        UnknownPropertyError: a name not declared (the message lists the declared ones).
        ReadOnlyPropertyError: a read-only property was given.
        InvalidPropertyValueError: a value the property does not accept.
    """
    values = {name: p.default for name, p in declared.items() if p.configurable}
    for raw_name, value in (config or {}).items():
        name = property_name(raw_name)
        prop = declared.get(name)
        if prop is None:
            raise UnknownPropertyError(
                f"unknown property {name!r}; supported: {', '.join(sorted(declared))}"
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


def check_mutable(config: Mapping[str, Any], declared: Mapping[str, Property], when: str) -> None:
    """Refuse a name in ``config`` whose property is fixed once the model is compiled.

    Raises:
        InvalidPropertyValueError: a configurable property that is not ``mutable``
            (``when`` says what was attempted, e.g. "when importing").
    """
    for raw_name in config:
        name = property_name(raw_name)
        prop = declared.get(name)
        if prop is not None and prop.configurable and not prop.mutable:
            raise InvalidPropertyValueError(
                f"{name} cannot be set {when}: it is fixed when the model is compiled"
            )


def check_readable(name: str, supported: Iterable[str]) -> None:
    """Raise UnknownPropertyError when ``name`` is not among ``supported``."""
    supported = tuple(supported)
    if name not in supported:
        raise UnknownPropertyError(
            f"unknown property {name!r}; supported: {', '.join(sorted(supported))}"
        )


@functools.cache
def cpu_model_name() -> str:
    """The processor's model name (``model name`` in /proc/cpuinfo on Linux, else what
    :func:`platform.processor` says, else the machine type)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def num_cores() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
