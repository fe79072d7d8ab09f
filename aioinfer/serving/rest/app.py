"""The REST adapter: the Open Inference Protocol (KServe v2 REST) over the model service.

An ASGI app that translates and decides nothing: an HTTP request becomes calls of the
:class:`~aioinfer.serving.service.InferenceService` (its ``call`` context: find, admit,
count; in it, infer), the body is decoded and the response encoded by
:mod:`aioinfer.serving.protocol`, and the kind of every
:class:`~aioinfer.errors.ServiceError` becomes an HTTP status through one
table, :data:`HTTP_STATUS`. What is HTTP's alone stays here: reading the body (the size
limit counted as it arrives), content codings, the binary tensor extension's headers, a
client's disconnect, the API key.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from aioinfer.core import Core
from aioinfer.errors import (
    ErrorKind,
    ProtocolError,
    ServiceError,
    SharedMemoryError,
)
from aioinfer.serving.control import check_no_model_files
from aioinfer.serving.metrics import CONTENT_TYPE
from aioinfer.serving.models import DEFAULT_MAX_SEQUENCES, ServedModel
from aioinfer.serving.openai import openai_routes
from aioinfer.serving.protocol import HEADER_LENGTH, RequestDecoder, encode_infer_response
from aioinfer.serving.repository import ModelConfig, ModelRepository
from aioinfer.serving.rest.auth import HEALTH_PATHS, ApiKeyCheck
from aioinfer.serving.rest.body import read_body
from aioinfer.serving.rest.compression import (
    compress,
    decompress,
    response_coding,
    worth_compressing,
)
from aioinfer.serving.rest.disconnect import unless_disconnected
from aioinfer.serving.rest.generation import generate_routes
from aioinfer.serving.service import InferenceService

_logger = logging.getLogger(__name__)

EXTENSIONS = ("binary_tensor_data", "generate")
"""The protocol extensions of REST alone (``GET /v2`` lists the service's too)."""

HTTP_STATUS: dict[ErrorKind, int] = {
    ErrorKind.INVALID_ARGUMENT: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.UNSUPPORTED_MEDIA: 415,
    ErrorKind.UNAUTHENTICATED: 401,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.RESOURCE_EXHAUSTED: 503,
    ErrorKind.CANCELLED: 499,  # the client closed the request (nginx's code)
    ErrorKind.ABORTED: 503,
    ErrorKind.INTERNAL: 500,
}
"""The HTTP status that answers each kind of :class:`~aioinfer.errors.ServiceError`."""


class RestAdapter:
    """The endpoints of the REST app over one service; per model, the decoder of its
    request bodies (which remembers the JSON headers of recent binary requests)."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service
        # Weak: a model the manager unloaded must not stay alive for its decoder.
        self._decoders: weakref.WeakKeyDictionary[ServedModel, RequestDecoder] = (
            weakref.WeakKeyDictionary()
        )

    @asynccontextmanager
    async def lifespan(self, app: Any = None) -> AsyncIterator[None]:
        """The service's lifespan (see :meth:`InferenceService.lifespan`)."""
        try:
            async with self.service.lifespan():
                yield
        finally:
            self._decoders.clear()  # a later lifespan serves new model objects

    def _new_decoder(self, model: ServedModel) -> RequestDecoder:
        decoder = self._decoders[model] = RequestDecoder(model.input_datatypes)
        return decoder

    # -- endpoints ------------------------------------------------------------------------

    async def live(self, request: Request) -> Response:
        return JSONResponse({"live": self.service.live()})

    async def ready(self, request: Request) -> Response:
        ready = self.service.ready()
        return JSONResponse({"ready": ready}, status_code=200 if ready else 400)

    async def server_metadata(self, request: Request) -> Response:
        metadata = self.service.server_metadata()
        extensions = [*EXTENSIONS, *metadata.extensions]
        return JSONResponse(
            {"name": metadata.name, "version": metadata.version, "extensions": extensions}
        )

    async def model_metadata(self, request: Request) -> Response:
        return JSONResponse(asdict(self.service.model_metadata(self._model_of(request))))

    async def model_ready(self, request: Request) -> Response:
        model = self._model_of(request)
        ready = self.service.model_ready(model)
        return JSONResponse({"name": model.name, "ready": ready}, status_code=200 if ready else 400)

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.service.metrics.render(), media_type=CONTENT_TYPE)

    # -- Triton's extensions: thin calls of the service's methods -------------------------

    async def model_config(self, request: Request) -> Response:
        return JSONResponse(self.service.model_config(self._model_of(request)))

    async def statistics(self, request: Request) -> Response:
        params = request.path_params
        return JSONResponse(self.service.statistics(params.get("model"), params.get("version")))

    async def repository_index(self, request: Request) -> Response:
        body = await _json_body(request)
        return JSONResponse(self.service.repository_index(bool(body.get("ready", False))))

    async def load_model(self, request: Request) -> Response:
        name = request.path_params["model"]
        parameters = _parameters_of(await _json_body(request))
        check_no_model_files(name, parameters)
        config = parameters.get("config")
        if config is not None and not isinstance(config, str):
            config = json.dumps(config)
        await self.service.load_model(name, config)
        return Response(status_code=200)

    async def unload_model(self, request: Request) -> Response:
        await self.service.unload_model(request.path_params["model"])
        return Response(status_code=200)

    async def shm_status(self, request: Request) -> Response:
        name = request.path_params.get("region")
        return JSONResponse(self.service.system_shared_memory_status(name))

    async def shm_register(self, request: Request) -> Response:
        name = request.path_params["region"]
        body = await _json_body(request)
        key = body.get("key")
        if not isinstance(key, str):
            raise SharedMemoryError(f"shared memory region {name!r}: 'key' must be a string")
        offset, byte_size = body.get("offset", 0), body.get("byte_size")
        self.service.register_system_shared_memory(name, key, offset, byte_size)
        return Response(status_code=200)

    async def shm_unregister(self, request: Request) -> Response:
        self.service.unregister_system_shared_memory(request.path_params.get("region"))
        return Response(status_code=200)

    async def cuda_shm_status(self, request: Request) -> Response:
        name = request.path_params.get("region")
        return JSONResponse(self.service.cuda_shared_memory_status(name))

    async def cuda_shm_register(self, request: Request) -> Response:
        self.service.register_cuda_shared_memory(request.path_params["region"])
        return Response(status_code=200)

    async def cuda_shm_unregister(self, request: Request) -> Response:
        self.service.unregister_cuda_shared_memory(request.path_params.get("region"))
        return Response(status_code=200)

    async def infer(
        self, scope: Scope, receive: Receive, send: Send, name: str, version: str | None
    ) -> None:
        """``POST /v2/models/{name}[/versions/{version}]/infer``, as bare ASGI: the hot
        path skips Starlette's request and response objects."""
        status, headers, content = await self.answer_infer(
            name,
            version,
            scope["headers"],
            lambda declared, limit: read_body(receive, declared, limit),
            lambda work: unless_disconnected(receive, work),
        )
        await _respond(send, status, content, headers)

    async def answer_infer(
        self,
        name: str,
        version: str | None,
        headers: Iterable[tuple[bytes, bytes]],
        read: BodyReader,
        guard: Guard,
    ) -> Answer:
        """The answer to an infer request for model ``name`` at ``version`` with the
        (lower-case) request ``headers``, whatever carries it: ``read(declared, limit)``
        gives the body (``declared``: its ``Content-Length``; TOO_LARGE over
        ``limit`` bytes), and ``guard(work)`` runs the inference (raising
        :class:`~aioinfer.errors.ClientDisconnectedError` when the client went away).
        Every error becomes an answer with its status; the request is counted in the
        service's statistics."""
        service = self.service
        try:
            # Admitted before the body is read: a full model reads none.
            async with service.call(name, version) as call:
                length, json_length, coding, accepted = _headers(headers)
                limit = service.max_request_bytes
                raw = await read(length, limit)
                if coding is not None:
                    inline = len(raw) <= _INLINE_BYTES // _INFLATION
                    raw = await _off_loop(inline, decompress, raw, coding, limit)
                model = call.model
                decoder = self._decoders.get(model) or self._new_decoder(model)
                request = decoder.decode(raw, json_length)
                response = await guard(lambda: call.infer(request))
                content, header_length = encode_infer_response(
                    response.model_name,
                    response.model_version,
                    response.id,
                    response.outputs,
                    shared=response.shared_outputs,
                )
                response_encoding = None
                if accepted is not None and worth_compressing(
                    len(content), header_length is not None
                ):
                    response_encoding = response_coding(accepted)
                if response_encoding is not None:
                    inline = len(content) <= _INLINE_BYTES
                    content = await _off_loop(inline, compress, content, response_encoding)
        except ServiceError as exc:
            return HTTP_STATUS[exc.kind], _JSON, _error_body(exc)
        if header_length is None:
            answer_headers = _JSON
        else:
            length_header = (b"inference-header-content-length", str(header_length).encode())
            answer_headers = [_OCTETS, length_header]
        if response_encoding is not None:
            encoding = (b"content-encoding", response_encoding.encode())
            answer_headers = [*answer_headers, encoding, _VARY]
        return 200, answer_headers, content

    def _model_of(self, request: Request) -> ServedModel:
        params = request.path_params
        return self.service.find(params["model"], params.get("version"))


async def _json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object ({} for an empty body).

    Raises:
        ProtocolError: a body that is not a JSON object.
    """
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ProtocolError(f"the request is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError("the request must be a JSON object")
    return body


def _parameters_of(body: dict[str, Any]) -> dict[str, Any]:
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise ProtocolError("the request's 'parameters' must be a JSON object")
    return parameters


Answer = tuple[int, list[tuple[bytes, bytes]], bytes]
"""An HTTP answer: status, headers (without ``Content-Length``) and body."""
BodyReader = Callable[[bytes | None, int], Awaitable[bytes]]
"""``read(declared, limit)``: a request's body (see :meth:`RestAdapter.answer_infer`)."""
Guard = Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]
"""``guard(work)``: ``work()``, cancelled when the client goes away."""

_JSON = [(b"content-type", b"application/json")]
_OCTETS = (b"content-type", b"application/octet-stream")
_VARY = (b"vary", b"accept-encoding")

_INLINE_BYTES = 1 << 16
"""Bodies up to this size are compressed (or decompressed to at most about this size)
on the event loop; larger ones on a thread (zlib releases the GIL), so that the loop
keeps serving meanwhile."""
_INFLATION = 16
"""What a compressed body is taken to grow by; its worst case is about 1000x, and
``decompress`` stops at the size limit whatever it is."""


def _headers(
    headers: Iterable[tuple[bytes, bytes]],
) -> tuple[bytes | None, str | None, str | None, str | None]:
    """The request's ``Content-Length``, ``Inference-Header-Content-Length``,
    ``Content-Encoding`` and ``Accept-Encoding`` headers (ASGI gives header names
    lower-case)."""
    length = header_length = coding = accepted = None
    for name, value in headers:
        if name == b"content-length":
            length = value
        elif name == HEADER_LENGTH:
            header_length = value.decode("latin-1")
        elif name == b"content-encoding":
            coding = value.decode("latin-1")
        elif name == b"accept-encoding":
            accepted = value.decode("latin-1")
    return length, header_length, coding, accepted


async def _off_loop(inline: bool, function: Callable[..., bytes], *args: Any) -> bytes:
    """``function(*args)``: on the event loop when ``inline``, else on a worker thread."""
    if inline:
        return function(*args)
    return await anyio.to_thread.run_sync(function, *args)


def _error_body(exc: Exception) -> bytes:
    return json.dumps({"error": str(exc)}).encode()


def _internal_error_body(exc: Exception) -> bytes:
    return json.dumps({"error": f"internal server error: {type(exc).__name__}: {exc}"}).encode()


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class _InferEndpoint:
    """An ASGI app, so that Starlette's router calls it without wrapping (a function
    endpoint gets request and response objects)."""

    def __init__(self, adapter: RestAdapter) -> None:
        self.adapter = adapter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        params = scope["path_params"]
        await self.adapter.infer(scope, receive, send, params["model"], params.get("version"))


def infer_target(path: str) -> tuple[str, str | None] | None:
    """(model, version or None) when ``path`` is ``/v2/models/{model}/infer`` or
    ``/v2/models/{model}/versions/{version}/infer``; else None."""
    if not (path.startswith("/v2/models/") and path.endswith("/infer")):
        return None
    parts = path[len("/v2/models/") : -len("/infer")].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None


class OipApp(Starlette):
    """The server's Starlette app. Infer requests (most of the traffic) skip Starlette's
    own middleware and the router, unless middleware was added to the app. With an
    ``api_key``, every request but the open ones must carry it (see ``serving/rest/auth.py``).
    """

    adapter: RestAdapter
    """The endpoints (set by :func:`create_app`)."""
    api_key_check: ApiKeyCheck | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.api_key_check is not None
            and scope["type"] == "http"
            and not self.api_key_check.allows(_route_path(scope), scope)
        ):
            await self.api_key_check.refuse(scope, send)
            return
        if scope["type"] == "http" and scope["method"] == "POST" and not self.user_middleware:
            target = infer_target(_route_path(scope))
            if target is not None:
                scope["app"] = self
                await self.adapter.infer(scope, receive, send, *target)
                return
        await super().__call__(scope, receive, send)

    def direct_infer_target(self, scope: Scope) -> tuple[str, str | None] | None:
        """(model, version or None) when the HTTP request of ``scope`` is an infer
        request that :meth:`RestAdapter.answer_infer` may answer without the app
        (no middleware was added, and the API key, if any, is there); else None: the
        app answers it."""
        if scope["method"] != "POST" or self.user_middleware:
            return None
        path = _route_path(scope)
        check = self.api_key_check
        if check is not None and not check.allows(path, scope):
            return None
        return infer_target(path)


def _route_path(scope: Scope) -> str:
    """The path below the app's mount point (Starlette keeps it in ``root_path``)."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] == "/":
        return path[len(root) :]
    return path


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    body = {"error": f"{exc.detail}: {request.url.path}"}
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)  # 405: Allow


async def _service_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    return JSONResponse({"error": str(exc)}, status_code=HTTP_STATUS[exc.kind])


async def _server_error(request: Request, exc: Exception) -> Response:
    # Starlette still re-raises the exception after sending this, for the server to log.
    return Response(_internal_error_body(exc), status_code=500, media_type="application/json")


def _extension_routes(adapter: RestAdapter, model: str, version: str) -> list[Route]:
    """Triton's statistics, model configuration, repository and shared-memory endpoints
    (before the model metadata routes: ``/v2/models/stats`` is not a model)."""
    system = "/v2/systemsharedmemory"
    cuda = "/v2/cudasharedmemory"
    post = ["POST"]
    return [
        Route("/v2/models/stats", adapter.statistics),
        Route(model + "/stats", adapter.statistics),
        Route(version + "/stats", adapter.statistics),
        Route(model + "/config", adapter.model_config),
        Route(version + "/config", adapter.model_config),
        Route("/v2/repository/index", adapter.repository_index, methods=post),
        Route("/v2/repository/models/{model}/load", adapter.load_model, methods=post),
        Route("/v2/repository/models/{model}/unload", adapter.unload_model, methods=post),
        Route(system + "/status", adapter.shm_status),
        Route(system + "/region/{region}/status", adapter.shm_status),
        Route(system + "/region/{region}/register", adapter.shm_register, methods=post),
        Route(system + "/unregister", adapter.shm_unregister, methods=post),
        Route(system + "/region/{region}/unregister", adapter.shm_unregister, methods=post),
        Route(cuda + "/status", adapter.cuda_shm_status),
        Route(cuda + "/region/{region}/status", adapter.cuda_shm_status),
        Route(cuda + "/region/{region}/register", adapter.cuda_shm_register, methods=post),
        Route(cuda + "/unregister", adapter.cuda_shm_unregister, methods=post),
        Route(cuda + "/region/{region}/unregister", adapter.cuda_shm_unregister, methods=post),
    ]


def create_app(
    source: str | Path | ModelRepository,
    *,
    configs: Mapping[str, ModelConfig] | None = None,
    core: Core | None = None,
    max_request_bytes: int = 64 * 2**20,
    drain_timeout: float = 30.0,
    max_sequences: int = DEFAULT_MAX_SEQUENCES,
    api_key: str | None = None,
    public_metrics: bool = False,
    service_type: Callable[..., InferenceService] = InferenceService,
    model_control_mode: str = "none",
    load_models: Sequence[str] = (),
    memory_budget: int | str | None = None,
) -> Starlette:
    """An ASGI app (Starlette) serving the models of ``source`` over the Open Inference
    Protocol (KServe v2 REST), with Prometheus metrics at ``/metrics``.

    ``source`` is a repository directory (``<repo>/<model>/<version>/model.onnx``), a
    single ``.onnx`` file, or a :class:`ModelRepository`; ``configs`` gives models their
    config in code (instead of ``config.json``). The models are compiled in the app's
    lifespan; ``app.state.server`` is the :class:`InferenceService`. To mount the app in
    another one, run its lifespan there: ``FastAPI(lifespan=app.router.lifespan_context)``.

    ``max_sequences`` caps the open sequences of each model whose config sets none. With
    an ``api_key``, every endpoint but ``/v2/health/live`` and ``/v2/health/ready`` (and
    ``/metrics`` with ``public_metrics``) answers 401 unless the request carries the key
    as ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``. ``service_type`` makes
    the service (an :class:`InferenceService` subclass: the Ray Serve ingress's forwards
    inferences to the model replicas).

    Triton's extensions are served too: statistics, model configuration, the model
    repository (``model_control_mode`` ``"none"`` or ``"explicit"``, with ``load_models``
    loaded at the start: see :class:`InferenceService`) and system shared memory. With a
    ``memory_budget`` (bytes, or a size such as ``"6GiB"``) models load on demand and the
    least recently used are unloaded to make room (:mod:`aioinfer.serving.manager`).

    Raises:
        RepositoryError: the repository or a config file is invalid.
        ServingConfigError: ``api_key`` is empty, ``max_sequences`` below 1, or a model
            control option that cannot be used.
    """
    repository = source if isinstance(source, ModelRepository) else ModelRepository(source, configs)
    service = service_type(
        repository,
        core=core,
        max_request_bytes=max_request_bytes,
        drain_timeout=drain_timeout,
        max_sequences=max_sequences,
        model_control_mode=model_control_mode,
        load_models=load_models,
        memory_budget=memory_budget,
    )
    adapter = RestAdapter(service)
    model = "/v2/models/{model}"
    version = model + "/versions/{version}"
    routes = [  # the hot path first: routes are tried in order
        Route(model + "/infer", _InferEndpoint(adapter), methods=["POST"]),
        Route(version + "/infer", _InferEndpoint(adapter), methods=["POST"]),
        Route("/v2/health/live", adapter.live),
        Route("/v2/health/ready", adapter.ready),
        Route("/v2", adapter.server_metadata),
        *_extension_routes(adapter, model, version),
        Route(model, adapter.model_metadata),
        Route(version, adapter.model_metadata),
        Route(model + "/ready", adapter.model_ready),
        Route(version + "/ready", adapter.model_ready),
        Route("/metrics", adapter.metrics_text),
        *generate_routes(service, HTTP_STATUS, [model, version]),
        *openai_routes(service),
    ]
    app = OipApp(
        routes=routes,
        lifespan=adapter.lifespan,
        exception_handlers={
            HTTPException: _http_error,
            ServiceError: _service_error,
            Exception: _server_error,
        },
    )
    app.adapter = adapter
    app.state.server = service
    if api_key is not None:
        open_paths = HEALTH_PATHS | {"/metrics"} if public_metrics else HEALTH_PATHS
        app.api_key_check = ApiKeyCheck(api_key, open_paths)
    return app
