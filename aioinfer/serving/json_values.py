"""Tensor values in JSON: read and checked (not coerced) into arrays, and written back.

Tensors in JSON are checked, not coerced: an integer out of its datatype's range, a
fraction in integer data, ``null`` or a string in numeric data, a number beyond FP16/FP32
range are refused (INVALID_ARGUMENT) rather than wrapped, truncated or turned into
NaN/infinity. NaN and the infinities have no JSON literal: outputs write them as the
strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, and inputs accept those strings
(and the bare literals Python's ``json`` and Triton write). The checks run on whole
arrays (numpy reductions); only data that mixes those strings (or ``null``...) with
numbers is looked at element by element.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from aioinfer.errors import ProtocolError
from aioinfer.serving.messages import DATATYPES, datatype

SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""How JSON data writes the floats that JSON has no number for (inputs and outputs)."""


def from_json(name: str, data: Any, kind: str, count: int) -> np.ndarray:
    """The JSON ``data`` of input ``name`` as a flat array of datatype ``kind`` with
    ``count`` elements.

    Raises:
        ProtocolError: a value that is not of ``kind`` or out of its range (the message
            names the element), or a count that disagrees with the shape.
    """
    if kind == "BYTES":
        flat = _strings(name, data)
    else:
        try:
            values = np.asarray(data)  # numpy picks int64, uint64, float64, bool or else
        except ValueError as exc:  # ragged nesting, too many dimensions
            raise ProtocolError(f"input {name!r}: 'data' is not {kind} values ({exc})") from None
        flat = _numbers(name, values.reshape(-1), data, kind)
    if flat.size != count:
        raise ProtocolError(
            f"input {name!r}: {flat.size} values in 'data', the shape needs {count}"
        )
    return flat


def _numbers(name: str, flat: np.ndarray, data: Any, kind: str) -> np.ndarray:
    """``flat`` (numpy's reading of the JSON ``data``) as ``kind``, or the error naming
    the first element that is not a value of ``kind``."""
    dtype = DATATYPES[kind]
    source = flat.dtype.kind
    if not flat.size:
        return flat.astype(dtype)
    if kind == "BOOL":
        if source != "b":
            objects = np.asarray(data, dtype=object).reshape(-1).tolist()
            index = next(i for i, item in enumerate(objects) if type(item) is not bool)
            raise _not_a(name, kind, index, objects[index])
        return flat
    if source not in "iuf":  # strings, null, booleans, integers beyond 64 bits, a mix
        return _mixed(name, np.asarray(data, dtype=object).reshape(-1), kind)
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            array = flat.astype(dtype)
        # Only floats (JSON numbers such as 1e999 parse as infinity) and integers into
        # FP16 can become infinite.
        if source == "f" or dtype.itemsize == 2:
            finite = np.isfinite(array)
            if not finite.all():
                raise _out_of_range(name, kind, int(np.argmin(finite)), flat)
        return array
    if flat.dtype == dtype:  # int64 or uint64 as numpy read them: in range
        return flat
    if source == "i":  # numpy's int64, the common case: in range if the cast keeps it
        array = flat.astype(dtype)
        if (array != flat).any():
            info = np.iinfo(dtype)
            values = flat.tolist()
            index = next(i for i, v in enumerate(values) if not info.min <= v <= info.max)
            raise _out_of_range(name, kind, index, values)
        return array
    low, high = flat.min().item(), flat.max().item()
    if source == "f":
        fraction = np.trunc(flat) != flat
        if fraction.any():
            index = int(np.argmax(fraction))
            raise _not_a(name, kind, index, flat[index])
        if max(-low, high) > 2**53:
            # Integers that numpy read as float64 (values on both sides of 2**63, or
            # next to fractional notation) may have lost digits: take JSON's own.
            return _mixed(name, np.asarray(data, dtype=object).reshape(-1), kind)
    info = np.iinfo(dtype)
    if low < info.min or high > info.max:
        values = flat.tolist()
        index = next(i for i, v in enumerate(values) if not info.min <= v <= info.max)
        raise _out_of_range(name, kind, index, values)
    return flat.astype(dtype)


def _mixed(name: str, objects: np.ndarray, kind: str) -> np.ndarray:
    """The slow path of :func:`_numbers`: element by element, for data that is not all
    numbers (the strings of :data:`SPECIAL_FLOATS` among them)."""
    dtype = DATATYPES[kind]
    floating = dtype.kind == "f"
    items = objects.tolist()
    for index, item in enumerate(items):
        if type(item) is int or (type(item) is float and (floating or item.is_integer())):
            continue
        if floating and type(item) is str and item in SPECIAL_FLOATS:
            items[index] = SPECIAL_FLOATS[item]
            continue
        raise _not_a(name, kind, index, item)
    if floating:
        wide = np.empty(len(items), np.float64)
        for index, item in enumerate(items):
            try:
                wide[index] = item
            except OverflowError:  # an integer beyond float64
                raise _out_of_range(name, kind, index, items) from None
        with np.errstate(over="ignore"):
            array = wide.astype(dtype)
        overflow = np.isfinite(wide) & ~np.isfinite(array)
        if overflow.any():
            raise _out_of_range(name, kind, int(np.argmax(overflow)), items)
        return array
    info = np.iinfo(dtype)
    for index, item in enumerate(items):
        if not info.min <= item <= info.max:
            raise _out_of_range(name, kind, index, items)
    return np.array([int(item) for item in items], dtype=dtype)


def _out_of_range(name: str, kind: str, index: int, values: Any) -> ProtocolError:
    value = values[index]
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        shown = "a number beyond the range of FP64"  # e.g. 1e999, which parses as infinity
    else:
        shown = str(value)
        if len(shown) > 40:
            shown = f"{shown[:20]}... ({len(shown)} digits)"
    dtype = DATATYPES[kind]
    info = np.iinfo(dtype) if dtype.kind in "iu" else np.finfo(dtype)
    return ProtocolError(
        f"input {name!r}: element {index} of 'data' is {shown}, out of the range of {kind} "
        f"[{info.min!s}, {info.max!s}]"
    )


_EXPECTED = {"BOOL": "true or false", "BYTES": "a string", "f": "a number", "iu": "an integer"}


def _not_a(name: str, kind: str, index: int, item: Any) -> ProtocolError:
    if isinstance(item, np.generic):
        item = item.item()
    shown = json.dumps(item) if isinstance(item, (str, bool)) or item is None else repr(item)
    if len(shown) > 40:
        shown = shown[:40] + "..."
    expected = _EXPECTED.get(kind) or _EXPECTED["f" if kind.startswith("FP") else "iu"]
    if kind.startswith("FP"):
        expected = 'a number, "NaN", "Infinity" or "-Infinity"'
    return ProtocolError(
        f"input {name!r}: element {index} of 'data' is {shown}, not {expected} ({kind})"
    )


def _strings(name: str, data: Any) -> np.ndarray:
    """The strings of the JSON ``data`` of a BYTES input (nested lists flattened)."""
    items: list[Any] = []
    pending = [iter(data if isinstance(data, list) else [data])]
    while pending:
        for item in pending[-1]:
            if isinstance(item, list):
                pending.append(iter(item))
                break
            items.append(item)
        else:
            pending.pop()
    for index, item in enumerate(items):
        if type(item) is not str:
            raise _not_a(name, "BYTES", index, item)
    try:
        "".join(items).encode()
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in the JSON)
        index = next(i for i, item in enumerate(items) if not _is_unicode(item))
        raise ProtocolError(
            f"input {name!r}: element {index} ({items[index]!r}) is not valid Unicode text"
        ) from None
    return object_array(items)


def _is_unicode(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def object_array(items: list[Any]) -> np.ndarray:
    """A 1-D object array of ``items`` (numpy would split equal-length strings)."""
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def to_json(name: str, array: np.ndarray) -> list[Any]:
    """The values of output ``name`` as a flat JSON list (NaN and the infinities still
    floats: see :func:`spell_special_floats`).

    Raises:
        ProtocolError: BYTES that are not UTF-8 text.
    """
    flat = array.reshape(-1)
    if datatype(array.dtype) == "BYTES":
        return _texts(name, flat)
    values: list[Any] = flat.tolist()
    return values


def spell_special_floats(values: list[Any], flat: np.ndarray) -> None:
    """Replace NaN and the infinities in ``values`` (``flat.tolist()``) by their strings."""
    for index in np.flatnonzero(~np.isfinite(flat)).tolist():
        value = values[index]
        values[index] = "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"


def _texts(name: str, flat: np.ndarray) -> list[str]:
    texts = []
    for index, item in enumerate(flat):
        if isinstance(item, bytes):
            try:
                item = item.decode()
            except UnicodeDecodeError:
                raise ProtocolError(
                    f"output {name!r}: element {index} ({item[:20]!r}) is not UTF-8 text, "
                    "which JSON cannot carry; ask for it as binary data "
                    "(parameters.binary_data)"
                ) from None
        texts.append(item if isinstance(item, str) else str(item))
    return texts
