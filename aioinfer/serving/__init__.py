"""Serving: the model service, and the Open Inference Protocol (KServe v2 REST) over it.

Needs the ``serve`` extra (``pip install 'aioinfer[serve]'``: Starlette, uvicorn,
prometheus-client).

    app = create_app("models/")          # <repo>/<model>/<version>/model.onnx
    serve("models/", port=8000)          # or: aioinfer serve models/ --port 8000
    serve("models/", grpc_port=8001)     # also KServe v2 gRPC (aioinfer.serving.grpc)

``InferenceService`` is what every transport calls (``app.state.server`` of the REST
app); it raises ``ServiceError`` with an ``ErrorKind`` that each transport maps to its
own codes.
"""

from aioinfer.errors import ErrorKind, ServiceError
from aioinfer.serving.generation import GeneratedToken, GenerateRequest
from aioinfer.serving.messages import InferenceRequest, InferenceResponse, RequestedOutput
from aioinfer.serving.repository import ModelConfig, ModelRepository, VersionPolicy
from aioinfer.serving.rest.app import create_app
from aioinfer.serving.server import serve
from aioinfer.serving.service import InferCall, InferenceService, ModelServer

__all__ = [
    "ErrorKind",
    "GenerateRequest",
    "GeneratedToken",
    "InferCall",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceService",
    "ModelConfig",
    "ModelRepository",
    "ModelServer",
    "RequestedOutput",
    "ServiceError",
    "VersionPolicy",
    "create_app",
    "serve",
]
