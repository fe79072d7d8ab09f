"""OpenAI's error body, ``{"error": {"message", "type", "param", "code"}}``, with the HTTP
statuses the ``openai`` client maps to its exception classes (400 ``BadRequestError``,
401 ``AuthenticationError``, 404 ``NotFoundError``, 413, 429 ``RateLimitError``, 503 and
other 5xx ``InternalServerError``, retried by the client)."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.responses import JSONResponse

from aioinfer.errors import ErrorKind

OPENAI_STATUS: dict[ErrorKind, int] = {
    ErrorKind.INVALID_ARGUMENT: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.UNSUPPORTED_MEDIA: 415,
    ErrorKind.UNAUTHENTICATED: 401,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.RESOURCE_EXHAUSTED: 429,
    ErrorKind.CANCELLED: 499,
    ErrorKind.ABORTED: 503,
    ErrorKind.INTERNAL: 500,
}
"""The HTTP status that answers each kind of :class:`~aioinfer.errors.ServiceError` on
OpenAI's routes."""

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}
RETRY_AFTER_S = 1
"""The ``Retry-After`` a 429 or 503 carries (seconds)."""


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, dict[str, str | None]]:
    """OpenAI's error object for ``status``: its ``type`` follows the status."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """A JSON response with OpenAI's error body; a 429 or 503 says when to retry."""
    extra = dict(headers or {})
    if status in (429, 503):
        extra.setdefault("Retry-After", str(RETRY_AFTER_S))
    return JSONResponse(
        error_body(status, message, param=param, code=code), status_code=status, headers=extra
    )
