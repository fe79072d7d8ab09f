"""examples/fastapi_app.py: the endpoint, the lifespan, the mounted protocol app."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

import aioinfer as ai
from aioinfer.models import default_model_path
from examples import fastapi_app
from tests.helpers import reference_outputs
from tests.serving.conftest import LiveServer


def pixels(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (32, 32, 3)).astype(np.float32)


def test_classify_preprocesses_infers_and_postprocesses() -> None:
    import onnx

    model = onnx.load(default_model_path())
    with LiveServer(fastapi_app.app) as live:  # uvicorn runs the lifespan
        client = httpx.Client(base_url=f"http://{live.url}")
        compiled = fastapi_app.app.state.compiled
        assert compiled.get_property("DEVICE_NAME") == "BATCH:CPU"  # THROUGHPUT batches
        for seed in range(3):
            image = pixels(seed)
            response = client.post("/classify", json={"pixels": image.tolist()})
            assert response.status_code == 200, response.text
            top = response.json()
            batch = fastapi_app.preprocess(image.tolist())
            expected = reference_outputs(model, {"image": batch})[0][0]
            order = np.argsort(expected)[::-1][:3]
            assert [p["label"] for p in top] == [fastapi_app.CLASSES[i] for i in order]
            np.testing.assert_allclose(
                [p["probability"] for p in top], expected[order], rtol=1e-4, atol=1e-6
            )
        bad = client.post("/classify", json={"pixels": [[[0.0, 0.0, 0.0]]]})
        assert bad.status_code == 422 and "32x32x3" in bad.json()["detail"]
    # Leaving the lifespan closed the compiled model.
    with pytest.raises(ai.RequestClosedError):
        compiled.create_infer_request()


def test_the_protocol_app_is_mounted() -> None:
    with LiveServer(fastapi_app.app) as live:
        client = httpx.Client(base_url=f"http://{live.url}")
        metadata = client.get("/oip/v2/models/tiny_cnn").json()
        assert metadata["inputs"] == [
            {"name": "image", "datatype": "FP32", "shape": [-1, 3, 32, 32]}
        ]
        batch = fastapi_app.preprocess(pixels(5).tolist())
        body = {
            "inputs": [
                {
                    "name": "image",
                    "shape": list(batch.shape),
                    "datatype": "FP32",
                    "data": batch.ravel().tolist(),
                }
            ]
        }
        response = client.post("/oip/v2/models/tiny_cnn/infer", json=body)
        assert response.status_code == 200, response.text
        output = response.json()["outputs"][0]
        assert output["name"] == "probabilities" and output["shape"] == [1, 10]
        assert abs(sum(output["data"]) - 1) < 1e-4
