"""What the ``aioinfer`` commands share (``run``, ``compile`` and ``bench``): option values
parsed (``NAME=VALUE`` pairs, shapes, ``.npy`` files), a model's input arrays made from
them, and how a latency and a device are printed.

Both :mod:`aioinfer.cli` and :mod:`aioinfer.bench` import it: the command line runs the
benchmark, so the benchmark cannot import the command line.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import aioinfer
from aioinfer.model import Port


class UsageError(Exception):
    """A command-line value that cannot be used (bad syntax, unreadable file)."""


def _pairs(items: Sequence[str], option: str, form: str) -> dict[str, str]:
    """Split ``NAME=VALUE`` option values into a dict."""
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise UsageError(f"{option} expects {form}, got {item!r}")
        if name in pairs:
            raise UsageError(f"{option} given twice for {name!r}")
        pairs[name] = value
    return pairs


def _dims(name: str, text: str) -> tuple[int, ...]:
    """Parse ``1,3,32,32`` (``x`` also separates) into a shape."""
    try:
        dims = tuple(int(part) for part in text.replace("x", ",").split(","))
    except ValueError:
        raise UsageError(
            f"--shape {name}: expected comma-separated integers such as 1,3,32,32, got {text!r}"
        ) from None
    if any(d < 0 for d in dims):
        raise UsageError(f"--shape {name}: dimensions must be >= 0, got {text!r}")
    return dims


def _read_npy(name: str, file: str) -> np.ndarray:
    """Read the .npy file given for input ``name``."""
    try:
        return np.asarray(np.load(file, allow_pickle=False))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--input {name}: cannot read {file!r} as a .npy array: {exc}") from None


def _inputs(
    ports: Sequence[Port],
    arrays: dict[str, np.ndarray],
    shapes: dict[str, tuple[int, ...]],
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """The arrays of every input: read from a file if given, else random."""
    return {
        port.name: _convert(port, arrays[port.name])
        if port.name in arrays
        else _random(port, shapes.get(port.name), rng)
        for port in ports
    }


def _convert(port: Port, array: np.ndarray) -> np.ndarray:
    """``array`` in the port's type when both are of one kind (float64 -> float32)."""
    if array.dtype != port.dtype and array.dtype.kind == port.dtype.kind:
        return array.astype(port.dtype)
    return array


def _random(port: Port, shape: tuple[int, ...] | None, rng: np.random.Generator) -> np.ndarray:
    """A random array for ``port``; dims not static and not given by ``shape`` are 1."""
    if shape is None:
        if port.shape is None:
            raise UsageError(f"input {port.name!r} has unknown rank; give --shape {port.name}=...")
        shape = tuple(d if isinstance(d, int) else 1 for d in port.shape)
    dtype = port.dtype
    if dtype.kind in "fc":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 10, shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    raise UsageError(
        f"cannot make random values of type {dtype} for input {port.name!r}; "
        f"give --input {port.name}=FILE.npy"
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def device_label(asked: str, compiled: aioinfer.CompiledModel) -> str:
    """The device asked for, with what runs the model when that is another device:
    ``AUTO (on ORT)``, ``AUTO (on ORT, compiled as BATCH:AUTO)``."""
    details = []
    if "EXECUTION_DEVICES" in compiled.supported_properties():
        details.append(f"on {', '.join(compiled.get_property('EXECUTION_DEVICES'))}")
    compiled_as = str(compiled.get_property("DEVICE_NAME"))
    if compiled_as != asked:
        details.append(f"compiled as {compiled_as}")
    return f"{asked} ({', '.join(details)})" if details else asked
