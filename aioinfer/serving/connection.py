"""Connection limits for a public server: a header-read timeout and caps on headers.

uvicorn's httptools protocol starts no timer before a request's headers are complete (its
keep-alive timeout runs only between requests) and buffers headers without bound: 300
clients that opened connections and sent their headers a byte at a time held every
descriptor of a 256-descriptor server, and one request with 5,000 headers or a 10 MB
header was accepted. :class:`ConnectionLimits` makes uvicorn's options and these three
limits one value; its protocol closes a connection whose request line and headers have
not arrived within ``header_timeout`` seconds (408 once a request has begun) and answers
431 to a request with too many or too large headers, then closes that connection (the
protocol is :class:`~aioinfer.serving.rest.uvicorn_http.LimitedHttpProtocol`). The gRPC
server takes the same limits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aioinfer.errors import ServingConfigError
from aioinfer.serving.rest.uvicorn_http import limited_protocol


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
        return {
            "http": limited_protocol(self),
            "limit_concurrency": self.limit_concurrency,
            "backlog": self.backlog,
            "timeout_keep_alive": self.timeout_keep_alive,
        }
