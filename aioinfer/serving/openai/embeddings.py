"""``POST /v1/embeddings`` (OpenAI's) and ``POST /v1/rerank`` (the shape of Cohere's,
Jina's and vLLM's rerank APIs, also at ``/rerank`` and ``/v2/rerank`` as vLLM serves it),
answered by a served text model (:mod:`aioinfer.serving.text_models`).

The routes translate: a body is read within the service's size limit and checked
field by field (a 400 names the field in ``param``); the texts go to the model through
:meth:`~aioinfer.serving.service.InferenceService.call`, which admits and counts the
request as any inference; errors answer with OpenAI's body.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from aioinfer.errors import ErrorKind, ServiceError
from aioinfer.serving.models import ServedModel
from aioinfer.serving.openai.errors import OPENAI_STATUS, error_response
from aioinfer.serving.rest.body import read_body
from aioinfer.serving.rest.disconnect import unless_disconnected
from aioinfer.serving.service import InferenceService
from aioinfer.serving.text_models import ServedTextModel

MAX_INPUTS = 2048
"""The most texts in one embeddings request (OpenAI's limit), or documents in a rerank."""
ENCODING_FORMATS = ("float", "base64")


class FieldError(ServiceError):
    """A request body's field that the endpoint cannot take (INVALID_ARGUMENT); the
    answer names it in ``param``."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}", ErrorKind.INVALID_ARGUMENT)
        self.param = param


def _field(body: dict[str, Any], name: str, kinds: tuple[type, ...], what: str) -> Any:
    value = body.get(name)
    if value is not None and (
        (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds)
    ):
        raise FieldError(name, f"expected {what}, got {json.dumps(value)[:80]}")
    return value


def _model_name(body: dict[str, Any]) -> str:
    name = _field(body, "model", (str,), "a model name")
    if not name:
        raise FieldError("model", "expected a model name, got none")
    return str(name)


def _embedding_input(value: Any) -> list[str] | list[list[int]]:
    """OpenAI's ``input``: a string, a list of strings, a list of token ids, or a list of
    token-id lists."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise FieldError(
            "input",
            f"expected a string or a list of strings or token ids, got {type(value).__name__}",
        )
    if not value:
        raise FieldError("input", "expected at least one text, got an empty list")
    if all(isinstance(item, int) and not isinstance(item, bool) for item in value):
        value = [value]
    if len(value) > MAX_INPUTS:
        raise FieldError("input", f"expected at most {MAX_INPUTS} texts, got {len(value)}")
    if all(isinstance(item, str) for item in value):
        for index, text in enumerate(value):
            if not text:
                raise FieldError(f"input[{index}]", "expected a non-empty string, got ''")
        return value
    if all(isinstance(item, list) for item in value):
        for index, ids in enumerate(value):
            if not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise FieldError(f"input[{index}]", "expected a non-empty list of token ids")
        return value
    raise FieldError("input", "expected strings or token-id lists, not a mix of them")


def _encode_vector(vector: Any, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":  # float32, little-endian, as the openai client reads it
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


def _text_model(model: ServedModel, task: str) -> ServedTextModel:
    """``model`` as a text model that does ``task`` (``"embed"`` or ``"rerank"``)."""
    if not isinstance(model, ServedTextModel):
        raise FieldError(
            "model", f"model {model.name!r} is not a text model (an embedding or rerank folder)"
        )
    if model.task != task:
        doing = "a reranker" if model.task == "rerank" else "an embedding model"
        raise FieldError("model", f"model {model.name!r} is {doing}: it does not {task}")
    return model


class EmbeddingRoutes:
    """The endpoints of the text models of ``service``."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service

    async def _body(self, request: Request) -> dict[str, Any]:
        declared = request.headers.get("content-length")
        raw = await read_body(
            request.receive,
            None if declared is None else declared.encode(),
            self.service.max_request_bytes,
        )
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise ServiceError(f"the body is not JSON: {exc}", ErrorKind.INVALID_ARGUMENT) from None
        if not isinstance(body, dict):
            raise ServiceError(
                f"expected a JSON object, got {type(body).__name__}", ErrorKind.INVALID_ARGUMENT
            )
        return body

    async def embeddings(self, request: Request) -> Response:
        """``POST /v1/embeddings``: OpenAI's request and response, plus ``truncate``
        (default true: texts longer than the model's maximum are cut, as
        sentence-transformers does; false refuses them with a 400)."""
        return await _answer(lambda: self._embeddings(request))

    async def _embeddings(self, request: Request) -> Response:
        body = await self._body(request)
        name = _model_name(body)
        texts = _embedding_input(body.get("input"))
        encoding_format = _field(body, "encoding_format", (str,), "'float' or 'base64'") or "float"
        if encoding_format not in ENCODING_FORMATS:
            raise FieldError(
                "encoding_format", f"expected 'float' or 'base64', got {encoding_format!r}"
            )
        dimensions = _field(body, "dimensions", (int,), "a positive int")
        truncate = _field(body, "truncate", (bool,), "true or false")
        async with self.service.call(name, None) as call:
            model = _text_model(call.model, "embed")
            width = model.embedder.dimensions
            if dimensions is not None and not 1 <= dimensions <= (width or dimensions):
                raise FieldError(
                    "dimensions", f"expected 1 to {width} (the model's), got {dimensions}"
                )
            with _refusal_of("input"):
                vectors, tokens = await unless_disconnected(
                    request.receive,
                    lambda: model.embed(
                        texts, dimensions=dimensions, truncate=truncate is not False
                    ),
                )
            data = [
                {"object": "embedding", "index": i, "embedding": _encode_vector(v, encoding_format)}
                for i, v in enumerate(vectors)
            ]
            return JSONResponse(
                {
                    "object": "list",
                    "data": data,
                    "model": model.name,
                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                }
            )

    async def rerank(self, request: Request) -> Response:
        """``POST /v1/rerank``: ``{"model", "query", "documents" (strings, or objects
        with a "text"), "top_n", "return_documents" (default true), "truncate"}`` ->
        ``{"id", "model", "results": [{"index", "relevance_score", "document":
        {"text"}}]}``, the most relevant first."""
        return await _answer(lambda: self._rerank(request))

    async def _rerank(self, request: Request) -> Response:
        body = await self._body(request)
        name = _model_name(body)
        query = _field(body, "query", (str,), "a string")
        if not query:
            raise FieldError("query", "expected a non-empty string")
        documents = body.get("documents")
        if not isinstance(documents, list) or not documents:
            raise FieldError("documents", "expected a non-empty list of strings")
        if len(documents) > MAX_INPUTS:
            raise FieldError("documents", f"expected at most {MAX_INPUTS}, got {len(documents)}")
        texts = []
        for index, document in enumerate(documents):
            text = document.get("text") if isinstance(document, dict) else document
            if not isinstance(text, str):
                raise FieldError(
                    f"documents[{index}]", "expected a string or an object with a 'text'"
                )
            texts.append(text)
        top_n = _field(body, "top_n", (int,), "a positive int")
        if top_n is not None and top_n < 1:
            raise FieldError("top_n", f"expected a positive int, got {top_n}")
        return_documents = _field(body, "return_documents", (bool,), "true or false")
        truncate = _field(body, "truncate", (bool,), "true or false")
        async with self.service.call(name, None) as call:
            model = _text_model(call.model, "rerank")
            with _refusal_of("documents"):
                ranked = await unless_disconnected(
                    request.receive,
                    lambda: model.rerank(query, texts, top_n=top_n, truncate=truncate is not False),
                )
            results = []
            for item in ranked:
                result: dict[str, Any] = {"index": item.index, "relevance_score": item.score}
                if return_documents is not False:
                    result["document"] = {"text": texts[item.index]}
                results.append(result)
            return JSONResponse(
                {"id": f"rerank-{uuid.uuid4().hex}", "model": model.name, "results": results}
            )


@contextmanager
def _refusal_of(param: str) -> Iterator[None]:
    """A refusal of the texts (INVALID_ARGUMENT) as a :class:`FieldError` of ``param``."""
    try:
        yield
    except FieldError:
        raise
    except ServiceError as exc:
        if exc.kind is not ErrorKind.INVALID_ARGUMENT:
            raise
        raise FieldError(param, str(exc)) from exc


async def _answer(handle: Callable[[], Awaitable[Response]]) -> Response:
    """``handle()``'s response, or OpenAI's error body for a refused request."""
    try:
        return await handle()
    except FieldError as exc:
        return error_response(400, str(exc), param=exc.param)
    except ServiceError as exc:
        param = "model" if exc.kind is ErrorKind.NOT_FOUND else None
        return error_response(OPENAI_STATUS[exc.kind], str(exc), param=param)


def embedding_routes(service: InferenceService) -> list[BaseRoute]:
    """The embedding and rerank routes."""
    routes = EmbeddingRoutes(service)
    return [
        Route("/v1/embeddings", routes.embeddings, methods=["POST"]),
        *(
            Route(path, routes.rerank, methods=["POST"])
            for path in ("/v1/rerank", "/rerank", "/v2/rerank")
        ),
    ]
