"""Running the app under uvicorn: ``aioinfer serve`` and :func:`serve`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import uvicorn

from aioinfer.serving.app import create_app


def serve(
    source: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    drain_timeout: float = 30.0,
    log_level: str = "info",
) -> None:
    """Serve the repository (or ``.onnx`` file) ``source`` over HTTP until SIGINT/SIGTERM.

    The models are compiled before the port is opened. On SIGINT/SIGTERM the server stops
    accepting connections, lets in-flight inferences finish (up to ``drain_timeout``
    seconds), then closes the models.

    Raises:
        RepositoryError: the repository or a config file is invalid.
        AioinferError: a model cannot be read or compiled (the message names it).
    """
    app = create_app(source, drain_timeout=drain_timeout)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=int(drain_timeout),
    )
    server = uvicorn.Server(config)

    async def main() -> None:
        await app.state.server.load()  # errors surface here, before the port opens
        await server.serve()

    loop_factory = config.get_loop_factory()
    runner = getattr(asyncio, "Runner", None)  # Python 3.11+: uvicorn's event loop (uvloop)
    if runner is None or loop_factory is None:
        asyncio.run(main())
        return
    with runner(loop_factory=loop_factory) as loop_runner:
        loop_runner.run(main())
