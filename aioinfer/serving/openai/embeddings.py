"""``/v1/embeddings`` and ``/v1/rerank``."""

from __future__ import annotations

from starlette.routing import BaseRoute

from aioinfer.serving.service import InferenceService


def embedding_routes(service: InferenceService) -> list[BaseRoute]:
    """The embedding and rerank routes."""
    return []
