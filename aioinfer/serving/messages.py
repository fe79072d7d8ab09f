"""What the model service takes and gives, whatever the transport.

A transport adapter (REST, gRPC, a Ray Serve ingress) decodes its wire format into an
:class:`InferenceRequest` (tensors as numpy arrays, the outputs asked for, the request's
parameters), and encodes the :class:`InferenceResponse` the service answers. Datatypes
are the Open Inference Protocol's names (``FP32``, ``BYTES``...), the same on every
transport of the protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aioinfer.errors import ErrorKind, ServiceError, SharedMemoryError
from aioinfer.model import Port

DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
"""Protocol datatype -> numpy dtype (``BYTES``: an object array of strings)."""

_NAMES = {dtype: name for name, dtype in DATATYPES.items()}


def datatype(dtype: np.dtype) -> str:
    """The protocol datatype of a numpy dtype (strings are ``BYTES``).

    Raises:
        ServiceError: INVALID_ARGUMENT, no protocol datatype for it.
    """
    if dtype.kind in "OSU":
        return "BYTES"
    try:
        return _NAMES[dtype]
    except KeyError:
        raise ServiceError(
            f"element type {dtype} has no Open Inference Protocol datatype",
            ErrorKind.INVALID_ARGUMENT,
        ) from None


@dataclass(frozen=True)
class TensorMetadata:
    """A model input or output as the protocol describes it; -1 marks a dynamic
    dimension."""

    name: str
    datatype: str
    shape: list[int]

    @classmethod
    def of(cls, port: Port) -> TensorMetadata:
        """The metadata of a compiled model's port."""
        if port.shape is None:
            shape = [-1]
        else:
            shape = [d if isinstance(d, int) else -1 for d in port.shape]
        return cls(port.name, datatype(port.dtype), shape)


@dataclass(frozen=True)
class ModelMetadata:
    """One model version: its name, every version served, its platform and tensors."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


@dataclass(frozen=True)
class ServerMetadata:
    """The server's name, version and the protocol extensions the service implements."""

    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True)
class SharedMemoryRef:
    """Where a tensor lies in a registered system shared-memory region: ``byte_size``
    bytes from ``offset`` (relative to the region's start)."""

    region: str
    byte_size: int
    offset: int = 0

    @classmethod
    def from_parameters(cls, parameters: dict[str, Any], what: str) -> SharedMemoryRef | None:
        """The reference that a tensor's parameters make (``shared_memory_region``,
        ``shared_memory_byte_size``, ``shared_memory_offset``); None when they name no
        region.

        Raises:
            SharedMemoryError: a region name that is not a string, or a size or offset
                that is not an integer >= 0 (naming ``what``, the tensor).
        """
        region = parameters.get("shared_memory_region")
        if region is None:
            return None
        if not isinstance(region, str) or not region:
            raise SharedMemoryError(
                f"{what}: shared_memory_region must be a region name, got {region!r}"
            )
        numbers = []
        for key, default in (("shared_memory_byte_size", None), ("shared_memory_offset", 0)):
            value = parameters.get(key, default)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise SharedMemoryError(
                    f"{what}: {key} must be an integer >= 0 with shared_memory_region "
                    f"{region!r}, got {value!r}"
                )
            numbers.append(value)
        return cls(region, numbers[0], numbers[1])


@dataclass(frozen=True)
class SharedInput:
    """An input whose data lies in shared memory: where, and its datatype and shape (the
    service reads it from the region)."""

    ref: SharedMemoryRef
    datatype: str
    shape: tuple[int, ...]


@dataclass
class RequestedOutput:
    """An output a request asks for, whether it wants it as binary data, and the
    shared-memory region to write it to (None: in the response)."""

    name: str
    binary: bool
    shared_memory: SharedMemoryRef | None = None


@dataclass
class InferenceRequest:
    """One decoded infer request."""

    id: str | None
    parameters: dict[str, Any]
    """The request's parameters (``sequence_id``, ``sequence_start``, ``sequence_end``
    route it to a sequence)."""
    inputs: dict[str, np.ndarray]
    outputs: list[RequestedOutput] | None = None
    """The outputs asked for (None: every output)."""
    binary_output: bool = False
    """The default for outputs not asked for by name (``binary_data_output``)."""
    shared_inputs: dict[str, SharedInput] = field(default_factory=dict)
    """The inputs whose data lies in shared memory, by name (not in ``inputs``)."""


@dataclass(slots=True)
class InferenceResponse:
    """The outputs of one inference, in the order asked for."""

    model_name: str
    model_version: str
    id: str | None
    outputs: list[tuple[str, np.ndarray, bool]]
    """(name, array, binary) per output."""
    queued_seconds: float = field(default=0.0, compare=False)
    """How long the inference waited before it computed (for a free request or a slot,
    then for its batch)."""
    shared_outputs: dict[str, SharedMemoryRef] = field(default_factory=dict, compare=False)
    """The outputs written to shared memory, by name (their arrays are in ``outputs``
    too; a transport answers their datatype and shape, not their data)."""
