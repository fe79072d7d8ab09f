"""``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions``."""

from __future__ import annotations

from starlette.routing import BaseRoute

from aioinfer.serving.service import InferenceService


def completion_routes(service: InferenceService) -> list[BaseRoute]:
    """The model list and the text generation routes."""
    return []
