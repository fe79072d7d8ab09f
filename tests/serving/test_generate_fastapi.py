"""examples/generate_fastapi.py: tokens streamed as server-sent events from a FastAPI app."""

from __future__ import annotations

import json

import httpx

from examples import generate_fastapi
from examples.models.decoder import SENTENCE
from tests.serving.conftest import LiveServer


def stream(live: LiveServer, body: dict[str, object]) -> list[str]:
    url = f"http://{live.url}/generate"
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return [line[6:] for line in response.iter_lines() if line.startswith("data: ")]


def test_the_app_streams_the_generated_words_as_events() -> None:
    with LiveServer(generate_fastapi.app) as live:
        data = stream(live, {"prompt": "aioinfer keeps", "max_new_tokens": 5})
        assert data[-1] == "[DONE]"
        events = [json.loads(d) for d in data[:-1]]
        assert [e["index"] for e in events] == list(range(5))
        assert " ".join(e["token"] for e in events) == " ".join(SENTENCE.split()[2:7])
        # Greedy decoding recites the sentence to its end, and stops at ".".
        data = stream(live, {"prompt": "so every", "max_new_tokens": 20})
        words = [json.loads(d)["token"] for d in data[:-1]]
        sentence = SENTENCE.split()
        assert ["so", "every", *words] == sentence[sentence.index("so") :]
        response = httpx.post(f"http://{live.url}/generate", json={"prompt": "unknown words"})
        assert response.status_code == 422
