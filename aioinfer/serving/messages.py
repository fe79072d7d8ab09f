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

from aioinfer.errors import ErrorKind, ServiceError
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


@dataclass
class RequestedOutput:
    """An output a request asks for, and whether it wants it as binary data."""

    name: str
    binary: bool


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
