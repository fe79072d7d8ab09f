"""KServe v2 gRPC tensors: a ``ModelInferRequest`` decoded into the service's
:class:`~aioinfer.serving.messages.InferenceRequest`, an
:class:`~aioinfer.serving.messages.InferenceResponse` encoded as a ``ModelInferResponse``.

The messages are tritonclient's generated protocol modules (``service_pb2``), so that the
server and the clients read the same ``.proto``. An input's values come either from
``raw_input_contents`` (one entry per input, in input order: little-endian values, or for
BYTES each element as a 4-byte little-endian length and its bytes; what tritonclient
sends) or from the typed field of ``contents`` that its datatype uses. Outputs always go in
``raw_output_contents``: tritonclient cannot decode typed output contents. The checks and
their messages are the REST decoder's (:mod:`aioinfer.serving.protocol`), so that a client
reads the same refusal on either transport.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from aioinfer.errors import ProtocolError
from aioinfer.serving.json_values import object_array
from aioinfer.serving.messages import (
    DATATYPES,
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    SharedInput,
    SharedMemoryRef,
    datatype,
)
from aioinfer.serving.protocol import (
    MAX_ELEMENTS,
    MAX_RANK,
    tensor_from_bytes,
    tensor_to_bytes,
)

ModelInferRequest = service_pb2.ModelInferRequest
ModelInferResponse = service_pb2.ModelInferResponse
_OutputTensor = service_pb2.ModelInferResponse.InferOutputTensor

CONTENTS_FIELDS: dict[str, str] = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""The field of ``InferTensorContents`` that holds each datatype's values (FP16 has
none: it comes in ``raw_input_contents`` only)."""


def decode_infer_request(message: Any, inputs: Mapping[str, str]) -> InferenceRequest:
    """Decode a ``ModelInferRequest`` against the model's inputs (name -> datatype).

    Every output is answered in ``raw_output_contents`` (binary) or in its
    shared-memory region, the outputs asked for when the message names some, else every
    output.

    Raises:
        ProtocolError: an unknown, repeated or missing input, a datatype or shape that
            disagrees with the data or the model, raw contents that are not one per
            input outside shared memory, or a typed value out of its datatype's range.
        SharedMemoryError: a tensor's shared-memory parameters that are not a region
            name, and a size and offset >= 0.
    """
    raw = message.raw_input_contents
    tensors = message.inputs
    regions = [_region(tensor.parameters, "input", tensor.name) for tensor in tensors]
    in_message = len(tensors) - sum(region is not None for region in regions)
    if raw and len(raw) != in_message:
        shared = " not in shared memory" * (in_message < len(tensors))
        raise ProtocolError(
            f"raw_input_contents has {len(raw)} entries for {in_message} inputs{shared}: "
            "give one per input, in input order, or none"
        )
    raw_entries = iter(raw)
    arrays: dict[str, np.ndarray] = {}
    shared_inputs: dict[str, SharedInput] = {}
    for tensor, region in zip(tensors, regions):
        name = tensor.name
        expected = inputs.get(name)
        if expected is None:
            known = ", ".join(map(repr, inputs)) or "none"
            raise ProtocolError(f"the model has no input named {name!r}; its inputs are {known}")
        if tensor.datatype != expected:
            raise ProtocolError(
                f"input {name!r}: datatype {tensor.datatype!r} given, the model takes {expected}"
            )
        if name in arrays or name in shared_inputs:
            raise ProtocolError(f"input {name!r} is given twice")
        shape, count = _shape(name, tensor.shape)
        if region is not None:  # read by the service from the region
            shared_inputs[name] = SharedInput(region, expected, tuple(shape))
            continue
        if raw:
            flat = tensor_from_bytes(name, next(raw_entries), expected, count)
        else:
            flat = _from_contents(name, tensor.contents, expected, count)
        arrays[name] = flat.reshape(shape)
    missing = [name for name in inputs if name not in arrays and name not in shared_inputs]
    if missing:
        raise ProtocolError(f"missing input(s) {', '.join(map(repr, missing))}")
    outputs = message.outputs
    requested = [
        RequestedOutput(output.name, True, _region(output.parameters, "output", output.name))
        for output in outputs
    ]
    parameters = _parameters(message.parameters) if message.parameters else {}
    return InferenceRequest(
        message.id or None, parameters, arrays, requested or None, True, shared_inputs
    )


def encode_infer_response(response: InferenceResponse) -> Any:
    """The ``ModelInferResponse`` of ``response``: every output in
    ``raw_output_contents``."""
    outputs = []
    contents = []
    shared = response.shared_outputs
    for name, array, _ in response.outputs:
        output = _OutputTensor(name=name, datatype=datatype(array.dtype), shape=array.shape)
        region = shared.get(name) if shared else None
        if region is None:
            contents.append(tensor_to_bytes(array))
        else:  # in its region: an empty entry keeps the others at their output's index
            _set_region(output.parameters, region, array)
            contents.append(b"")
        outputs.append(output)
    return ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id or "",
        outputs=outputs,
        raw_output_contents=contents,
    )


def _region(parameters: Any, kind: str, name: str) -> SharedMemoryRef | None:
    """The shared-memory region that the parameters of ``kind`` (input or output)
    ``name`` name (None: no region)."""
    if not parameters or "shared_memory_region" not in parameters:
        return None
    return SharedMemoryRef.from_parameters(_parameters(parameters), f"{kind} {name!r}")


def _shape(name: str, dims: Any) -> tuple[list[int], int]:
    """The shape ``dims`` as a list, and its element count."""
    shape = list(dims)
    if shape and min(shape) < 0:
        raise ProtocolError(f"input {name!r}: 'shape' must be a list of integers >= 0, got {shape}")
    if len(shape) > MAX_RANK:
        raise ProtocolError(
            f"input {name!r}: 'shape' has {len(shape)} dimensions, at most {MAX_RANK} are supported"
        )
    count = math.prod(shape)
    # A shape with a zero dimension holds no elements, but its other ones still count.
    if count > MAX_ELEMENTS or (not count and math.prod([d or 1 for d in shape]) > MAX_ELEMENTS):
        raise ProtocolError(f"input {name!r}: 'shape' {shape} is too large")
    return shape, count


def _from_contents(name: str, contents: Any, kind: str, count: int) -> np.ndarray:
    field = CONTENTS_FIELDS.get(kind)
    if field is None:
        raise ProtocolError(
            f"input {name!r}: {kind} has no typed contents field; send it in raw_input_contents"
        )
    values = getattr(contents, field)
    if len(values) != count:
        raise ProtocolError(
            f"input {name!r}: {len(values)} values in contents.{field}, the shape needs {count}"
        )
    if kind == "BYTES":
        return object_array(list(values))
    dtype = DATATYPES[kind]
    if dtype.kind not in "iu" or dtype.itemsize >= 4:
        return np.array(values, dtype)  # the field's own type: every value fits
    wide = np.array(values, np.int64)
    narrow = wide.astype(dtype)
    if count and (narrow != wide).any():
        index = int(np.argmax(narrow != wide))
        info = np.iinfo(dtype)
        raise ProtocolError(
            f"input {name!r}: element {index} of contents.{field} is {wide[index]}, out of "
            f"the range of {kind} [{info.min}, {info.max}]"
        )
    return narrow


def _parameters(parameters: Any) -> dict[str, Any]:
    """``InferParameter`` values by name (an empty one, with no value set, is left out)."""
    values = {}
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        if choice is not None:
            values[key] = getattr(parameter, choice)
    return values


def _set_region(parameters: Any, region: SharedMemoryRef, array: np.ndarray) -> None:
    """Name the region an output was written to in its parameters, as REST does."""
    size = len(tensor_to_bytes(array)) if array.dtype.kind in "OSU" else array.nbytes
    parameters["shared_memory_region"].string_param = region.region
    parameters["shared_memory_byte_size"].int64_param = size
    if region.offset:
        parameters["shared_memory_offset"].int64_param = region.offset
