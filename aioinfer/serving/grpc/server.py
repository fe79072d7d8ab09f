"""The gRPC adapter: KServe v2 gRPC (``inference.GRPCInferenceService``) over the model
service, on ``grpcio``'s asyncio server.

Like the REST adapter it translates and decides nothing: an RPC becomes calls of the
:class:`~aioinfer.serving.service.InferenceService` (its ``call`` context: find, admit,
count; in it, infer), tensors are decoded and encoded by
:mod:`aioinfer.serving.grpc.tensors`, and the kind of every
:class:`~aioinfer.errors.ServiceError` becomes a gRPC status code through one
table, :data:`GRPC_STATUS`, with the message REST answers. It runs on the event loop of
the REST server (``serve(..., grpc_port=...)``), so that both transports share the
models, their batches, admission, sequences and statistics.

What is gRPC's alone stays here: a cancelled call (the client cancelled it, its deadline
passed or its connection closed) cancels the handler's task, and with it the inference
between two kernels; ``ModelStreamInfer`` answers each request of a stream in order, an
error as ``error_message`` without ending the stream, a generation token by token
(:mod:`aioinfer.serving.grpc.generation`); TLS, message size and connection
limits are the server's options (:class:`GrpcServer`).

grpc.aio is asyncio's: the gRPC server runs under asyncio only (the REST app also runs
under trio).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from aioinfer.errors import ErrorKind, ServiceError, ServingConfigError
from aioinfer.serving.connection import ConnectionLimits
from aioinfer.serving.grpc import extensions
from aioinfer.serving.grpc.auth import GrpcApiKeyCheck
from aioinfer.serving.grpc.generation import (
    FINAL_RESPONSE,
    generate_response,
    generation_of,
    stream_error,
    stream_generation,
)
from aioinfer.serving.grpc.tensors import decode_infer_request, encode_infer_response
from aioinfer.serving.messages import TensorMetadata
from aioinfer.serving.service import InferenceService

_logger = logging.getLogger(__name__)

GRPC_STATUS: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,  # gRPC's own for a large message
    ErrorKind.UNSUPPORTED_MEDIA: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorKind.ABORTED: grpc.StatusCode.UNAVAILABLE,  # shutdown: retry elsewhere, as REST's 503
    ErrorKind.INTERNAL: grpc.StatusCode.INTERNAL,
}
"""The gRPC status code that ends a call for each kind of
:class:`~aioinfer.errors.ServiceError`."""

NOT_YET = {
    "TraceSetting": "Triton's trace settings",
    "LogSettings": "Triton's log settings",
}
"""The RPCs of Triton's service this server does not implement, and what they belong
to: each ends with UNIMPLEMENTED, naming it."""

_StreamResponse = service_pb2.ModelStreamInferResponse


class GrpcAdapter(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The RPCs of ``inference.GRPCInferenceService`` over one service."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service

    # -- health and metadata ----------------------------------------------------------------

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerLiveResponse(live=self.service.live())

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.service.ready())

    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Not ready for a model or version that is not served (as Triton answers)."""
        service = self.service
        try:
            model = service.find(request.name, request.version or None)
        except ServiceError:
            return service_pb2.ModelReadyResponse(ready=False)
        return service_pb2.ModelReadyResponse(ready=service.model_ready(model))

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        metadata = self.service.server_metadata()
        return service_pb2.ServerMetadataResponse(
            name=metadata.name, version=metadata.version, extensions=metadata.extensions
        )

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        service = self.service
        try:
            metadata = service.model_metadata(service.find(request.name, request.version or None))
        except ServiceError as exc:
            await context.abort(GRPC_STATUS[exc.kind], str(exc))
        return service_pb2.ModelMetadataResponse(
            name=metadata.name,
            versions=metadata.versions,
            platform=metadata.platform,
            inputs=[_tensor_metadata(tensor) for tensor in metadata.inputs],
            outputs=[_tensor_metadata(tensor) for tensor in metadata.outputs],
        )

    # -- inference --------------------------------------------------------------------------

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """One inference; a generation answered whole (see ``serving/grpc/generation.py``)."""
        try:
            generation = generation_of(self.service, request)
            if generation is not None:
                return await generate_response(self.service, request, generation)
            return await self._infer(request)
        except ServiceError as exc:
            await context.abort(GRPC_STATUS[exc.kind], str(exc))

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        """Each request of the stream answered in order, once the one before is: the
        requests of a sequence keep their order whatever the batching. An error ends that
        request only (``error_message``, with the request's model and id)."""
        async for request in request_iterator:
            async for response in self._stream_answers(request):
                yield response

    async def _stream_answers(self, request: Any) -> AsyncIterator[Any]:
        """The responses a stream gets for ``request``: one inference, one response; a
        generation, one per token (see ``serving/grpc/generation.py``). The last one for
        the request has ``triton_final_response``, as Triton marks them."""
        generation = generation_of(self.service, request)
        if generation is not None:
            async for response in stream_generation(self.service, request, generation):
                yield response
            return
        try:
            response = await self._infer(request)
        except ServiceError as exc:
            yield stream_error(request, exc)
        else:
            response.parameters[FINAL_RESPONSE].bool_param = True
            yield _StreamResponse(infer_response=response)

    async def _infer(self, message: Any) -> Any:
        """One ``ModelInferRequest`` through the service: its ``ModelInferResponse``.

        Raises:
            ServiceError: the service's (see :meth:`InferenceService.start` and
                :meth:`InferCall.infer`), a malformed request, or INTERNAL.
        """
        async with self.service.call(message.model_name, message.model_version or None) as call:
            request = decode_infer_request(message, call.model.input_datatypes)
            return encode_infer_response(await call.infer(request))

    # -- Triton's extensions: thin calls of the service's methods (extensions.py) --------

    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._extension(extensions.model_config, request, context)

    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._extension(extensions.model_statistics, request, context)

    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._extension(extensions.repository_index, request, context)

    async def RepositoryModelLoad(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._extension(extensions.load_model, request, context)

    async def RepositoryModelUnload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._extension(extensions.unload_model, request, context)

    async def SystemSharedMemoryStatus(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        return await self._extension(extensions.system_shared_memory_status, request, context)

    async def SystemSharedMemoryRegister(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        return await self._extension(extensions.system_shared_memory_register, request, context)

    async def SystemSharedMemoryUnregister(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        return await self._extension(extensions.system_shared_memory_unregister, request, context)

    async def CudaSharedMemoryStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._extension(extensions.cuda_shared_memory_status, request, context)

    async def CudaSharedMemoryRegister(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        return await self._extension(extensions.cuda_shared_memory_register, request, context)

    async def CudaSharedMemoryUnregister(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        return await self._extension(extensions.cuda_shared_memory_unregister, request, context)

    async def _extension(
        self,
        rpc: Callable[[InferenceService, Any], Awaitable[Any]],
        request: Any,
        context: grpc.aio.ServicerContext,
    ) -> Any:
        """The answer of ``rpc`` (a function of ``serving/grpc/extensions.py``); its
        error as the call's status, with REST's message."""
        try:
            return await rpc(self.service, request)
        except ServiceError as exc:
            await context.abort(GRPC_STATUS[exc.kind], str(exc))
        except Exception as exc:  # a fault of the server's, not of the request
            _logger.exception("%s request", type(request).__name__)
            message = f"internal server error: {type(exc).__name__}: {exc}"
            await context.abort(GRPC_STATUS[ErrorKind.INTERNAL], message)

    # -- not implemented ----------------------------------------------------------------------

    async def TraceSetting(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _not_yet("TraceSetting", context)

    async def LogSettings(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _not_yet("LogSettings", context)


def _tensor_metadata(tensor: TensorMetadata) -> Any:
    return service_pb2.ModelMetadataResponse.TensorMetadata(
        name=tensor.name, datatype=tensor.datatype, shape=tensor.shape
    )


async def _not_yet(method: str, context: grpc.aio.ServicerContext) -> None:
    await context.abort(
        grpc.StatusCode.UNIMPLEMENTED,
        f"{method} is not implemented by this server: it belongs to {NOT_YET[method]}",
    )


class GrpcServer:
    """``service`` over gRPC on ``host:port`` (port 0: any free port), on the running
    asyncio event loop; an async context manager (started on entry, stopped on exit), or
    :meth:`start` and :meth:`stop`.

    The service's lifespan (compile the models, drain at the end) is the caller's: the
    REST app's under :func:`~aioinfer.serving.serve`, or
    ``async with service.lifespan():`` around the server.

    Args:
        service: the models to serve.
        host: the address to listen on.
        port: the port to listen on (0: any; :attr:`port` says which after the start).
        limits: the connection limits (the REST server's): ``max_header_bytes`` bounds a
            call's metadata, ``header_timeout`` a connection's handshake,
            ``limit_concurrency`` the RPCs that run at once (beyond:
            RESOURCE_EXHAUSTED). Messages larger than the service's
            ``max_request_bytes`` are refused (RESOURCE_EXHAUSTED).
        ssl_certfile: a PEM certificate (chain): serve over TLS.
        ssl_keyfile: its PEM private key (default: in ``ssl_certfile``).
        api_key: every RPC but ServerLive and ServerReady needs this key in its metadata
            (see ``serving/grpc/auth.py``).

    Raises:
        ServingConfigError: ``ssl_keyfile`` without ``ssl_certfile``, a TLS file that
            cannot be read, or an empty ``api_key``.
    """

    def __init__(
        self,
        service: InferenceService,
        host: str = "127.0.0.1",
        port: int = 8001,
        *,
        limits: ConnectionLimits | None = None,
        ssl_certfile: str | Path | None = None,
        ssl_keyfile: str | Path | None = None,
        api_key: str | None = None,
    ) -> None:
        self.service = service
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.port = port
        """The port served (the one chosen once started, when asked for 0)."""
        self.limits = limits or ConnectionLimits()
        self._credentials = _server_credentials(ssl_certfile, ssl_keyfile)
        self._interceptors = [] if api_key is None else [GrpcApiKeyCheck(api_key)]
        self._server: grpc.aio.Server | None = None

    @property
    def secure(self) -> bool:
        """Whether the server speaks TLS."""
        return self._credentials is not None

    async def start(self) -> int:
        """Listen and serve; return the port.

        Raises:
            ServingConfigError: the address cannot be bound.
        """
        limits = self.limits
        options = [
            ("grpc.max_receive_message_length", self.service.max_request_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.max_metadata_size", limits.max_header_bytes),
            ("grpc.absolute_max_metadata_size", limits.max_header_bytes),
            ("grpc.server_handshake_timeout_ms", int(limits.header_timeout * 1000)),
            ("grpc.so_reuseport", 0),  # a port in use is an error, not a shared port
        ]
        server = grpc.aio.server(
            interceptors=self._interceptors,
            options=options,
            maximum_concurrent_rpcs=limits.limit_concurrency,
        )
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
            GrpcAdapter(self.service), server
        )
        try:
            if self._credentials is None:
                port = server.add_insecure_port(self.address)
            else:
                port = server.add_secure_port(self.address, self._credentials)
        except RuntimeError as exc:
            raise ServingConfigError(f"cannot serve gRPC on {self.address}: {exc}") from None
        await server.start()
        self._server = server
        self.port = port
        return port

    async def stop(self, grace: float | None = None) -> None:
        """Stop serving: calls still running get ``grace`` seconds to end (None: they
        are cancelled now)."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)

    async def __aenter__(self) -> GrpcServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()


def _server_credentials(
    certfile: str | Path | None, keyfile: str | Path | None
) -> grpc.ServerCredentials | None:
    if certfile is None:
        if keyfile is not None:
            raise ServingConfigError("ssl_keyfile needs ssl_certfile (the server's certificate)")
        return None
    pems = []
    for name, path in (("ssl_certfile", certfile), ("ssl_keyfile", keyfile or certfile)):
        try:
            pems.append(Path(path).read_bytes())
        except OSError as exc:
            raise ServingConfigError(f"{name} {str(path)!r} cannot be read: {exc}") from None
    chain, key = pems
    return grpc.ssl_server_credentials([(key, chain)])
