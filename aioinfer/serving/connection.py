"""Connection limits for a public server: a header-read timeout and caps on headers.

uvicorn's httptools protocol starts no timer before a request's headers are complete (its
keep-alive timeout runs only between requests) and buffers headers without bound: 300
clients that opened connections and sent their headers a byte at a time held every
descriptor of a 256-descriptor server, and one request with 5,000 headers or a 10 MB
header was accepted. :class:`ConnectionLimits` makes uvicorn's options and these three
limits one value; its protocol closes a connection whose request line and headers have
not arrived within ``header_timeout`` seconds (408 once a request has begun) and answers
431 to a request with too many or too large headers, then closes that connection.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from aioinfer.errors import ServingConfigError
from aioinfer.serving.rest.direct import DirectInfer


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection may hold of the server, and for how long.

    Args:
        header_timeout: seconds from a connection's opening, or from the first byte of a
            later request on it, until the request's headers must be complete.
        max_header_count: header lines a request may have.
        max_header_bytes: bytes of request line and headers a request may have.
        limit_concurrency: uvicorn's: once this many connections are open (the new one
            included) or requests run, a request gets 503 and its connection is closed.
            None: no limit.
        backlog: uvicorn's: connections the kernel queues before the server accepts them.
        timeout_keep_alive: uvicorn's: seconds an idle connection stays open between
            requests.

    Raises:
        ServingConfigError: a value out of range (named).
    """

    header_timeout: float = 10.0
    max_header_count: int = 100
    max_header_bytes: int = 32 * 1024
    limit_concurrency: int | None = None
    backlog: int = 2048
    timeout_keep_alive: int = 5

    def __post_init__(self) -> None:
        if not self.header_timeout > 0:
            raise ServingConfigError(
                f"header_timeout must be above 0 seconds, got {self.header_timeout!r}"
            )
        for name in ("max_header_count", "max_header_bytes", "limit_concurrency", "backlog"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ServingConfigError(f"{name} must be at least 1, got {value!r}")
        if self.timeout_keep_alive < 0:
            raise ServingConfigError(
                f"timeout_keep_alive must be at least 0 seconds, got {self.timeout_keep_alive!r}"
            )

    def uvicorn_options(self) -> dict[str, Any]:
        """Keyword arguments of ``uvicorn.Config`` that enforce these limits."""
        protocol = type("LimitedHttpProtocol", (LimitedHttpProtocol,), {"limits": self})
        return {
            "http": protocol,
            "limit_concurrency": self.limit_concurrency,
            "backlog": self.backlog,
            "timeout_keep_alive": self.timeout_keep_alive,
        }


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

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

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
        answered by the connection itself (see ``serving/rest/direct.py``), the rest by the
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
