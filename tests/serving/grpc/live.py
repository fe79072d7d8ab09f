"""A live server with both transports: the REST app (uvicorn) and the gRPC server on one
asyncio event loop in a background thread, sharing one service, as ``serve(...,
grpc_port=...)`` runs them; each on a free 127.0.0.1 port."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path
from typing import Any

import uvicorn

from aioinfer.serving import create_app
from aioinfer.serving.connection import ConnectionLimits
from aioinfer.serving.grpc import GrpcServer


class LiveGrpcServer:
    """``source`` served over REST (:attr:`url`) and gRPC (:attr:`grpc_url`); ``tls`` is
    (certificate, key) PEM paths for both; ``limits`` are the gRPC server's;
    ``options`` go to :func:`create_app`."""

    def __init__(
        self,
        source: Path,
        *,
        api_key: str | None = None,
        tls: tuple[Path, Path] | None = None,
        limits: ConnectionLimits | None = None,
        **options: Any,
    ) -> None:
        self.app = create_app(source, api_key=api_key, **options)
        self.service = self.app.state.server
        cert, key = tls or (None, None)
        self.grpc = GrpcServer(
            self.service,
            "127.0.0.1",
            0,
            limits=limits,
            ssl_certfile=cert,
            ssl_keyfile=key,
            api_key=api_key,
        )
        # IPPROTO_TCP, as uvicorn's own sockets: asyncio sets TCP_NODELAY on the
        # connections of a TCP socket only, and without it a response written in two
        # parts waits for the client's delayed ACK (~40 ms per request).
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.socket.bind(("127.0.0.1", 0))
        self.url = f"127.0.0.1:{self.socket.getsockname()[1]}"
        tls_options = {} if tls is None else {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
        config = uvicorn.Config(
            self.app, log_level="warning", timeout_graceful_shutdown=10, **tls_options
        )
        self.rest = uvicorn.Server(config)
        self._started = threading.Event()
        self._failure: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc.port}"

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by __enter__
            self._failure.append(exc)
            self._started.set()

    async def _main(self) -> None:
        await self.service.load()
        await self.grpc.start()
        self._started.set()
        try:
            await self.rest.serve(sockets=[self.socket])
        finally:
            await self.grpc.stop()

    def __enter__(self) -> LiveGrpcServer:
        self.thread.start()
        if not self._started.wait(60) or self._failure:
            raise RuntimeError(f"the test server did not start: {self._failure}")
        while not self.rest.started:
            if not self.thread.is_alive():
                raise RuntimeError("the test server stopped")
            self._started.wait(0.02)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.rest.should_exit = True
        self.thread.join(60)
        self.socket.close()
