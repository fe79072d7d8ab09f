"""The REST adapter of generation: Triton's generate extension, with token ids.

``POST /v2/models/{m}[/versions/{v}]/generate`` takes ``{"input_ids": [...]}`` (or
``{"text_input": "..."}`` for a model with a tokenizer) and ``"parameters"`` (see
:data:`~aioinfer.serving.generation.PARAMETERS`), and answers once the generation
ended: ``{"model_name", "model_version", "output_ids", "finish_reason"}`` (and
``"text_output"``). ``POST .../generate_stream`` answers ``text/event-stream``: one
``data: {"model_name", "model_version", "token_id", "index"}`` event per token as it
comes (and ``"text_output"``, the text it adds), the last with ``"finish_reason"``.

The status line waits for the first token, so that an error before it (a bad prompt,
a full queue, a kernel failing on the prompt) is an error status with a JSON body as
for any request; an error after it is a ``data: {"error": ...}`` event that ends the
stream. A client that disconnects stops its generation: a task waits for the
disconnect from the start and cancels the generation, which stops its running step
between kernels.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from typing import Any

import anyio
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from aioinfer.errors import ErrorKind, ProtocolError, ServiceError
from aioinfer.serving.generation import GeneratedToken, GenerateRequest
from aioinfer.serving.rest.body import read_body
from aioinfer.serving.service import InferenceService

_JSON = [(b"content-type", b"application/json")]
_EVENTS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # proxies pass each event on at once
]


def generate_routes(
    service: InferenceService, status: Mapping[ErrorKind, int], paths: list[str]
) -> list[Route]:
    """The generate and generate_stream routes below each of ``paths`` (a model's path,
    a version's), answering each kind of error with its ``status``."""
    routes = []
    for path in paths:
        routes.append(
            Route(path + "/generate", _Generate(service, status, False), methods=["POST"])
        )
        routes.append(
            Route(path + "/generate_stream", _Generate(service, status, True), methods=["POST"])
        )
    return routes


class _Generate:
    """One of the endpoints, as an ASGI app (the router calls it without wrapping)."""

    def __init__(
        self, service: InferenceService, status: Mapping[ErrorKind, int], stream: bool
    ) -> None:
        self.service = service
        self.status = status
        self.stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        params = scope["path_params"]
        try:
            length = dict(scope["headers"]).get(b"content-length")
            body = await read_body(receive, length, self.service.max_request_bytes)
            request = _decode(body)
        except ServiceError as exc:
            await _respond(send, self.status[exc.kind], {"error": str(exc)})
            return
        tokens = self.service.generate(params["model"], params.get("version"), request)
        async with anyio.create_task_group() as group:
            group.start_soon(_cancel_on_disconnect, receive, group.cancel_scope)
            async with aclosing(tokens):
                if self.stream:
                    await self._events(tokens, send)
                else:
                    await self._answer(tokens, send)
            group.cancel_scope.cancel()

    async def _answer(self, tokens: AsyncGenerator[GeneratedToken, None], send: Send) -> None:
        """The whole generation in one JSON response."""
        generated: list[GeneratedToken] = []
        try:
            async for token in tokens:
                generated.append(token)
        except ServiceError as exc:
            await _respond(send, self.status[exc.kind], {"error": str(exc)})
            return
        last = generated[-1]
        body: dict[str, Any] = {
            "model_name": last.model_name,
            "model_version": last.model_version,
            "output_ids": [t.token_id for t in generated],
            "finish_reason": last.finish_reason,
        }
        if last.text is not None:
            body["text_output"] = "".join(t.text or "" for t in generated)
        await _respond(send, 200, body)

    async def _events(self, tokens: AsyncGenerator[GeneratedToken, None], send: Send) -> None:
        """Server-sent events, one per token; the status once the first token is known."""
        try:
            first = await anext(tokens)
        except ServiceError as exc:
            await _respond(send, self.status[exc.kind], {"error": str(exc)})
            return
        await send({"type": "http.response.start", "status": 200, "headers": _EVENTS})
        await send({"type": "http.response.body", "body": _event(first), "more_body": True})
        try:
            async for token in tokens:
                await send({"type": "http.response.body", "body": _event(token), "more_body": True})
        except ServiceError as exc:
            error = _data({"error": str(exc)})
            await send({"type": "http.response.body", "body": error, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


def _decode(body: bytes) -> GenerateRequest:
    """The generate request of a JSON body.

    Raises:
        ProtocolError: not a JSON object, an unknown key, a value of the wrong type.
    """
    try:
        values = json.loads(body)
    except ValueError as exc:
        raise ProtocolError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(values, dict):
        raise ProtocolError("the request body must be a JSON object")
    known = ("input_ids", "text_input", "parameters")
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ProtocolError(
            f"unknown key(s) {', '.join(map(repr, unknown))} in a generate request; known: "
            f"{', '.join(known)}"
        )
    input_ids = values.get("input_ids")
    if input_ids is not None and (
        not isinstance(input_ids, list)
        or any(isinstance(i, bool) or not isinstance(i, int) for i in input_ids)
    ):
        raise ProtocolError(f"'input_ids' must be a list of integers, got {input_ids!r:.80}")
    text = values.get("text_input")
    if text is not None and not isinstance(text, str):
        raise ProtocolError(f"'text_input' must be a string, got {text!r:.80}")
    parameters = values.get("parameters", {})
    if not isinstance(parameters, dict):
        raise ProtocolError(f"'parameters' must be a JSON object, got {parameters!r:.80}")
    return GenerateRequest(input_ids, text, parameters)


def _event(token: GeneratedToken) -> bytes:
    event: dict[str, Any] = {
        "model_name": token.model_name,
        "model_version": token.model_version,
        "token_id": token.token_id,
        "index": token.index,
    }
    if token.text is not None:
        event["text_output"] = token.text
    if token.finish_reason is not None:
        event["finish_reason"] = token.finish_reason
    return _data(event)


def _data(value: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(value).encode() + b"\n\n"


async def _respond(send: Send, status: int, body: dict[str, Any]) -> None:
    content = json.dumps(body).encode()
    headers = [*_JSON, (b"content-length", str(len(content)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})
