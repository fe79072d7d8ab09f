"""``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions``.

A request is admitted by the service as any other (:meth:`InferenceService.call
<aioinfer.serving.service.InferenceService.call>`: an unknown model is a 404, a full
model a 503), holds one of its model's slots while it generates, and runs its choices
(``n`` per prompt) through the model's :class:`~aioinfer.text.TextGenerator`, in the
model's one scheduler with every other generation. Each choice is a task; their chunks
meet in one stream that the handler writes out.

A streamed answer's status line waits for the first chunk, so that an error before it
(a full scheduler queue, a kernel failing on the prompt) is an error status with
OpenAI's body; an error after it is a ``data: {"error": ...}`` event, and the stream
ends. A task watches for the client's disconnect from the start: a client that goes
away (or times out and closes) cancels the choices, which takes their sequences out of
the batch before its next step.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from contextlib import aclosing
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from aioinfer.errors import (
    AioinferError,
    ErrorKind,
    GenerationError,
    RequestFieldError,
    ServiceError,
)
from aioinfer.serving.openai.errors import OPENAI_STATUS, RETRY_AFTER_S, error_body, error_response
from aioinfer.serving.openai.fields import TextRequest, chat_request, completion_request, parse_body
from aioinfer.serving.openai.responses import (
    Answer,
    Choice,
    chat_logprobs,
    completion_logprobs,
    usage,
)
from aioinfer.serving.rest.body import read_body
from aioinfer.serving.service import InferenceService
from aioinfer.text.generator import TextChunk, TextGenerator

_logger = logging.getLogger(__name__)

_JSON = [(b"content-type", b"application/json")]
_EVENTS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # proxies pass each event on at once
]
OWNER = "aioinfer"
"""The ``owned_by`` of every model in ``/v1/models``."""


def completion_routes(service: InferenceService) -> list[BaseRoute]:
    """The model list and the text generation routes."""
    models = _Models(service)
    return [
        Route("/v1/models", models.list, methods=["GET"]),
        Route("/v1/models/{model:path}", models.get, methods=["GET"]),
        Route("/v1/completions", _TextEndpoint(service, chat=False), methods=["POST"]),
        Route("/v1/chat/completions", _TextEndpoint(service, chat=True), methods=["POST"]),
    ]


class _Models:
    """``GET /v1/models``: every served model (embedding models too); ``GET
    /v1/models/{model}``: one."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service
        self.created = int(time.time())
        """The ``created`` of every model: when the routes were made (the server's start)."""

    async def list(self, request: Request) -> Response:
        data = [self._card(name) for name in sorted(self.service.models)]
        return JSONResponse({"object": "list", "data": data})

    async def get(self, request: Request) -> Response:
        name = request.path_params["model"]
        if name not in self.service.models:
            message = f"the model {name!r} does not exist"
            return error_response(404, message, param="model", code="model_not_found")
        return JSONResponse(self._card(name))

    def _card(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self.created, "owned_by": OWNER}


class _TextEndpoint:
    """``/v1/completions`` or ``/v1/chat/completions``, as an ASGI app."""

    def __init__(self, service: InferenceService, chat: bool) -> None:
        self.service = service
        self.chat = chat

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            length = dict(scope["headers"]).get(b"content-length")
            body = await read_body(receive, length, self.service.max_request_bytes)
            values = parse_body(body)
            request = chat_request(values) if self.chat else completion_request(values)
        except ServiceError as exc:
            await _send_error(send, exc)
            return
        try:
            async with self.service.call(request.model, None) as call:
                generator = _text_generator(self.service, call.model, request.model)
                async with call.model.slot() as waited:
                    call.waited = waited
                    await self._answer(generator, request, scope, receive, send)
        except ServiceError as exc:
            if exc.kind is not ErrorKind.CANCELLED:
                await _send_error(send, exc)

    async def _answer(
        self,
        generator: TextGenerator,
        request: TextRequest,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        prompts = await _prompts(generator, request)
        answer = Answer(request.model, self.chat)
        choices = [Choice(index) for index in range(len(prompts) * request.n)]
        writer = _Writer(send, answer, request, generator)
        sender, chunks = anyio.create_memory_object_stream[tuple[int, TextChunk | Exception]](
            len(choices) * 4
        )
        gone = False
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                nonlocal gone
                while (await receive())["type"] != "http.disconnect":
                    pass
                gone = True
                group.cancel_scope.cancel()

            group.start_soon(watch)
            async with sender:
                for choice in choices:
                    ids = prompts[choice.index // request.n]
                    options = dict(request.options)
                    if request.n > 1 and options.get("seed") is not None:
                        options["seed"] += choice.index % request.n  # n different choices
                    group.start_soon(
                        _run_choice, generator, ids, options, request, choice, sender.clone()
                    )
            async with chunks:
                left = len(choices)
                async for index, item in chunks:
                    if isinstance(item, Exception):
                        await writer.fail(_as_service_error(item))
                        left = -1
                        break
                    choice = choices[index]
                    choice.texts.append(item.text)
                    choice.steps.extend(item.steps)
                    if request.stream:
                        await writer.chunk(choice, item)
                    if item.finish_reason is not None:
                        choice.finish_reason = item.finish_reason
                        left -= 1
                        if left == 0:
                            break
                if left == 0:
                    tokens = usage(
                        sum(len(ids) for ids in prompts),
                        sum(len(choice.steps) for choice in choices),
                    )
                    if request.echo and not request.stream:
                        for choice in choices:
                            choice.texts.insert(0, _echo(generator, request, choice))
                    await writer.finish(choices, tokens)
                elif left > 0:  # every choice's task ended, one without its last chunk
                    ended = "a choice ended without a finish reason"
                    await writer.fail(ServiceError(ended, ErrorKind.INTERNAL))
            group.cancel_scope.cancel()
        if gone:
            raise ServiceError("the client went away", ErrorKind.CANCELLED)


async def _run_choice(
    generator: TextGenerator,
    ids: list[int],
    options: dict[str, Any],
    request: TextRequest,
    choice: Choice,
    sender: MemoryObjectSendStream[tuple[int, TextChunk | Exception]],
) -> None:
    """Generate one choice, sending its chunks (or the error that ended it)."""
    async with sender:
        try:
            async with aclosing(
                generator.stream(ids, logprobs=request.logprobs, **options)
            ) as stream:
                async for chunk in stream:
                    await sender.send((choice.index, chunk))
        except Exception as exc:  # handed to the writer: an error status or event
            await sender.send((choice.index, exc))


class _Writer:
    """Writes the answer: one JSON body, or server-sent events."""

    def __init__(
        self, send: Send, answer: Answer, request: TextRequest, generator: TextGenerator
    ) -> None:
        self.send = send
        self.answer = answer
        self.request = request
        self.generator = generator
        self.started = False
        self.offsets: dict[int, int] = {}

    async def _start(self) -> None:
        if not self.started:
            self.started = True
            await self.send({"type": "http.response.start", "status": 200, "headers": _EVENTS})

    async def _event(self, value: dict[str, Any] | str) -> None:
        data = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        body = b"data: " + data.encode() + b"\n\n"
        await self.send({"type": "http.response.body", "body": body, "more_body": True})

    async def chunk(self, choice: Choice, item: TextChunk) -> None:
        """The stream chunks of ``item`` (the chat's role chunk first)."""
        await self._start()
        answer, request = self.answer, self.request
        with_usage = request.include_usage
        if not choice.started:
            choice.started = True
            if answer.chat:
                await self._event(answer.chunk(choice.index, text="", role=True, usage=with_usage))
            elif request.echo:
                echo = _echo(self.generator, request, choice)
                await self._event(answer.chunk(choice.index, text=echo, usage=with_usage))
                self.offsets[choice.index] = len(echo)
        logprobs = None
        if request.logprobs is not None and item.steps:
            if answer.chat:
                logprobs = chat_logprobs(self.generator, item.steps)
            else:
                offset = self.offsets.get(choice.index, 0)
                logprobs = completion_logprobs(self.generator, item.steps, offset)
        offset = self.offsets.get(choice.index, 0) + len(item.text)
        self.offsets[choice.index] = offset
        if answer.chat:
            if item.text or logprobs is not None:
                chunk = answer.chunk(
                    choice.index, text=item.text, logprobs=logprobs, usage=with_usage
                )
                await self._event(chunk)
            if item.finish_reason is not None:
                chunk = answer.chunk(
                    choice.index, finish_reason=item.finish_reason, usage=with_usage
                )
                await self._event(chunk)
        elif item.text or logprobs is not None or item.finish_reason is not None:
            chunk = answer.chunk(
                choice.index,
                text=item.text,
                logprobs=logprobs,
                finish_reason=item.finish_reason,
                usage=with_usage,
            )
            await self._event(chunk)

    async def finish(self, choices: Sequence[Choice], tokens: dict[str, int]) -> None:
        """The whole answer, or the end of the stream (usage, then ``[DONE]``)."""
        if not self.request.stream:
            logprobs = self.request.logprobs is not None
            body = self.answer.whole(choices, tokens, logprobs, self.generator)
            await _respond(self.send, 200, body)
            return
        await self._start()
        if self.request.include_usage:
            await self._event(self.answer.usage_chunk(tokens))
        await self._event("[DONE]")
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})

    async def fail(self, error: ServiceError) -> None:
        """An error: its status before the stream started, an error event after."""
        if not self.started:
            await _send_error(self.send, error)
            return
        status = OPENAI_STATUS.get(error.kind, 500)
        await self._event(error_body(status, str(error), param=_param(error)))
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})


async def _prompts(generator: TextGenerator, request: TextRequest) -> list[list[int]]:
    """The token ids of each prompt (a chat: one, through the template)."""
    try:
        if request.messages is not None:
            return [await generator.prompt_ids(request.messages)]
        assert request.prompts is not None
        return [await generator.prompt_ids(prompt) for prompt in request.prompts]
    except AioinferError as exc:
        raise _as_service_error(exc) from None


def _echo(generator: TextGenerator, request: TextRequest, choice: Choice) -> str:
    """The prompt of ``choice``, as the completion echoes it."""
    assert request.prompts is not None
    prompt = request.prompts[choice.index // request.n]
    return prompt if isinstance(prompt, str) else generator.decode(prompt)


def _text_generator(service: InferenceService, model: Any, name: str) -> TextGenerator:
    generation = service.generations.get(model)
    if generation is None or generation.text is None:
        raise RequestFieldError(
            f"the model {name!r} does not generate text (it is not a decoder with a "
            "tokenizer.json)",
            "model",
        )
    return generation.text


def _as_service_error(error: Exception) -> ServiceError:
    if isinstance(error, ServiceError):
        return error
    if isinstance(error, GenerationError):  # a value out of range
        return ServiceError(str(error), ErrorKind.INVALID_ARGUMENT)
    kind = ErrorKind.of(error)
    if kind is ErrorKind.INTERNAL:
        _logger.error("text generation failed", exc_info=error)
        return ServiceError(f"internal server error: {type(error).__name__}: {error}", kind)
    return ServiceError(str(error), kind)


def _param(error: ServiceError) -> str | None:
    return error.param if isinstance(error, RequestFieldError) else None


async def _send_error(send: Send, error: ServiceError) -> None:
    status = OPENAI_STATUS.get(error.kind, 500)
    code = "model_not_found" if error.kind is ErrorKind.NOT_FOUND else None
    param = "model" if error.kind is ErrorKind.NOT_FOUND else _param(error)
    await _respond(send, status, error_body(status, str(error), param=param, code=code))


async def _respond(send: Send, status: int, body: dict[str, Any]) -> None:
    content = json.dumps(body, ensure_ascii=False).encode()
    headers = [*_JSON, (b"content-length", str(len(content)).encode())]
    if status in (429, 503):
        headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})
