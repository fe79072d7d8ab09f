"""The ASGI app: the Open Inference Protocol (KServe v2 REST) over a model repository."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

import aioinfer
from aioinfer.core import Core
from aioinfer.errors import (
    AioinferError,
    DeviceUnavailableError,
    InferCancelledError,
    InferenceError,
    InputError,
    RequestClosedError,
    ServingConfigError,
)
from aioinfer.serving.auth import HEALTH_PATHS, ApiKeyCheck
from aioinfer.serving.compression import compress, decompress, response_coding
from aioinfer.serving.disconnect import ClientDisconnectedError, unless_disconnected
from aioinfer.serving.metrics import CONTENT_TYPE, ModelMetrics, ServerMetrics
from aioinfer.serving.models import DEFAULT_MAX_SEQUENCES, SequenceFlags, ServedModel
from aioinfer.serving.protocol import (
    HEADER_LENGTH,
    InferRequestBody,
    ProtocolError,
    encode_infer_response,
    port_metadata,
)
from aioinfer.serving.repository import ModelConfig, ModelRepository

T = TypeVar("T")

_logger = logging.getLogger(__name__)

EXTENSIONS = ("binary_tensor_data", "sequence")
"""The protocol extensions this server implements (listed by ``GET /v2``)."""


class ModelServer:
    """The state behind one app: the served models, the limits, the metrics, shutdown.

    Args:
        repository: the models to serve.
        core: the Core that compiles them (a new one by default).
        max_request_bytes: larger request bodies are refused with HTTP 413.
        drain_timeout: at shutdown, how long in-flight inferences may still finish
            (seconds) before the models are closed and what still runs is cancelled.
        max_sequences: open sequences per model, for models whose config sets none.
    """

    def __init__(
        self,
        repository: ModelRepository,
        *,
        core: Core | None = None,
        max_request_bytes: int = 64 * 2**20,
        drain_timeout: float = 30.0,
        max_sequences: int = DEFAULT_MAX_SEQUENCES,
    ) -> None:
        self.repository = repository
        self.core = core or Core()
        self.max_request_bytes = max_request_bytes
        self.drain_timeout = drain_timeout
        if max_sequences < 1:
            raise ServingConfigError(f"max_sequences must be at least 1, got {max_sequences}")
        self.max_sequences = max_sequences
        self.models: dict[str, dict[str, ServedModel]] = {}
        self.metrics = ServerMetrics(self._all_models)
        self.closing = False
        self._in_flight = 0
        self._drained: anyio.Event | None = None

    def _all_models(self) -> Iterator[ServedModel]:
        for versions in self.models.values():
            yield from versions.values()

    # -- lifetime -------------------------------------------------------------------------

    async def load(self) -> None:
        """Compile every version of every model (off the event loop); once.

        Raises:
            AioinferError: a model cannot be read or compiled (the message names it).
        """
        for entry in self.repository.models.values():
            if entry.name in self.models:
                continue
            supported = self.core.get_property(entry.config.device, "SUPPORTED_PROPERTIES")
            device, config = entry.config.device_and_config(supported)
            versions = {}
            for version, path in sorted(entry.versions.items(), key=lambda item: int(item[0])):
                try:
                    compiled = await self.core.compile_model_async(str(path), device, config)
                except AioinferError as exc:
                    raise type(exc)(f"model {entry.name!r} version {version}: {exc}") from exc
                versions[version] = ServedModel(
                    entry.name, version, compiled, entry.config, self.max_sequences
                )
            self.models[entry.name] = versions

    @asynccontextmanager
    async def lifespan(self, app: Any = None) -> AsyncIterator[None]:
        """Load the models; at the end, refuse new inferences, let the in-flight ones
        finish (up to ``drain_timeout``), then close the models."""
        self.closing = False
        await self.load()
        async with anyio.create_task_group() as group:
            group.start_soon(self._drop_idle_sequences)
            try:
                yield
            finally:
                with anyio.CancelScope(shield=True):
                    await self.drain()
                    group.cancel_scope.cancel()
        with anyio.CancelScope(shield=True):
            for model in self._all_models():
                await model.close()
        self.models.clear()  # a later lifespan compiles them again

    async def drain(self) -> None:
        """Refuse new inferences and wait (up to ``drain_timeout``) for in-flight ones."""
        self.closing = True
        with anyio.move_on_after(self.drain_timeout):
            while self._in_flight:
                self._drained = self._drained or anyio.Event()
                await self._drained.wait()

    async def _drop_idle_sequences(self) -> None:
        while True:
            timeouts = [m.config.sequence_idle_timeout_s for m in self._all_models()]
            await anyio.sleep(max(0.01, min([*timeouts, 2.0]) / 4))
            for model in list(self._all_models()):
                await model.drop_idle_sequences()

    def _enter(self, metrics: ModelMetrics) -> None:
        self._in_flight += 1
        metrics.in_flight += 1

    def _leave(self, metrics: ModelMetrics) -> None:
        metrics.in_flight -= 1
        self._in_flight -= 1
        if self._in_flight == 0 and self._drained is not None:
            self._drained.set()
            self._drained = None

    # -- lookups --------------------------------------------------------------------------

    def find(self, name: str, version: str | None) -> ServedModel:
        """The served model ``name`` at ``version`` (None: the latest).

        Raises:
            ProtocolError: 404 naming the unknown model or version.
        """
        versions = self.models.get(name)
        if versions is None:
            known = ", ".join(map(repr, sorted(self.models))) or "none"
            raise ProtocolError(f"unknown model {name!r}; served models: {known}", status=404)
        if version is None:
            return versions[max(versions, key=int)]
        model = versions.get(version)
        if model is None:
            known = ", ".join(sorted(versions, key=int))
            raise ProtocolError(
                f"model {name!r} has no version {version!r}; its versions: {known}", status=404
            )
        return model

    # -- endpoints ------------------------------------------------------------------------

    async def live(self, request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(self, request: Request) -> Response:
        ready = bool(self.models) and not self.closing
        return JSONResponse({"ready": ready}, status_code=200 if ready else 400)

    async def server_metadata(self, request: Request) -> Response:
        return JSONResponse(
            {"name": "aioinfer", "version": aioinfer.__version__, "extensions": list(EXTENSIONS)}
        )

    async def model_metadata(self, request: Request) -> Response:
        model = self._model_of(request)
        versions = sorted(self.models[model.name], key=int)
        return JSONResponse(
            {
                "name": model.name,
                "versions": versions,
                "platform": "onnx",
                "inputs": [port_metadata(port) for port in model.inputs],
                "outputs": [port_metadata(port) for port in model.outputs],
            }
        )

    async def model_ready(self, request: Request) -> Response:
        model = self._model_of(request)
        ready = not self.closing and model.ready()
        return JSONResponse({"name": model.name, "ready": ready}, status_code=200 if ready else 400)

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    async def infer(
        self, scope: Scope, receive: Receive, send: Send, name: str, version: str | None
    ) -> None:
        """``POST /v2/models/{name}[/versions/{version}]/infer``, as bare ASGI: the hot
        path skips Starlette's request and response objects."""
        try:
            model = self.find(name, version)
        except ProtocolError as exc:
            await _respond(send, exc.status, _error_body(exc), _JSON)
            return
        metrics = self.metrics.of(model)
        metrics.requests += 1
        started = time.perf_counter()
        self._enter(metrics)
        try:
            if self.closing:
                raise ProtocolError("the server is shutting down", status=503)
            model.check_admission()  # before the body is read: a full model reads none
            length, json_length, coding, accepted = _headers(scope)
            raw = await self._read_body(receive, length)
            if coding is not None:
                inline = len(raw) <= _INLINE_BYTES // _INFLATION
                raw = await _off_loop(inline, decompress, raw, coding, self.max_request_bytes)
            body = model.decoder.decode(raw, json_length)
            sequence = SequenceFlags.from_parameters(body.parameters)
            wanted = _wanted_outputs(model, body)
            results, waited = await unless_disconnected(
                receive, lambda: model.infer(body.inputs, sequence)
            )
            outputs = [(name, results[name], binary) for name, binary in wanted]
            content, header_length = encode_infer_response(
                model.name, model.version, body.id, outputs
            )
            response_encoding = None if accepted is None else response_coding(accepted)
            if response_encoding is not None:
                inline = len(content) <= _INLINE_BYTES
                content = await _off_loop(inline, compress, content, response_encoding)
        except (ProtocolError, AioinferError, ClientDisconnectedError) as exc:
            status, reason = _status(exc)
            metrics.fail(reason)
            await _respond(send, status, _error_body(exc), _JSON)
            return
        except Exception as exc:  # a fault of the server's, not of the request
            _logger.exception("infer request to model %r version %s", model.name, model.version)
            metrics.fail("error")
            await _respond(send, 500, _internal_error_body(exc), _JSON)
            return
        finally:
            self._leave(metrics)
        metrics.latency.observe(time.perf_counter() - started)
        metrics.queue_time.observe(waited)
        if header_length is None:
            headers = _JSON
        else:
            length_header = (b"inference-header-content-length", str(header_length).encode())
            headers = [_OCTETS, length_header]
        if response_encoding is not None:
            headers = [*headers, (b"content-encoding", response_encoding.encode()), _VARY]
        await _respond(send, 200, content, headers)

    def _model_of(self, request: Request) -> ServedModel:
        params = request.path_params
        return self.find(params["model"], params.get("version"))

    async def _read_body(self, receive: Receive, declared: bytes | None) -> bytes:
        limit = self.max_request_bytes
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ProtocolError(
                f"the request body has {int(declared)} bytes; the limit is {limit}", status=413
            )
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnectedError("the client disconnected while sending")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise ProtocolError(f"the request body exceeds the limit of {limit} bytes", 413)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)  # of one part: that part itself, not a copy


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


def _headers(scope: Scope) -> tuple[bytes | None, str | None, str | None, str | None]:
    """The request's ``Content-Length``, ``Inference-Header-Content-Length``,
    ``Content-Encoding`` and ``Accept-Encoding`` headers (ASGI gives header names
    lower-case)."""
    length = header_length = coding = accepted = None
    for name, value in scope["headers"]:
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


def _wanted_outputs(model: ServedModel, body: InferRequestBody) -> list[tuple[str, bool]]:
    names = model.output_names
    if body.outputs is None:
        return [(name, body.binary_output) for name in names]
    for output in body.outputs:
        if output.name not in names:
            known = ", ".join(map(repr, names))
            raise ProtocolError(
                f"the model has no output named {output.name!r}; its outputs are {known}"
            )
    return [(output.name, output.binary) for output in body.outputs]


def _status(exc: Exception) -> tuple[int, str]:
    """The HTTP status and the failure reason (a metrics label) of an error."""
    if isinstance(exc, ProtocolError):
        if exc.status == 503:
            return 503, "busy"
        return exc.status, "bad_request"
    if isinstance(exc, ClientDisconnectedError):
        return 499, "cancelled"
    if isinstance(exc, DeviceUnavailableError):  # retryable: the device recovers
        return 503, "unavailable"
    if isinstance(exc, (InputError, InferenceError)):
        return 400, "bad_request"
    if isinstance(exc, (RequestClosedError, InferCancelledError)):
        return 503, "shutdown"
    return 500, "error"


class _InferEndpoint:
    """An ASGI app, so that Starlette's router calls it without wrapping (a function
    endpoint gets request and response objects)."""

    def __init__(self, server: ModelServer) -> None:
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        params = scope["path_params"]
        await self.server.infer(scope, receive, send, params["model"], params.get("version"))


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
    ``api_key``, every request but the open ones must carry it (see ``serving/auth.py``).
    """

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
                await self.state.server.infer(scope, receive, send, *target)
                return
        await super().__call__(scope, receive, send)


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


async def _protocol_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProtocolError)
    return JSONResponse({"error": str(exc)}, status_code=exc.status)


async def _server_error(request: Request, exc: Exception) -> Response:
    # Starlette still re-raises the exception after sending this, for the server to log.
    return Response(_internal_error_body(exc), status_code=500, media_type="application/json")


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
) -> Starlette:
    """An ASGI app (Starlette) serving the models of ``source`` over the Open Inference
    Protocol (KServe v2 REST), with Prometheus metrics at ``/metrics``.

    ``source`` is a repository directory (``<repo>/<model>/<version>/model.onnx``), a
    single ``.onnx`` file, or a :class:`ModelRepository`; ``configs`` gives models their
    config in code (instead of ``config.json``). The models are compiled in the app's
    lifespan; ``app.state.server`` is the :class:`ModelServer`. To mount the app in
    another one, run its lifespan there: ``FastAPI(lifespan=app.router.lifespan_context)``.

    ``max_sequences`` caps the open sequences of each model whose config sets none. With
    an ``api_key``, every endpoint but ``/v2/health/live`` and ``/v2/health/ready`` (and
    ``/metrics`` with ``public_metrics``) answers 401 unless the request carries the key
    as ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``.

    Raises:
        RepositoryError: the repository or a config file is invalid.
        ServingConfigError: ``api_key`` is empty, or ``max_sequences`` below 1.
    """
    repository = source if isinstance(source, ModelRepository) else ModelRepository(source, configs)
    server = ModelServer(
        repository,
        core=core,
        max_request_bytes=max_request_bytes,
        drain_timeout=drain_timeout,
        max_sequences=max_sequences,
    )
    model = "/v2/models/{model}"
    version = model + "/versions/{version}"
    routes = [  # the hot path first: routes are tried in order
        Route(model + "/infer", _InferEndpoint(server), methods=["POST"]),
        Route(version + "/infer", _InferEndpoint(server), methods=["POST"]),
        Route("/v2/health/live", server.live),
        Route("/v2/health/ready", server.ready),
        Route("/v2", server.server_metadata),
        Route(model, server.model_metadata),
        Route(version, server.model_metadata),
        Route(model + "/ready", server.model_ready),
        Route(version + "/ready", server.model_ready),
        Route("/metrics", server.metrics_text),
    ]
    app = OipApp(
        routes=routes,
        lifespan=server.lifespan,
        exception_handlers={
            HTTPException: _http_error,
            ProtocolError: _protocol_error,
            Exception: _server_error,
        },
    )
    app.state.server = server
    if api_key is not None:
        open_paths = HEALTH_PATHS | {"/metrics"} if public_metrics else HEALTH_PATHS
        app.api_key_check = ApiKeyCheck(api_key, open_paths)
    return app
