"""Serving: an ASGI app for the Open Inference Protocol (KServe v2 REST).

Needs the ``serve`` extra (``pip install 'aioinfer[serve]'``: Starlette, uvicorn,
prometheus-client).

    app = create_app("models/")          # <repo>/<model>/<version>/model.onnx
    serve("models/", port=8000)          # or: aioinfer serve models/ --port 8000
"""

from aioinfer.serving.app import ModelServer, create_app
from aioinfer.serving.repository import ModelConfig, ModelRepository
from aioinfer.serving.server import serve

__all__ = ["ModelConfig", "ModelRepository", "ModelServer", "create_app", "serve"]
