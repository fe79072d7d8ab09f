"""What aioinfer takes from uvicorn's internals, all in this module.

:func:`~aioinfer.serving.serve` runs the REST app under uvicorn's httptools protocol,
extended here by :class:`LimitedHttpProtocol`: the limits of
:class:`~aioinfer.serving.connection.ConnectionLimits` (a header-read timeout, caps on
header lines and bytes: uvicorn starts no timer before a request's headers are complete
and buffers headers without bound), a response written in one piece, one keep-alive
timer per connection, and infer requests answered by their connection without ASGI
(:class:`DirectInfer`: ASGI's machinery per request was about a fifth of the server's
CPU time per request in the serving benchmark, docs/serving.md; and the connection
sees its client leave at once). Every other request goes through the app as before:
other endpoints, an app with middleware added, a request without the API key (the app
answers 401), one that expects ``100 Continue``.

None of this is uvicorn's public API: a uvicorn release may change any of it. What this
module depends on is listed in :data:`UVICORN_INTERNALS` (the subclassed protocol's
methods and attributes, the request cycle's attributes, the status lines, the proxy
middleware's ``app``, two helpers of ``uvicorn.protocols.utils``), and
tests/serving/rest/test_uvicorn_http.py checks that list against the installed uvicorn:
when it fails, read uvicorn's change to what it names before anything else.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, Protocol, TypeVar, cast

from starlette.types import Scope
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from aioinfer.errors import ClientDisconnectedError
from aioinfer.serving.rest.app import OipApp, RestAdapter
from aioinfer.serving.rest.body import check_declared, too_large
from aioinfer.serving.rest.disconnect import disconnected_error, disconnected_instead_of

UVICORN_INTERNALS: Mapping[str, tuple[str, ...]] = {
    "uvicorn.protocols.http.httptools_impl:HttpToolsProtocol": (
        # methods overridden or called
        "connection_made",
        "connection_lost",
        "data_received",
        "on_message_begin",
        "on_url",
        "on_header",
        "on_headers_complete",
        "on_message_complete",
        "on_response_complete",
        "send_400_response",
        "_start_asgi_task",
        "_unset_keepalive_if_required",
        "timeout_keep_alive_handler",
        # attributes read
        "app",
        "cycle",
        "flow",
        "loop",
        "pipeline",
        "server_state",
        "tasks",
        "timeout_keep_alive",
        "transport",
    ),
    "uvicorn.protocols.http.httptools_impl:RequestResponseCycle": (
        "access_log",
        "access_logger",
        "body",
        "chunked_encoding",
        "disconnected",
        "flow",
        "keep_alive",
        "message_event",
        "more_body",
        "on_response",
        "response_complete",
        "response_started",
        "scope",
        "transport",
        "waiting_for_100_continue",
    ),
    "uvicorn.protocols.http.httptools_impl:STATUS_LINE": (),
    "uvicorn.protocols.http.flow_control:FlowControl": (
        "drain",
        "resume_reading",
        "write_paused",
    ),
    "uvicorn.middleware.proxy_headers:ProxyHeadersMiddleware": ("app",),
    "uvicorn.protocols.utils:get_client_addr": (),
    "uvicorn.protocols.utils:get_path_with_query_string": (),
}
"""What this module uses of uvicorn that is not its public API: ``"module:name"`` ->
the attributes used of it (methods, class attributes, or attributes its ``__init__``
sets)."""


class HeaderLimits(Protocol):
    """What :class:`LimitedHttpProtocol` reads of the server's limits (a
    :class:`~aioinfer.serving.connection.ConnectionLimits`, which makes the protocol)."""

    @property
    def header_timeout(self) -> float:
        """Seconds until a request's headers must be complete."""

    @property
    def max_header_count(self) -> int:
        """Header lines a request may have."""

    @property
    def max_header_bytes(self) -> int:
        """Bytes of request line and headers a request may have."""


def limited_protocol(limits: HeaderLimits) -> type[LimitedHttpProtocol]:
    """uvicorn's ``http`` option for ``limits``: a protocol class that enforces them."""
    return type("LimitedHttpProtocol", (LimitedHttpProtocol,), {"limits": limits})


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


class _HeaderLimitExceeded(Exception):
    """Raised in a parser callback: stops the parser, which reports the request as bad."""


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`ConnectionLimits`' header limits.

    Toward ``max_header_bytes`` count the parsed request line and headers, and also,
    while the headers are incomplete (a header still arriving, which the parser buffers),
    every byte received since the request began: either over the limit refuses it. A
    chunk that also ends an earlier request is not counted (its start is not this
    request's), so the raw count may lag by one chunk.
    """

    limits: ClassVar[HeaderLimits]
    """Set on the subclass that :func:`limited_protocol` makes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._in_headers = True  # no request yet, or one whose headers are incomplete
        self._request_begun = False
        self._completed_in_chunk = False
        self._raw_header_bytes = 0
        self._parsed_header_bytes = 0
        self._header_count = 0
        self._refusal: bytes | None = None
        self._direct = DirectInfer.of(self.app)
        self._direct_cycle: RequestResponseCycle | None = None
        self._idle_since: float | None = None
        """When the last response ended with no request after it (None: busy)."""
        self._keep_alive_timer: asyncio.TimerHandle | None = None
        self.lost = False
        """Whether the connection was lost (its client went away)."""
        self.inferring: asyncio.Task[Any] | None = None
        """The task of a direct infer request whose inference runs (cancelled when the
        connection is lost)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._disarm_header_timer()
        if self._keep_alive_timer is not None:
            self._keep_alive_timer.cancel()
            self._keep_alive_timer = None
        super().connection_lost(exc)
        if self.inferring is not None:
            self.inferring.cancel()

    def data_received(self, data: bytes) -> None:
        self._completed_in_chunk = False
        self._idle_since = None
        super().data_received(data)
        if self._request_begun and self._header_timer is None and self._refusal is None:
            # Armed only for headers that did not arrive in one chunk: most requests'
            # headers do, and a timer per request costs the event loop.
            self._arm_header_timer()
        if self._in_headers and not self._completed_in_chunk and self._refusal is None:
            self._raw_header_bytes += len(data)
            if self._raw_header_bytes > self.limits.max_header_bytes:
                self._refuse_headers(f"{self.limits.max_header_bytes} bytes")
                self.send_400_response("")

    # -- parser callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = self._request_begun = True
        self._raw_header_bytes = self._parsed_header_bytes = self._header_count = 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._count_header_bytes(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._header_count += 1
        if self._header_count > self.limits.max_header_count:
            self._refuse_headers(f"{self.limits.max_header_count} header lines")
            raise _HeaderLimitExceeded
        self._count_header_bytes(len(name) + len(value) + 4)  # ": " and CRLF

    def on_headers_complete(self) -> None:
        self._in_headers = self._request_begun = False
        self._disarm_header_timer()
        super().on_headers_complete()
        cycle = self.cycle  # its task has not started: it will write through the wrapper
        if cycle is not None and cycle is not self._direct_cycle:  # (None: an upgrade)
            cycle.transport = _OneWriteTransport(self.transport, cycle)  # type: ignore[assignment]

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        """Start the request's task: an infer request to the app of ``create_app`` is
        answered by the connection itself (see :class:`DirectInfer`), the rest by the
        app (or by uvicorn's 503 when over ``limit_concurrency``)."""
        direct = self._direct
        if direct is not None and app is self.app:
            target = direct.target(cycle)
            if target is not None:
                self._direct_cycle = cycle
                task = self.loop.create_task(direct.run(self, cycle, *target))
                task.add_done_callback(self.tasks.discard)
                self.tasks.add(task)
                return
        super()._start_asgi_task(cycle, app)

    def on_message_complete(self) -> None:
        self._completed_in_chunk = True
        super().on_message_complete()

    # -- keep-alive -------------------------------------------------------------------

    def on_response_complete(self) -> None:
        """uvicorn's, but the keep-alive timeout is one timer per connection that checks
        how long the connection has been idle, not a new timer per response (arming and
        cancelling one cost about 3 us a request)."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:  # pipelined requests: start the next one
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self._keep_alive_timer is None:
            self._keep_alive_timer = self.loop.call_later(
                self.timeout_keep_alive, self._keep_alive_expired
            )

    def _keep_alive_expired(self) -> None:
        self._keep_alive_timer = None
        since = self._idle_since
        if since is None or self.transport.is_closing():
            return  # a request came: the end of its response arms the timer again
        left = since + self.timeout_keep_alive - self.loop.time()
        if left > 0:
            self._keep_alive_timer = self.loop.call_later(left, self._keep_alive_expired)
        else:
            self.timeout_keep_alive_handler()

    # -- refusals ---------------------------------------------------------------------

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request the parser refused; 431 when a header limit
        stopped the parser."""
        if self._refusal is None:
            super().send_400_response(msg)
            return
        if not self.transport.is_closing():
            self.transport.write(self._refusal)
            self.transport.close()

    def _count_header_bytes(self, size: int) -> None:
        self._parsed_header_bytes += size
        if self._parsed_header_bytes > self.limits.max_header_bytes:
            self._refuse_headers(f"{self.limits.max_header_bytes} bytes")
            raise _HeaderLimitExceeded

    def _refuse_headers(self, limit: str) -> None:
        self._disarm_header_timer()
        self._refusal = _response(431, f"the request's headers exceed the limit of {limit}")

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.limits.header_timeout, self._header_timeout)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        # A request begun (and no response under way) is told why; an idle one is not.
        if self._request_begun and (self.cycle is None or self.cycle.response_complete):
            seconds = f"{self.limits.header_timeout:g}"
            message = f"the request's headers did not arrive within {seconds} s"
            self.transport.write(_response(408, message))
        self.transport.close()


class _OneWriteTransport:
    """The transport as one response cycle sees it: the status line and headers of a
    response with a ``Content-Length`` wait for its body, so that the whole response
    is one write (one system call, one TCP segment for the client to read) instead of
    two. A streamed response (chunked) has its headers written at once, as has the
    answer to a HEAD request."""

    __slots__ = ("_cycle", "_head", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self._transport = transport
        self._cycle = cycle
        """The cycle until it wrote its status line and headers (then None: the
        cycle refers to this object, and a reference cycle would leave both to the
        garbage collector)."""
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head + data)
            return
        cycle = self._cycle
        # The cycle's first write once its response started is the status line and
        # headers; "100 Continue", written earlier, goes out at once.
        if cycle is not None and cycle.response_started:
            self._cycle = None
            # A HEAD response has no body write to wait for.
            if cycle.chunked_encoding is False and cycle.scope["method"] != "HEAD":
                self._head = data
                return
        self._transport.write(data)

    def close(self) -> None:
        head, self._head = self._head, None
        if head is not None:  # the app failed after starting its response
            self._transport.write(head)
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()


def _response(status: int, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    head = (
        b"content-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
    )
    return STATUS_LINE[status] + head + body
