"""The REST transport: the Open Inference Protocol (KServe v2 REST) and Triton's
extensions over the model service, as a Starlette (ASGI) app.

- ``app.py``: the app and its endpoints (:func:`create_app`), and :data:`HTTP_STATUS`,
  the table from each :class:`~aioinfer.errors.ErrorKind` to an HTTP status;
- ``generation.py``: the generate endpoints (JSON and server-sent events);
- ``body.py``, ``compression.py``, ``disconnect.py``, ``auth.py``: reading a body within
  its limit, content codings, a client that goes away, the API key;
- ``uvicorn_http.py``: what :func:`serve <aioinfer.serving.serve>` takes from uvicorn's
  internals (its httptools protocol, extended: connection limits, infer requests
  answered by their connection), all in that one module.
"""

from aioinfer.serving.rest.app import EXTENSIONS, HTTP_STATUS, OipApp, RestAdapter, create_app

__all__ = ["EXTENSIONS", "HTTP_STATUS", "OipApp", "RestAdapter", "create_app"]
