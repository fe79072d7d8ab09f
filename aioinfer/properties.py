"""Properties: each declared once here; parsing, get_property and SUPPORTED_PROPERTIES follow.

A *configurable* property is given in the config of ``compile_model`` (and can be read
back); a *read-only* property is computed by the compiled model. A device lists the
names it supports; everything else about a property comes from its declaration.
"""

from __future__ import annotations

import functools
import os
import platform
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
    auto: Any = None
    """A config value that lets the device decide; reading the property back gives what
    the device decided. None when the property has no such value."""

    def is_auto(self, value: Any) -> bool:
        """True when ``value`` is this property's let-the-device-decide value."""
        return self.auto is not None and type(value) is type(self.auto) and value == self.auto


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


def _stateful(value: Any) -> str | dict[str, str]:
    """``"AUTO"`` (any case) or a new dict {input name: output name}; None is {}."""
    if value is None:
        return {}
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


def _positive_int(value: Any) -> int:
    number = _int(value)
    if number < 1:
        raise ValueError("expected an integer >= 1")
    return number


def _non_negative_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a number, not a bool")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("expected a number") from None
    if not number >= 0:  # also rejects NaN
        raise ValueError("expected a number >= 0")
    return number


def _positive_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a number, not a bool")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("expected a number") from None
    if not number > 0:  # also rejects NaN
        raise ValueError("expected a number > 0")
    return number


def _yes_no(value: Any) -> bool:
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


def _names(value: Any) -> tuple[str, ...]:
    """A non-empty list of names, or one string of comma-separated names."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"expected a list of names, not {type(value).__name__}")
    names = tuple(str(item).strip() for item in items)
    if not names or not all(names):
        raise ValueError("expected a non-empty list of non-empty names")
    return names


def _device_name(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("expected a device name such as 'CPU'")
    return value


def _precision(value: Any) -> str:
    text = str(getattr(value, "value", value))
    if text.upper() == "AUTO":
        return "AUTO"
    if text.lower() not in ("f32", "bf16", "f16"):
        raise ValueError("expected one of f32, bf16, f16, AUTO")
    return text.lower()


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
            auto="AUTO",
        ),
        Property(
            "INFERENCE_NUM_THREADS",
            "Threads used for compute in total (0: all cores).",
            default=0,
            parse=_non_negative_int,
            auto=0,
        ),
        Property(
            "STATEFUL",
            "Input/output pairs kept as variable state in each request: a mapping "
            "{input name: output name}, or 'auto' (exporter conventions, see "
            "docs/stateful.md). Read back: the pairs made.",
            parse=_stateful,
        ),
        Property(
            "PERF_COUNT",
            "Record per-node timings in get_profiling_info (off by default: no cost).",
            default=False,
            parse=_yes_no,
        ),
        Property(
            "CACHE_DIR",
            "A directory where compiled models are kept: compiling the same model with the "
            "same device, config and aioinfer version again loads it from there ('' = off).",
            default="",
            parse=_directory,
        ),
        Property(
            "ACTIVATION_MEMORY_BYTES",
            "Bytes of planned activation buffers one request holds for the input shapes it "
            "ran last (the largest over the requests; 0 before the first inference and after "
            "release_memory).",
            configurable=False,
        ),
        Property(
            "LOADED_FROM_CACHE",
            "Whether compile_model loaded the compiled model from CACHE_DIR.",
            configurable=False,
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
        Property(
            "FULL_DEVICE_NAME",
            "A descriptive name of the device: for the CPU, the processor's model name.",
            configurable=False,
        ),
        Property("NUM_CORES", "CPU cores available to this process.", configurable=False),
        Property(
            "MAX_BATCH_SIZE",
            "BATCH device: the most rows (first-dimension entries) one batch holds.",
            default=32,
            parse=_positive_int,
        ),
        Property(
            "BATCH_TIMEOUT_MS",
            "BATCH device: how long the oldest waiting request may wait (ms) for its batch "
            "to fill once the device is free (0: run what is queued at once).",
            default=1.0,
            parse=_non_negative_float,
        ),
        Property(
            "TARGET_DEVICE",
            "BATCH device: the device that runs the batches ('BATCH:CPU' sets it).",
            default="CPU",
            parse=_device_name,
        ),
        Property(
            "WORKER_TIMEOUT_S",
            "PROCESS device: a worker that does not answer its heartbeat for this many "
            "seconds (stopped, deadlocked) is killed and replaced; its inferences fail with "
            "WorkerTimeoutError.",
            default=30.0,
            parse=_positive_float,
        ),
        Property(
            "ALLOW_AUTO_BATCHING",
            "With the THROUGHPUT hint, let the Core batch concurrent requests of a batchable "
            "model on the BATCH device.",
            default=True,
            parse=_yes_no,
        ),
        Property(
            "ORT_PROVIDERS",
            "ORT device: onnxruntime execution providers, in order of preference (a list or "
            "a comma-separated string). Read back: the providers the session uses.",
            default=("CPUExecutionProvider",),
            parse=_names,
        ),
        Property(
            "ORT_ALLOW_SPINNING",
            "ORT device: let onnxruntime's idle intra-op threads spin (off by default: "
            "spinning threads take cores from the event loop and other streams).",
            default=False,
            parse=_yes_no,
        ),
        Property(
            "ORT_INLINE_RUN_US",
            "ORT device with one stream: a run whose last run on inputs of the same shapes "
            "took less than this many microseconds runs on the event loop's thread when no "
            "other run is in flight, saving the hop to a compute thread (0: never).",
            default=200,
            parse=_non_negative_int,
        ),
        Property(
            "OPENVINO_DEVICE",
            "OPENVINO device: the OpenVINO device that computes ('CPU', 'GPU', 'NPU', ...).",
            default="CPU",
            parse=_device_name,
        ),
        Property(
            "INFERENCE_PRECISION_HINT",
            "OPENVINO device: the precision floating-point layers compute in: 'f32' (results "
            "agree with the other devices), 'bf16' or 'f16' (faster where the hardware has "
            "them, less precise), 'AUTO' (OpenVINO's choice). Read back: the one used.",
            default="f32",
            parse=_precision,
            auto="AUTO",
        ),
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
