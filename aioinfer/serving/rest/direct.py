"""Infer requests answered by their connection, without ASGI.

Under :func:`~aioinfer.serving.serve` (uvicorn's httptools protocol, subclassed in
``serving/connection.py``), an infer request to the app of
:func:`~aioinfer.serving.create_app` skips ASGI: its connection takes the body that
uvicorn's parser collected, asks :meth:`RestAdapter.answer_infer
<aioinfer.serving.rest.RestAdapter.answer_infer>` (the code the app runs too: limits,
errors, statistics) and writes the answer in one piece. ASGI's machinery per request (the
scope passed through uvicorn's proxy-headers middleware and the app, a dict per message,
the response's header checks, a watcher of the client's disconnect) was about a fifth of
the server's CPU time per request in the serving benchmark (docs/serving.md).

The connection knows when its client goes away: it cancels the inference at once (the
ASGI path learns it only by waiting on ``receive()``). Every other request goes through
the app as before: other endpoints, an app with middleware added, a request without the
API key (the app answers 401), one that expects ``100 Continue``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar, cast

from starlette.types import Scope
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from aioinfer.errors import ClientDisconnectedError
from aioinfer.serving.rest.app import OipApp, RestAdapter
from aioinfer.serving.rest.body import check_declared, too_large
from aioinfer.serving.rest.disconnect import disconnected_error, disconnected_instead_of

T = TypeVar("T")

_logger = logging.getLogger("uvicorn.error")
"""uvicorn's logger: a failure is logged where uvicorn logs those of the app."""


class Connection(Protocol):
    """What :class:`DirectInfer` uses of the connection (``LimitedHttpProtocol``)."""

    transport: asyncio.Transport
    server_state: Any
    lost: bool
    """Whether the connection was lost (its client went away)."""
    inferring: asyncio.Task[Any] | None
    """The task whose inference the connection cancels when it is lost."""


class DirectInfer:
    """The infer requests of one app, answered by its connections."""

    __slots__ = ("adapter", "app")

    def __init__(self, app: OipApp) -> None:
        self.app = app
        self.adapter: RestAdapter = app.adapter

    @staticmethod
    def of(app: object) -> DirectInfer | None:
        """For the app uvicorn serves (wrapped in its proxy-headers middleware, which
        changes nothing an inference reads): its direct path, or None when it is not
        the app of :func:`~aioinfer.serving.create_app`."""
        if isinstance(app, ProxyHeadersMiddleware):
            app = app.app
        return DirectInfer(app) if isinstance(app, OipApp) else None

    def target(self, cycle: RequestResponseCycle) -> tuple[str, str | None] | None:
        """(model, version or None) when the connection answers ``cycle``'s request
        itself; None: the app does."""
        if cycle.waiting_for_100_continue:
            return None
        return self.app.direct_infer_target(cast(Scope, cycle.scope))

    async def run(
        self, connection: Connection, cycle: RequestResponseCycle, name: str, version: str | None
    ) -> None:
        """Answer ``cycle``'s infer request; as uvicorn does for an app, a failure of
        the server is logged and answered 500."""

        async def read(declared: bytes | None, limit: int) -> bytes:
            return await _read_body(connection, cycle, declared, limit)

        async def guard(work: Callable[[], Awaitable[T]]) -> T:
            return await _cancel_on_disconnect(connection, work)

        try:
            status, headers, content = await self.adapter.answer_infer(
                name, version, cycle.scope["headers"], read, guard
            )
            await _write(connection, cycle, status, headers, content)
        except BaseException as exc:  # as uvicorn's run_asgi (shutdown cancels too)
            _logger.error("Exception in the infer request", exc_info=exc)
            if not cycle.response_started:
                cycle.keep_alive = False
                await _write(connection, cycle, 500, [_TEXT], b"Internal Server Error")
            else:
                connection.transport.close()


async def _read_body(
    connection: Connection, cycle: RequestResponseCycle, declared: bytes | None, limit: int
) -> bytes:
    """The body, as uvicorn's parser collects it into ``cycle``; refused as
    :func:`~aioinfer.serving.rest.body.read_body` does."""
    check_declared(declared, limit)
    while True:
        if connection.lost or cycle.disconnected:
            raise ClientDisconnectedError("the client disconnected while sending")
        if len(cycle.body) > limit:
            raise too_large(limit)
        # The parser pauses reading above 64 KiB of body; reading on also lets the
        # connection see its client leave while the inference runs.
        cycle.flow.resume_reading()
        if not cycle.more_body:
            body = bytes(cycle.body)
            cycle.body = bytearray()
            return body
        await cycle.message_event.wait()
        cycle.message_event.clear()


async def _cancel_on_disconnect(connection: Connection, work: Callable[[], Awaitable[T]]) -> T:
    """``work()``, cancelled when the connection is lost.

    Raises:
        ClientDisconnectedError: the client went away first.
    """
    if connection.lost:
        raise disconnected_error()
    task = asyncio.current_task()
    connection.inferring = task
    try:
        return await work()
    except asyncio.CancelledError:
        if not connection.lost:
            raise
        raise disconnected_instead_of(task) from None
    finally:
        connection.inferring = None


_TEXT = (b"content-type", b"text/plain; charset=utf-8")


async def _write(
    connection: Connection,
    cycle: RequestResponseCycle,
    status: int,
    headers: list[tuple[bytes, bytes]],
    content: bytes,
) -> None:
    """Write the answer in one piece and end ``cycle`` as uvicorn's ``send`` does (the
    keep-alive timer, the next pipelined request); nothing when the client is gone."""
    if cycle.flow.write_paused and not cycle.disconnected:
        await cycle.flow.drain()
    if cycle.disconnected or connection.lost:
        return
    cycle.response_started = True
    if cycle.access_log:
        scope = cycle.scope
        cycle.access_logger.info(
            '%s - "%s %s HTTP/%s" %d',
            get_client_addr(scope),
            scope["method"],
            get_path_with_query_string(scope),
            scope["http_version"],
            status,
        )
    parts = [STATUS_LINE[status]]
    for name, value in (*connection.server_state.default_headers, *headers):
        parts += (name, b": ", value, b"\r\n")
    parts += (b"content-length: ", str(len(content)).encode(), b"\r\n")
    if not cycle.keep_alive:
        parts.append(b"connection: close\r\n")
    parts += (b"\r\n", content)
    connection.transport.write(b"".join(parts))
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        connection.transport.close()
    cycle.on_response()
