"""The aioinfer exception hierarchy.

Every failure a user can cause raises one of these, with a message that names what was
wrong, what was expected and what was given. Catch :class:`AioinferError` for all of
them; the request, compiled model and core stay usable after any of them.
"""

from __future__ import annotations

import enum


class AioinferError(Exception):
    """Base class of every aioinfer error."""


# -- reading models ---------------------------------------------------------------------


class ModelReadError(AioinferError):
    """A model could not be read."""


class ModelNotFoundError(ModelReadError, FileNotFoundError):
    """The model path does not exist."""


class InvalidModelError(ModelReadError):
    """The data is not an ONNX model, is truncated, or fails ONNX's checks."""


# -- compiling --------------------------------------------------------------------------


class CompileError(AioinferError):
    """A model could not be compiled for a device."""


class UnsupportedOperatorError(CompileError):
    """The device has no kernel for an operator (or for its version)."""


class UnsupportedOpsetError(CompileError):
    """The model imports a version of the ``ai.onnx`` operator set newer than the device
    supports."""


class NotBatchableError(CompileError):
    """The BATCH device cannot batch the model: an input or output lacks a shared symbolic
    first (batch) dimension, or the model keeps state per request."""


class ExportError(AioinferError):
    """A compiled model cannot be exported (its device does not support export)."""


class ImportModelError(AioinferError):
    """A blob given to ``import_model`` cannot be imported."""


class InvalidBlobError(ImportModelError):
    """The data is not an aioinfer export blob, or the blob is truncated, corrupted (its
    checksum does not match, its header or model is malformed) or not self-contained
    (a tensor refers to external data)."""


class BlobVersionError(ImportModelError):
    """The blob was written in another export format version or by another aioinfer
    version."""


class BlobDeviceError(ImportModelError):
    """The blob was exported for another device."""


class UnknownDeviceError(AioinferError):
    """No device of that name is registered."""


class PropertyError(AioinferError):
    """A property name or value is not accepted."""


class UnknownPropertyError(PropertyError):
    """The device does not know that property."""


class InvalidPropertyValueError(PropertyError):
    """The property exists but the value is not valid for it."""


class ReadOnlyPropertyError(PropertyError):
    """The property can be read but not set."""


# -- inference --------------------------------------------------------------------------


class InputError(AioinferError, ValueError):
    """An input tensor given to a request is not acceptable."""


class UnknownInputError(InputError, KeyError):
    """No input or output port has that name or index."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class MissingInputError(InputError):
    """An inference started without a value for a model input."""


class InputTypeError(InputError, TypeError):
    """An input tensor has the wrong element type."""


class InputShapeError(InputError):
    """An input tensor has the wrong rank or a dimension that disagrees with the model."""


class InferenceError(AioinferError):
    """A kernel failed while running the model; the message names the node."""


class DeviceUnavailableError(InferenceError):
    """The device could not run the inference, through no fault of its inputs: the same
    request can be retried (the device is recovering, e.g. replacing a worker process).
    The server answers it with HTTP 503."""


class WorkerDiedError(DeviceUnavailableError):
    """The PROCESS device's worker process died (killed, out of memory) before the
    inference completed; the message names its pid and exit code or signal. A new
    worker is started: retry."""


class WorkerTimeoutError(DeviceUnavailableError, TimeoutError):
    """The PROCESS device's worker process stopped answering its heartbeat for
    ``WORKER_TIMEOUT_S`` seconds and was killed before the inference completed. A new
    worker is started: retry."""


class InferCancelledError(AioinferError):
    """The inference was stopped by ``request.cancel()`` before it completed."""


class RequestBusyError(AioinferError):
    """An inference was started on a request that is already running one."""


class RequestClosedError(AioinferError):
    """The request, compiled model or queue was closed."""


class GenerationError(AioinferError, ValueError):
    """``generate()`` cannot run with these settings: a generate config that names a port
    the model lacks (or one of the wrong kind), a model input it would not feed, or an
    argument out of range (the message names it, what was expected and what was given)."""


class QueueFullError(AioinferError):
    """A generation cannot wait for a place in its decoder's running batch: as many
    generations wait already as the scheduler's ``max_waiting_sequences`` allows. Nothing
    started; retry later."""


# -- text pipelines ---------------------------------------------------------------------


class ModelFolderError(ModelReadError):
    """A model folder that a text pipeline cannot use: no ONNX model or tokenizer in it, a
    layout it does not recognize, a pooling or module it does not support, or a model
    without the inputs and outputs the pipeline feeds and reads (the message names the
    folder, the file and what was expected)."""


class TextInputError(InputError):
    """Texts given to a text pipeline that it cannot take: an empty list, an empty
    query, an unknown prompt name, ``dimensions`` out of range."""


class TextTypeError(TextInputError, TypeError):
    """A text given to a text pipeline is not a string (the message names its index and
    type)."""


class TextTooLongError(TextInputError):
    """A text has more tokens than the model's maximum length and truncation was turned
    off (the message names its index, its token count and the maximum)."""


class ChatTemplateError(TextInputError):
    """Chat messages that cannot become a prompt: the model has no chat template, the
    template raised (``raise_exception``: messages in an order or of a role it does not
    take) or failed to render, or a message is not what a chat takes (the message names
    the role, the field or the template's own words)."""


class TextGenerationError(TextInputError):
    """A text generation argument that cannot be used: a stop string that is not a
    string, a prompt that is neither text nor token ids, text without a tokenizer (the
    message names the argument, the expected and the actual)."""


# -- serving ----------------------------------------------------------------------------


class RepositoryError(AioinferError):
    """A model repository (or one model's config file in it) cannot be served."""


class ServingConfigError(AioinferError, ValueError):
    """A server option that cannot be used: an empty API key, a limit out of range, a
    TLS key without its certificate."""


class RayDeploymentError(AioinferError):
    """Ray Serve could not deploy the application of ``aioinfer.ray`` (a replica could
    not load its model: the message names the deployment and the cause)."""


class RayPlacementError(RayDeploymentError):
    """The replicas of ``aioinfer.ray``'s application ask for more resources (CPUs, GPUs,
    memory) than the Ray cluster has: the message names each model, what it asks for and
    what the cluster has."""


class ErrorKind(enum.Enum):
    """Why the model service refused or failed a request, whatever the transport: REST
    answers each kind with an HTTP status, gRPC with a status code (one table each)."""

    INVALID_ARGUMENT = "invalid_argument"
    """The request is malformed or does not fit the model (the client's to fix)."""
    NOT_FOUND = "not_found"
    """No such model or version is served."""
    TOO_LARGE = "too_large"
    """The request is larger than the server accepts."""
    UNSUPPORTED_MEDIA = "unsupported_media"
    """The request comes in an encoding the server does not read."""
    UNAUTHENTICATED = "unauthenticated"
    """The request lacks valid credentials."""
    UNAVAILABLE = "unavailable"
    """The model is at capacity, the server is shutting down, or the model's device failed
    and recovers (a :class:`DeviceUnavailableError`): try again later."""
    RESOURCE_EXHAUSTED = "resource_exhausted"
    """A limit of the model is reached (its open sequences)."""
    CANCELLED = "cancelled"
    """The client went away; its work was stopped."""
    ABORTED = "aborted"
    """The server stopped the work: the model was closed under it (shutdown)."""
    INTERNAL = "internal"
    """A fault of the server, not of the request."""

    @classmethod
    def of(cls, error: BaseException) -> ErrorKind:
        """The kind of ``error``: a :class:`ServiceError`'s own; for an error of the
        runtime, the kind of the first class of :data:`RUNTIME_ERROR_KINDS` it is an
        instance of; INTERNAL for any other (a fault of the server)."""
        if isinstance(error, ServiceError):
            return error.kind
        for error_class, kind in RUNTIME_ERROR_KINDS:
            if isinstance(error, error_class):
                return kind
        return cls.INTERNAL


RUNTIME_ERROR_KINDS: tuple[tuple[type[AioinferError], ErrorKind], ...] = (
    (DeviceUnavailableError, ErrorKind.UNAVAILABLE),  # the device recovers: retryable
    (QueueFullError, ErrorKind.UNAVAILABLE),  # generations wait already: retryable
    (InputError, ErrorKind.INVALID_ARGUMENT),
    (InferenceError, ErrorKind.INVALID_ARGUMENT),  # a kernel failed on these inputs
    (RequestClosedError, ErrorKind.ABORTED),  # the model closed (shutdown)
    (InferCancelledError, ErrorKind.ABORTED),
)
"""The kind of each error of the runtime that an inference may raise, as
:meth:`ErrorKind.of` reads it (the first class that matches)."""


class ServiceError(AioinferError):
    """A request that the model service refuses or could not serve; :attr:`kind` says
    why, in terms every transport maps to its own (HTTP status, gRPC code)."""

    def __init__(self, message: str, kind: ErrorKind) -> None:
        super().__init__(message)
        self.kind = kind


class RequestFieldError(ServiceError):
    """A field of a request that the server refuses (INVALID_ARGUMENT): a value of the
    wrong type or out of range, or a field it does not support; :attr:`param` names it
    (``messages[1].content``) for the transports that say which (OpenAI's ``param``)."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message, ErrorKind.INVALID_ARGUMENT)
        self.param = param

    def __reduce__(self) -> tuple[type[ServiceError], tuple[str, ErrorKind]]:
        # Pickled with its kind (an error crossing a process: a Ray replica's answer).
        return type(self), (str(self), self.kind)


class ProtocolError(ServiceError):
    """A request whose wire encoding is malformed: its body, its tensors, its headers
    (INVALID_ARGUMENT unless said otherwise: TOO_LARGE, UNSUPPORTED_MEDIA)."""

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.INVALID_ARGUMENT) -> None:
        super().__init__(message, kind)


class ClientDisconnectedError(ServiceError):
    """The client went away before its answer was ready (its work was cancelled)."""

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.CANCELLED) -> None:
        super().__init__(message, kind)


class SharedMemoryError(ServiceError):
    """A shared-memory region that cannot be registered or used: a key outside POSIX
    shared memory, a region that does not exist or is too small, an unknown region, a
    tensor that does not fit its region (INVALID_ARGUMENT unless said otherwise)."""

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.INVALID_ARGUMENT) -> None:
        super().__init__(message, kind)


class ModelControlError(ServiceError):
    """A model that cannot be loaded or unloaded at run time: an unknown model, a config
    override that is not valid, a compile that failed, or a server whose model control
    mode does not allow it (INVALID_ARGUMENT unless said otherwise)."""

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.INVALID_ARGUMENT) -> None:
        super().__init__(message, kind)


class ModelMemoryError(ServiceError):
    """A model that does not fit the server's memory budget (or its own): it alone
    needs more than the budget, or the budget is held by models that cannot be unloaded
    (the message names both sizes; RESOURCE_EXHAUSTED unless said otherwise)."""

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.RESOURCE_EXHAUSTED) -> None:
        super().__init__(message, kind)
