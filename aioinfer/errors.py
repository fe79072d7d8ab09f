"""The aioinfer exception hierarchy.

Every failure a user can cause raises one of these, with a message that names what was
wrong, what was expected and what was given. Catch :class:`AioinferError` for all of
them; the request, compiled model and core stay usable after any of them.
"""

from __future__ import annotations


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


# -- serving ----------------------------------------------------------------------------


class RepositoryError(AioinferError):
    """A model repository (or one model's config file in it) cannot be served."""


class ServingConfigError(AioinferError, ValueError):
    """A server option that cannot be used: an empty API key, a limit out of range, a
    TLS key without its certificate."""
