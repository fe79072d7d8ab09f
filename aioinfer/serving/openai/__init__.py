"""OpenAI's API beside the Open Inference Protocol, on the same app and port.

- ``routes.py``: :func:`openai_routes`, every route of the API, mounted by the REST app;
- ``errors.py``: OpenAI's error body and the status each kind of error answers with;
- ``completions.py``: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``;
- ``embeddings.py``: ``/v1/embeddings`` and ``/v1/rerank``.
"""

from aioinfer.serving.openai.errors import OPENAI_STATUS, error_response
from aioinfer.serving.openai.routes import openai_routes

__all__ = ["OPENAI_STATUS", "error_response", "openai_routes"]
