"""aioinfer: an asyncio-native inference runtime for ONNX models.

``Core().compile_model("model.onnx", "CPU")`` compiles a model;
``await compiled.create_infer_request().infer({"x": x})`` runs it without stalling the
event loop.
"""

from aioinfer.core import Core
from aioinfer.errors import (
    AioinferError,
    CompileError,
    InferCancelledError,
    InferenceError,
    InputError,
    InputShapeError,
    InputTypeError,
    InvalidModelError,
    InvalidPropertyValueError,
    MissingInputError,
    ModelNotFoundError,
    ModelReadError,
    PropertyError,
    ReadOnlyPropertyError,
    RequestBusyError,
    RequestClosedError,
    UnknownDeviceError,
    UnknownInputError,
    UnknownPropertyError,
    UnsupportedOperatorError,
)
from aioinfer.model import Model, Port
from aioinfer.plugin.async_request import AsyncInferRequest, RequestState
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.queue import AsyncInferQueue
from aioinfer.results import InferResults

__version__ = "0.1.0"

InferRequest = AsyncInferRequest
"""The request type users hold (``compiled.create_infer_request()``)."""

__all__ = [
    "AioinferError",
    "AsyncInferQueue",
    "AsyncInferRequest",
    "CompileError",
    "CompiledModel",
    "Core",
    "InferCancelledError",
    "InferRequest",
    "InferResults",
    "InferenceError",
    "InputError",
    "InputShapeError",
    "InputTypeError",
    "InvalidModelError",
    "InvalidPropertyValueError",
    "MissingInputError",
    "Model",
    "ModelNotFoundError",
    "ModelReadError",
    "Port",
    "PropertyError",
    "ReadOnlyPropertyError",
    "RequestBusyError",
    "RequestClosedError",
    "RequestState",
    "UnknownDeviceError",
    "UnknownInputError",
    "UnknownPropertyError",
    "UnsupportedOperatorError",
    "__version__",
]
