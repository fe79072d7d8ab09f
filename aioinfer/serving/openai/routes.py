"""Every route of OpenAI's API, as the REST app mounts them."""

from __future__ import annotations

from starlette.routing import BaseRoute

from aioinfer.serving.openai.completions import completion_routes
from aioinfer.serving.openai.embeddings import embedding_routes
from aioinfer.serving.service import InferenceService


def openai_routes(service: InferenceService) -> list[BaseRoute]:
    """The ``/v1/...`` routes answering for the models of ``service``."""
    return [*completion_routes(service), *embedding_routes(service)]
