"""The server's API key over gRPC: the REST check's policy (``serving/rest/auth.py``) on
gRPC metadata.

Health (``ServerLive``, ``ServerReady``) stays open, as ``/v2/health/*`` does over REST;
every other RPC needs the key as metadata ``authorization: Bearer <key>`` (what
tritonclient's ``headers=`` and gRPC's call credentials send) or ``x-api-key: <key>``,
compared in constant time, else it ends with UNAUTHENTICATED before its handler runs.
The check is a server interceptor, installed only when a key is set: a server without
one pays nothing per call.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from aioinfer.errors import ServingConfigError

SERVICE = "inference.GRPCInferenceService"
"""The gRPC service the server implements (KServe v2, with Triton's additions)."""

OPEN_METHODS = frozenset({f"/{SERVICE}/ServerLive", f"/{SERVICE}/ServerReady"})
"""The RPCs open without a key."""


class GrpcApiKeyCheck(grpc.aio.ServerInterceptor):
    """Admits a call to an RPC outside :data:`OPEN_METHODS` only when its metadata
    carries ``key``.

    Raises:
        ServingConfigError: ``key`` is empty.
    """

    def __init__(self, key: str) -> None:
        if not key:
            raise ServingConfigError("the API key is empty: give a non-empty key, or none")
        self._key = key.encode()

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method in OPEN_METHODS:
            return handler
        given = _credentials(handler_call_details.invocation_metadata or ())
        if any(hmac.compare_digest(credential, self._key) for credential in given):
            return handler
        if given:
            message = "the API key is not valid"
        else:
            message = "this RPC needs the server's API key: send it as metadata "
            message += "'authorization: Bearer <key>' or 'x-api-key: <key>'"
        return _refusal(handler, message)


def _credentials(metadata: Any) -> list[bytes]:
    """The keys a call carries: bearer tokens and ``x-api-key`` values."""
    found = []
    for name, value in metadata:
        raw = value if isinstance(value, bytes) else value.encode()
        if name == "authorization":
            scheme, _, token = raw.partition(b" ")
            if scheme.lower() == b"bearer":
                found.append(token.strip())
        elif name == "x-api-key":
            found.append(raw.strip())
    return found


def _refusal(handler: Any, message: str) -> Any:
    """A handler of ``handler``'s kind that ends the call with UNAUTHENTICATED."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)
