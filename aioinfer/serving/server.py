"""Running the app under uvicorn: ``aioinfer serve`` and :func:`serve`."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Mapping
from pathlib import Path

import uvicorn

from aioinfer.serving.app import create_app
from aioinfer.serving.repository import ModelConfig

SWITCH_INTERVAL = 0.0005
"""The interpreter's thread switch interval that :func:`serve` sets (seconds).

A compute thread takes the GIL back after every numpy/BLAS call; while the event loop
runs Python (HTTP, protocol, batching), the thread waits up to the switch interval for
it, 5 ms by default: a batch of a few dozen kernels then spends longer waiting than
computing. 0.5 ms made the serving benchmark 15-25% faster (docs/serving.md)."""


def serve(
    source: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    configs: Mapping[str, ModelConfig] | None = None,
    drain_timeout: float = 30.0,
    log_level: str = "info",
    access_log: bool = False,
    switch_interval: float | None = SWITCH_INTERVAL,
    freeze_gc: bool = True,
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
    event loop for 30-40 ms every few thousand requests.

    The models are compiled before the port is opened. On SIGINT/SIGTERM the server stops
    accepting connections, lets in-flight inferences finish (up to ``drain_timeout``
    seconds), then closes the models.

    Raises:
        RepositoryError: the repository or a config file is invalid.
        AioinferError: a model cannot be read or compiled (the message names it).
    """
    if switch_interval is not None:
        sys.setswitchinterval(switch_interval)
    app = create_app(source, configs=configs, drain_timeout=drain_timeout)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=int(drain_timeout),
    )
    server = uvicorn.Server(config)

    async def main() -> None:
        await app.state.server.load()  # errors surface here, before the port opens
        if freeze_gc:
            gc.collect()
            gc.freeze()
        await server.serve()

    loop_factory = config.get_loop_factory()
    runner = getattr(asyncio, "Runner", None)  # Python 3.11+: uvicorn's event loop (uvloop)
    if runner is None or loop_factory is None:
        asyncio.run(main())
        return
    with runner(loop_factory=loop_factory) as loop_runner:
        loop_runner.run(main())
