"""System shared memory: tensors that a client on the same machine leaves in, or takes
from, a POSIX shared-memory object instead of the request body (Triton's extension).

A client creates an object (``shm_open("/key")``, or tritonclient's
``create_shared_memory_region``), registers a window of it under a region name, and
then names the region, a byte size and an offset in an input's or output's parameters.
An input is read in place: the array the model gets is a read-only view of the mapped
object, no byte of it crosses a socket or is copied; an output is written once, from the
model's result into the region. A 1 MB input over JSON costs the loop ~10 ms of
parsing, over binary HTTP a copy per hop; from shared memory, a mapping.

Regions are confined to POSIX shared memory: a key names an object directly under
``/dev/shm`` (one path component, no ``..``, no symbolic link followed), never a file
elsewhere. Every size and offset is checked against the region, and every error names
the region. Each use checks that the object still holds the region: one its owner shrank
is refused, not read past its end (which would be a SIGBUS). A shrink that races with an
inference in progress is not caught: shared memory trusts the processes that can write
it, as Triton's does.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aioinfer.errors import SharedMemoryError
from aioinfer.serving.messages import DATATYPES, SharedInput, SharedMemoryRef

SHM_ROOT = Path("/dev/shm")
"""Where POSIX shared-memory objects live (Linux)."""

_KEY = re.compile(r"/?([A-Za-z0-9_.\-]{1,255})")
_LITTLE_ENDIAN = {name: dtype.newbyteorder("<") for name, dtype in DATATYPES.items()}


@dataclass
class _Region:
    """One registered window: ``byte_size`` bytes from ``offset`` of the object ``key``,
    mapped once at registration."""

    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap

    def window(self, ref: SharedMemoryRef, what: str) -> tuple[int, int]:
        """The (start, size) in the mapping of the bytes ``ref`` names, checked."""
        if ref.offset + ref.byte_size > self.byte_size:
            raise SharedMemoryError(
                f"{what}: invalid offset + byte size for shared memory region {self.name!r}: "
                f"{ref.offset} + {ref.byte_size} exceeds its {self.byte_size} bytes"
            )
        start = self.offset + ref.offset
        actual = self.mapping.size()  # the object's size now: its owner may have shrunk it
        if actual < start + ref.byte_size:
            raise SharedMemoryError(
                f"{what}: shared memory region {self.name!r} lies beyond the end of "
                f"{self.key!r}, which now has {actual} bytes (it shrank since registration)"
            )
        return start, ref.byte_size

    def close(self) -> None:
        # While an inference still reads a view of it, the mapping cannot close: it
        # closes once that view is gone (the region is already out of the registry).
        with contextlib.suppress(BufferError):
            self.mapping.close()


class SystemSharedMemory:
    """The system shared-memory regions registered with a service, by name."""

    def __init__(self, root: Path = SHM_ROOT) -> None:
        self.root = root
        self._regions: dict[str, _Region] = {}

    def register(self, name: str, key: str, offset: object, byte_size: object) -> None:
        """Map ``byte_size`` bytes from ``offset`` of the shared-memory object ``key``
        (``/name`` or ``name``, under ``/dev/shm``) as region ``name``.

        Raises:
            SharedMemoryError: a region of that name exists, the key is not the name of
                a POSIX shared-memory object, the object does not exist or is smaller
                than ``offset + byte_size``, or a number is not an integer >= 0.
        """
        start, size = _size(name, "offset", offset), _size(name, "byte_size", byte_size)
        if name in self._regions:
            raise SharedMemoryError(f"shared memory region {name!r} already in manager")
        path = self._path(name, key)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise SharedMemoryError(
                f"Unable to open shared memory region {name!r} (key {key!r}): {exc.strerror}"
            ) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SharedMemoryError(
                    f"shared memory region {name!r}: key {key!r} is not a shared-memory object"
                )
            if info.st_size < start + size or size == 0:
                raise SharedMemoryError(
                    f"shared memory region {name!r}: offset {start} + byte_size {size} does "
                    f"not fit the {info.st_size} bytes of {key!r}"
                )
            mapping = mmap.mmap(fd, start + size)  # keeps its own descriptor
        finally:
            os.close(fd)
        self._regions[name] = _Region(name, key, start, size, mapping)

    def _path(self, name: str, key: str) -> Path:
        if not self.root.is_dir():
            raise SharedMemoryError(
                f"shared memory region {name!r}: system shared memory needs POSIX shared "
                f"memory ({self.root} is not there on this machine)"
            )
        match = _KEY.fullmatch(key) if isinstance(key, str) else None
        if match is None or match.group(1) in (".", ".."):
            raise SharedMemoryError(
                f"shared memory region {name!r}: key {key!r} is not the name of a POSIX "
                "shared-memory object (expected '/name' with letters, digits, '.', '_', '-')"
            )
        return self.root / match.group(1)

    def unregister(self, name: str | None = None) -> None:
        """Drop region ``name`` (None: every region). A name that is not registered is
        no error (Triton's behaviour: unregistering is idempotent)."""
        names = list(self._regions) if name is None else [name]
        for each in names:
            region = self._regions.pop(each, None)
            if region is not None:
                region.close()

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        """``[{"name", "key", "offset", "byte_size"}]`` of region ``name`` (None: all).

        Raises:
            SharedMemoryError: NOT_FOUND, no region of that name.
        """
        if name is not None:
            self._find(name, "status")
        return [
            {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
            for r in self._regions.values()
            if name is None or r.name == name
        ]

    def _find(self, name: str, what: str) -> _Region:
        region = self._regions.get(name)
        if region is None:
            known = ", ".join(map(repr, self._regions)) or "none"
            raise SharedMemoryError(
                f"{what}: Unable to find system shared memory region: {name!r} "
                f"(registered: {known})"
            )
        return region

    def read(self, input_name: str, shared: SharedInput) -> np.ndarray:
        """The array of input ``input_name`` from its region: a read-only view of the
        shared memory (a new array for BYTES, whose elements are length-prefixed).

        Raises:
            SharedMemoryError: an unknown region, a window outside it, or a byte size
                that disagrees with the datatype and shape.
        """
        what = f"input {input_name!r}"
        region = self._find(shared.ref.region, what)
        start, size = region.window(shared.ref, what)
        count = math.prod(shared.shape)
        if shared.datatype == "BYTES":
            items = _unpack_bytes(what, memoryview(region.mapping)[start : start + size])
            if len(items) != count:
                raise SharedMemoryError(
                    f"{what}: {len(items)} strings in shared memory region "
                    f"{region.name!r}, the shape {list(shared.shape)} needs {count}"
                )
            array = np.empty(count, dtype=object)
            array[:] = items
            return array.reshape(shared.shape)
        wire = _LITTLE_ENDIAN[shared.datatype]
        if size != count * wire.itemsize:
            raise SharedMemoryError(
                f"{what}: unexpected total byte size {size} in shared memory region "
                f"{region.name!r}, expecting {count * wire.itemsize} for shape "
                f"{list(shared.shape)} of {shared.datatype}"
            )
        view = np.frombuffer(region.mapping, wire, count, start)
        array = view.astype(DATATYPES[shared.datatype], copy=False).reshape(shared.shape)
        array.flags.writeable = False  # the client's memory: the model must not write it
        return array

    def write(self, output_name: str, ref: SharedMemoryRef, array: np.ndarray) -> int:
        """Write output ``output_name`` into its region; the bytes written.

        Raises:
            SharedMemoryError: an unknown region, a window outside it, or a window too
                small for the output.
        """
        what = f"output {output_name!r}"
        region = self._find(ref.region, what)
        start, size = region.window(ref, what)
        if array.dtype.kind in "OSU":
            data = _pack_bytes(array)
            needed = len(data)
        else:
            needed = array.nbytes
        if needed > size:
            raise SharedMemoryError(
                f"{what}: shared memory size specified with the request ({size} bytes in "
                f"region {region.name!r}) should be at least {needed} bytes to hold the results"
            )
        if array.dtype.kind in "OSU":
            region.mapping[start : start + needed] = data
        else:
            wire = array.dtype.newbyteorder("<")
            target = np.frombuffer(region.mapping, wire, array.size, start)
            target[...] = array.reshape(-1)
        return needed

    def close(self) -> None:
        """Unregister every region."""
        self.unregister()


def _size(name: str, label: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SharedMemoryError(
            f"shared memory region {name!r}: {label} must be an integer >= 0, got {value!r}"
        )
    return value


def _unpack_bytes(what: str, data: memoryview) -> list[bytes]:
    items, offset = [], 0
    while offset < len(data):
        if offset + 4 > len(data):
            raise SharedMemoryError(f"{what}: truncated BYTES element length in shared memory")
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if offset + length > len(data):
            raise SharedMemoryError(f"{what}: truncated BYTES element in shared memory")
        items.append(bytes(data[offset : offset + length]))
        offset += length
    return items


def _pack_bytes(array: np.ndarray) -> bytes:
    parts = []
    for item in array.reshape(-1):
        raw = item if isinstance(item, bytes) else str(item).encode()
        parts.append(struct.pack("<I", len(raw)) + raw)
    return b"".join(parts)
