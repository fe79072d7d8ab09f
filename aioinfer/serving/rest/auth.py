"""An API key that every endpoint but the health checks requires (off unless one is set).

As Triton restricts endpoint groups and leaves health open, so that a load balancer or
an orchestrator's probes need no secret: ``/v2/health/live`` and ``/v2/health/ready``
are open; ``/metrics`` too when asked (it names the models and their traffic). The key
comes as ``Authorization: Bearer <key>`` (what HTTP clients and Prometheus send) or as
``X-API-Key: <key>``, and is compared in constant time.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Collection

from starlette.types import Scope, Send

from aioinfer.errors import ServingConfigError
from aioinfer.serving.openai.errors import error_body

HEALTH_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})
"""The endpoints open without a key."""

API_KEY_HEADER = b"x-api-key"
REALM = b'Bearer realm="aioinfer"'


class ApiKeyCheck:
    """Admits a request to a path outside ``open_paths`` only when it carries ``key``.

    Raises:
        ServingConfigError: ``key`` is empty.
    """

    def __init__(self, key: str, open_paths: Collection[str] = HEALTH_PATHS) -> None:
        if not key:
            raise ServingConfigError("the API key is empty: give a non-empty key, or none")
        self._key = key.encode()
        self.open_paths = frozenset(open_paths)

    def allows(self, path: str, scope: Scope) -> bool:
        """Whether the request to ``path`` (below the app's mount point) may go on: the
        path is open, or one of its credentials is the key."""
        if path in self.open_paths:
            return True
        return any(hmac.compare_digest(given, self._key) for given in _credentials(scope))

    async def refuse(self, scope: Scope, send: Send) -> None:
        """Answer 401 with ``{"error"}`` (OpenAI's error object on ``/v1/`` paths) and a
        ``WWW-Authenticate`` challenge."""
        if _credentials(scope):
            message = "the API key is not valid"
            challenge = REALM + b', error="invalid_token"'
        else:
            message = "this endpoint needs the server's API key: send it as "
            message += "'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
            challenge = REALM
        # OpenAI's routes answer with OpenAI's error body, which its clients read.
        openai = "/v1/" in scope.get("path", "")
        body = json.dumps(error_body(401, message) if openai else {"error": message}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", challenge),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _credentials(scope: Scope) -> list[bytes]:
    """The keys a request carries: bearer tokens and ``X-API-Key`` values."""
    found = []
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer":
                found.append(token.strip())
        elif name == API_KEY_HEADER:
            found.append(value.strip())
    return found
