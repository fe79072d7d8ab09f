"""Reading an HTTP request body within a size limit: both REST adapters (inference and
generation) read bodies this way."""

from __future__ import annotations

from starlette.types import Receive

from aioinfer.errors import ClientDisconnectedError, ErrorKind, ProtocolError


async def read_body(receive: Receive, declared: bytes | None, limit: int) -> bytes:
    """The request body, refused (TOO_LARGE) as soon as it is known to exceed ``limit``
    bytes: by its ``Content-Length``, or else as its parts arrive."""
    check_declared(declared, limit)
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnectedError("the client disconnected while sending")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)  # of one part: that part itself, not a copy


def check_declared(declared: bytes | None, limit: int) -> None:
    """Refuse (TOO_LARGE) a body whose ``Content-Length`` exceeds ``limit`` bytes."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProtocolError(
            f"the request body has {int(declared)} bytes; the limit is {limit}",
            ErrorKind.TOO_LARGE,
        )


def too_large(limit: int) -> ProtocolError:
    """The error of a body found to exceed ``limit`` bytes as it arrives."""
    return ProtocolError(
        f"the request body exceeds the limit of {limit} bytes", ErrorKind.TOO_LARGE
    )
