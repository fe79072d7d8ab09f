"""FastAPI + aioinfer: an endpoint that preprocesses, awaits an inference, postprocesses.

    pip install 'aioinfer[serve]' fastapi
    uvicorn examples.fastapi_app:app --port 8000
    curl -s localhost:8000/classify -H 'content-type: application/json' \\
         -d "{\\"pixels\\": $(python -c 'print([[[128] * 3] * 32] * 32)')}"

``POST /classify`` takes a 32x32 RGB image (nested lists, values 0-255) and answers the
three likeliest classes of the bundled ``tiny_cnn`` model (random weights: the labels are
for show). The compiled model is created in the app's lifespan, off the event loop, with
the THROUGHPUT hint: concurrent requests are batched on the BATCH device. A client that
disconnects cancels its task, and with it the inference.

The same app mounts aioinfer's Open Inference Protocol server under ``/oip``, so that
tritonclient (or any KServe v2 client) reaches the model too:
``tritonclient.http.InferenceServerClient("localhost:8000/oip")``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel

import aioinfer as ai
from aioinfer.models import default_model_path
from aioinfer.serving import create_app

CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
MEAN, STD = 127.5, 64.0

oip = create_app(default_model_path())


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    core = ai.Core()
    model = default_model_path()
    app.state.compiled = await core.compile_model_async(
        model, "CPU", {"PERFORMANCE_HINT": "THROUGHPUT"}
    )
    async with oip.router.lifespan_context(oip):  # a mounted app's lifespan runs here
        yield
    await app.state.compiled.close()


app = FastAPI(title="aioinfer example", lifespan=lifespan)
app.mount("/oip", oip)


class Image(BaseModel):
    pixels: list[list[list[float]]]
    """32 rows of 32 pixels of 3 channels (RGB), 0-255."""


class Prediction(BaseModel):
    label: str
    probability: float


def preprocess(pixels: list[list[list[float]]]) -> np.ndarray:
    """HWC 0-255 -> a normalised NCHW float32 batch of one."""
    image = np.asarray(pixels, np.float32)
    if image.shape != (32, 32, 3):
        raise HTTPException(422, f"pixels must be 32x32x3 (RGB), got {list(image.shape)}")
    return ((image - MEAN) / STD).transpose(2, 0, 1)[np.newaxis]


def postprocess(probabilities: np.ndarray, top: int = 3) -> list[Prediction]:
    order = np.argsort(probabilities)[::-1][:top]
    return [Prediction(label=CLASSES[i], probability=float(probabilities[i])) for i in order]


@app.post("/classify")
async def classify(image: Image, request: Request) -> list[Prediction]:
    batch = preprocess(image.pixels)
    compiled: ai.CompiledModel = request.app.state.compiled
    async with compiled.create_infer_request() as infer_request:
        results = await infer_request.infer({"image": batch})
    return postprocess(results["probabilities"][0])
