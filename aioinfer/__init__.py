"""aioinfer: an asyncio-native inference runtime for ONNX models.

``Core().compile_model("model.onnx", "CPU")`` compiles a model;
``await compiled.create_infer_request().infer({"x": x})`` runs it without stalling the
event loop.
"""

from aioinfer._version import __version__
from aioinfer.core import Core, DeviceVersion, compile_model
from aioinfer.errors import (
    AioinferError,
    BlobDeviceError,
    BlobVersionError,
    ChatTemplateError,
    CompileError,
    DeviceUnavailableError,
    ExportError,
    GenerationError,
    ImportModelError,
    InferCancelledError,
    InferenceError,
    InputError,
    InputShapeError,
    InputTypeError,
    InvalidBlobError,
    InvalidModelError,
    InvalidPropertyValueError,
    MissingInputError,
    ModelFolderError,
    ModelNotFoundError,
    ModelReadError,
    NotBatchableError,
    PropertyError,
    QueueFullError,
    ReadOnlyPropertyError,
    RepositoryError,
    RequestBusyError,
    RequestClosedError,
    ServingConfigError,
    TextGenerationError,
    TextInputError,
    TextTooLongError,
    TextTypeError,
    UnknownDeviceError,
    UnknownInputError,
    UnknownPropertyError,
    UnsupportedOperatorError,
    UnsupportedOpsetError,
    WorkerDiedError,
    WorkerTimeoutError,
)
from aioinfer.generation import GenerationConfig, generate
from aioinfer.model import Model, Port
from aioinfer.pipelines import (
    BatchStatistics,
    RerankResult,
    TextEmbedder,
    TextReranker,
    TokenBatching,
)
from aioinfer.plugin.async_request import AsyncInferRequest, RequestState
from aioinfer.plugin.compiled_model import CompiledModel
from aioinfer.plugin.state import VariableState
from aioinfer.queue import AsyncInferQueue
from aioinfer.results import InferResults
from aioinfer.text.generator import TextGenerator, generate_text

InferRequest = AsyncInferRequest
"""The request type users hold (``compiled.create_infer_request()``)."""

__all__ = [
    "AioinferError",
    "AsyncInferQueue",
    "AsyncInferRequest",
    "BatchStatistics",
    "BlobDeviceError",
    "BlobVersionError",
    "ChatTemplateError",
    "CompileError",
    "CompiledModel",
    "Core",
    "DeviceUnavailableError",
    "DeviceVersion",
    "ExportError",
    "GenerationConfig",
    "GenerationError",
    "ImportModelError",
    "InferCancelledError",
    "InferRequest",
    "InferResults",
    "InferenceError",
    "InputError",
    "InputShapeError",
    "InputTypeError",
    "InvalidBlobError",
    "InvalidModelError",
    "InvalidPropertyValueError",
    "MissingInputError",
    "Model",
    "ModelFolderError",
    "ModelNotFoundError",
    "ModelReadError",
    "NotBatchableError",
    "Port",
    "PropertyError",
    "QueueFullError",
    "ReadOnlyPropertyError",
    "RepositoryError",
    "RequestBusyError",
    "RequestClosedError",
    "RequestState",
    "RerankResult",
    "ServingConfigError",
    "TextEmbedder",
    "TextGenerationError",
    "TextGenerator",
    "TextInputError",
    "TextReranker",
    "TextTooLongError",
    "TextTypeError",
    "TokenBatching",
    "UnknownDeviceError",
    "UnknownInputError",
    "UnknownPropertyError",
    "UnsupportedOperatorError",
    "UnsupportedOpsetError",
    "VariableState",
    "WorkerDiedError",
    "WorkerTimeoutError",
    "__version__",
    "compile_model",
    "generate",
    "generate_text",
]
