"""Running the app under uvicorn: ``aioinfer serve`` and :func:`serve`."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from aioinfer.errors import ServingConfigError
from aioinfer.serving.connection import ConnectionLimits
from aioinfer.serving.models import DEFAULT_MAX_SEQUENCES
from aioinfer.serving.repository import ModelConfig, ModelRepository
from aioinfer.serving.rest.app import create_app

if TYPE_CHECKING:
    from aioinfer.serving.grpc.server import GrpcServer
    from aioinfer.serving.service import InferenceService

_logger = logging.getLogger("uvicorn.error")
"""uvicorn's logger: the one that ``serve`` prints (its configuration is uvicorn's)."""

SWITCH_INTERVAL = 0.0005
"""The interpreter's thread switch interval that :func:`serve` sets (seconds).

A compute thread takes the GIL back after every numpy/BLAS call; while the event loop
runs Python (HTTP, protocol, batching), the thread waits up to the switch interval for
it, 5 ms by default: a batch of a few dozen kernels then spends longer waiting than
computing. 0.5 ms made the serving benchmark 15-25% faster (docs/serving.md)."""


GC_THRESHOLD = 20_000
"""The garbage collector's first-generation threshold that :func:`serve` sets with
``freeze_gc`` (the interpreter's default: 700).

The requests in flight keep objects alive for a while (their tasks, frames, arrays, the
batches they wait in), so with 64 of them the collector ran a young collection every
few dozen requests (60 a second at 2,400 requests/s), which freed next to nothing: 7%
of the event loop's CPU time in the serving benchmark. What a request leaves in
reference cycles is rare (the watcher of a client's disconnect, once a request ran
50 ms), so the collections that remain find it all the same."""

GRPC_STOP_GRACE = 2.0
"""Seconds the gRPC server lets its calls end at shutdown, once the service has drained
(the answers of the last inferences still being sent); then what remains (an idle
stream) is cancelled."""


def serve(
    source: str | Path | ModelRepository,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    configs: Mapping[str, ModelConfig] | None = None,
    drain_timeout: float = 30.0,
    log_level: str = "info",
    access_log: bool = False,
    switch_interval: float | None = SWITCH_INTERVAL,
    freeze_gc: bool = True,
    max_request_bytes: int = 64 * 2**20,
    max_sequences: int = DEFAULT_MAX_SEQUENCES,
    header_timeout: float = 10.0,
    max_header_count: int = 100,
    max_header_bytes: int = 32 * 1024,
    limit_concurrency: int | None = None,
    backlog: int = 2048,
    timeout_keep_alive: int = 5,
    ssl_certfile: str | Path | None = None,
    ssl_keyfile: str | Path | None = None,
    api_key: str | None = None,
    public_metrics: bool = False,
    grpc_port: int | None = None,
    model_control_mode: str = "none",
    load_models: Sequence[str] = (),
    memory_budget: int | str | None = None,
) -> None:
    """Serve the repository (or ``.onnx`` file) ``source`` over HTTP until SIGINT/SIGTERM.

    ``configs`` gives models their config in code (see :func:`create_app`).
    ``access_log`` logs a line per request (uvicorn's access log; off: it costs the
    event loop more than a batched inference does). ``switch_interval`` (seconds) is set
    with :func:`sys.setswitchinterval` for the process (see :data:`SWITCH_INTERVAL`);
    None leaves the interpreter's setting. With ``freeze_gc``, once the models are
    compiled, every object made so far goes into the interpreter's permanent generation
    (:func:`gc.freeze`): the cyclic garbage collector's full collections then skip the
    hundred thousand objects of numpy, onnx and the models, instead of stalling the
    event loop for 30-40 ms every few thousand requests; and the collector's first
    threshold is raised to :data:`GC_THRESHOLD`, so that it stops scanning the objects
    of the requests in flight every few dozen requests.

    Limits (the "Limits and security" section of the serving docs): bodies over
    ``max_request_bytes`` get 413; a model opens at most ``max_sequences`` sequences
    unless its config says otherwise; ``header_timeout``, ``max_header_count``,
    ``max_header_bytes``, ``limit_concurrency``, ``backlog`` and ``timeout_keep_alive``
    bound connections (see :class:`ConnectionLimits`). ``ssl_certfile`` and
    ``ssl_keyfile`` (PEM files) serve HTTPS instead of HTTP. With ``api_key`` every
    endpoint but health (and ``/metrics`` with ``public_metrics``) needs the key (see
    :func:`create_app`). ``model_control_mode`` ``"explicit"`` loads only ``load_models``
    (``"*"``: all) at the start and lets clients load and unload models at run time;
    ``"none"`` loads every model and refuses that (see :func:`create_app`). With a
    ``memory_budget`` (bytes, or a size such as ``"6GiB"``), the models load when a
    request needs them (at the start, those that fit) and the least recently used idle
    ones are unloaded to make room (:mod:`aioinfer.serving.manager`).

    With ``grpc_port`` (0: any free port), the same models are also served over KServe
    v2 gRPC on ``host:grpc_port``, in the same process and event loop (one service:
    batches, limits, sequences and metrics shared), with the same TLS files, API key and
    limits (see :class:`~aioinfer.serving.grpc.GrpcServer`).

    The models are compiled before the port is opened. On SIGINT/SIGTERM the server stops
    accepting connections, lets in-flight inferences finish (up to ``drain_timeout``
    seconds), then closes the models.

    Raises:
        RepositoryError: the repository or a config file is invalid.
        ServingConfigError: an empty API key, a limit out of range, a TLS file that
            does not exist or a key without its certificate, a gRPC port in use.
        AioinferError: a model cannot be read or compiled (the message names it).
    """
    limits = ConnectionLimits(
        header_timeout=header_timeout,
        max_header_count=max_header_count,
        max_header_bytes=max_header_bytes,
        limit_concurrency=limit_concurrency,
        backlog=backlog,
        timeout_keep_alive=timeout_keep_alive,
    )
    options = uvicorn_options(limits, ssl_certfile, ssl_keyfile)
    app = create_app(
        source,
        configs=configs,
        drain_timeout=drain_timeout,
        max_request_bytes=max_request_bytes,
        max_sequences=max_sequences,
        api_key=api_key,
        public_metrics=public_metrics,
        model_control_mode=model_control_mode,
        load_models=load_models,
        memory_budget=memory_budget,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=int(drain_timeout),
        **options,
    )
    grpc_server = None
    if grpc_port is not None:
        grpc_server = _grpc_server(
            app.state.server, host, grpc_port, limits, ssl_certfile, ssl_keyfile, api_key
        )
    if switch_interval is not None:
        sys.setswitchinterval(switch_interval)
    _log_like_uvicorn()
    _run_on_uvicorn_loop(config, _serve(config, app.state.server, grpc_server, freeze_gc))


def _grpc_server(
    service: InferenceService,
    host: str,
    port: int,
    limits: ConnectionLimits,
    ssl_certfile: str | Path | None,
    ssl_keyfile: str | Path | None,
    api_key: str | None,
) -> GrpcServer:
    """The gRPC server beside the REST one: the same service, TLS files, API key and
    limits."""
    from aioinfer.serving.grpc.server import GrpcServer  # grpcio only for a gRPC server

    return GrpcServer(
        service,
        host,
        port,
        limits=limits,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
        api_key=api_key,
    )


async def _serve(
    config: uvicorn.Config,
    service: InferenceService,
    grpc_server: GrpcServer | None,
    freeze_gc: bool,
) -> None:
    """Compile the models, then serve until uvicorn's shutdown (and gRPC's, after the
    service has drained)."""
    await service.load()  # errors surface here, before the port opens
    if freeze_gc:
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    if grpc_server is None:
        await uvicorn.Server(config).serve()
        return
    bound = await grpc_server.start()
    scheme = "TLS" if grpc_server.secure else "plaintext"
    _logger.info("gRPC running on %s:%d (%s)", config.host, bound, scheme)
    try:
        await _WithGrpc(config, grpc_server).serve()  # drains the service, then stops gRPC
    finally:
        await grpc_server.stop(GRPC_STOP_GRACE)  # (at once if already stopped)


def _run_on_uvicorn_loop(config: uvicorn.Config, main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on the event loop uvicorn would pick (uvloop when installed)."""
    loop_factory = config.get_loop_factory()
    runner = getattr(asyncio, "Runner", None)  # Python 3.11+
    if runner is None or loop_factory is None:
        asyncio.run(main)
        return
    with runner(loop_factory=loop_factory) as loop_runner:
        loop_runner.run(main)


class _WithGrpc(uvicorn.Server):
    """uvicorn's server that also stops the gRPC server at its shutdown, once the service
    has drained (the lifespan's end) and before ``serve()`` returns: uvicorn raises a
    SIGTERM it caught again as ``serve()`` ends, and its default action ends the process
    at once, so a gRPC answer still being sent then would be lost (the client saw a bare
    UNAVAILABLE) if the gRPC server stopped only after ``serve()``."""

    def __init__(self, config: uvicorn.Config, grpc_server: GrpcServer) -> None:
        super().__init__(config)
        self.grpc_server = grpc_server

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        await super().shutdown(sockets)
        await self.grpc_server.stop(GRPC_STOP_GRACE)


def _log_like_uvicorn() -> None:
    """Show aioinfer's own log lines (what each model is served with) through uvicorn's
    handlers and at its level, which ``uvicorn.Config`` has just set up."""
    own = logging.getLogger("aioinfer")
    if not own.handlers:
        own.handlers = list(logging.getLogger("uvicorn").handlers)
        own.setLevel(logging.getLogger("uvicorn.error").level)


def uvicorn_options(
    limits: ConnectionLimits,
    ssl_certfile: str | Path | None = None,
    ssl_keyfile: str | Path | None = None,
) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.Config`` for ``limits`` and TLS.

    Raises:
        ServingConfigError: ``ssl_keyfile`` without ``ssl_certfile``, or a file that does
            not exist.
    """
    options = limits.uvicorn_options()
    if ssl_keyfile is not None and ssl_certfile is None:
        raise ServingConfigError("ssl_keyfile needs ssl_certfile (the server's certificate)")
    for name, path in (("ssl_certfile", ssl_certfile), ("ssl_keyfile", ssl_keyfile)):
        if path is not None and not Path(path).is_file():
            raise ServingConfigError(f"{name} {str(path)!r} is not a file")
    if ssl_certfile is not None:
        options["ssl_certfile"] = str(ssl_certfile)
        options["ssl_keyfile"] = None if ssl_keyfile is None else str(ssl_keyfile)
    return options
