"""Generation on Ray Serve: an optimum decoder folder served by one replica, its
generations streamed through the ingress by the REST generate extension and OpenAI's
chat completions, token for token as ``aioinfer serve`` streams them in process; a
client that goes away frees its sequence on the replica.

One application for the module, beside the session's (its own name and route prefix,
on the session's Ray instance and proxy).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import httpx
import openai
import pytest
from ray import serve

from aioinfer.ray import build_app
from aioinfer.serving import create_app
from tests.helpers import HF_DECODERS
from tests.ray.conftest import RayApp
from tests.serving.conftest import LiveServer

pytestmark = pytest.mark.anyio

MODEL = "llama_mha"
APP = "aioinfer-generation"
PREFIX = "/generation"
HELLO = [1, 311, 273, 81]
"""The prompt "Hello" as token ids (``<s>`` first)."""
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
LONG = 240
"""New tokens for a generation a client leaves (the model has 256 positions)."""


@pytest.fixture(scope="module")
def decoder_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository of one decoder: optimum's files beside version 1's ``model.onnx``,
    and a config on the CPU device, whose steps (milliseconds each) leave a generation
    of :data:`LONG` tokens running long after its first ones reach the client; one
    running sequence per replica, none waiting (and room for more requests: the
    scheduler refuses, not the model's queue)."""
    root = tmp_path_factory.mktemp("decoder-repo")
    (root / MODEL / "1").mkdir(parents=True)
    for file in (HF_DECODERS / MODEL).iterdir():
        shutil.copy(file, root / MODEL / ("1" if file.name == "model.onnx" else "") / file.name)
    limits = {"eos_token_id": [2], "max_running_sequences": 1, "max_waiting_sequences": 0}
    config = {"device": "CPU", "stateful": "auto", "generate": limits, "max_concurrency": 8}
    (root / MODEL / "config.json").write_text(json.dumps(config))
    return root


@pytest.fixture(scope="module")
def on_ray(ray_app: RayApp, decoder_repository: Path) -> Iterator[str]:
    """The repository on Ray Serve (one replica): the base URL of its routes."""
    serve.run(build_app(decoder_repository), name=APP, route_prefix=PREFIX)
    try:
        yield f"http://{ray_app.url}{PREFIX}"
    finally:
        serve.delete(APP)


@pytest.fixture(scope="module")
def in_process(decoder_repository: Path) -> Iterator[str]:
    """The same repository served by ``aioinfer serve``'s app: the base URL."""
    with LiveServer(create_app(decoder_repository)) as live:
        yield f"http://{live.url}"


async def replica_status() -> dict[str, Any]:
    """The status of the decoder's replica (Ray's sync call, off the event loop)."""
    handle = serve.get_deployment_handle(f"model:{MODEL}", app_name=APP)
    return await anyio.to_thread.run_sync(lambda: handle.status.remote().result(timeout_s=60))


async def events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON of each server-sent event of ``response`` (``[DONE]`` ends them)."""
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            if line == "data: [DONE]":
                return
            yield json.loads(line.removeprefix("data: "))


async def stream_tokens(base: str, parameters: dict[str, Any]) -> list[tuple[int, str]]:
    """(token id, text) of each event of a REST generate_stream of :data:`HELLO`."""
    body = {"input_ids": HELLO, "parameters": parameters}
    url = f"{base}/v2/models/{MODEL}/generate_stream"
    async with (
        httpx.AsyncClient(timeout=120) as client,
        client.stream("POST", url, json=body) as response,
    ):
        assert response.status_code == 200, await response.aread()
        return [(e["token_id"], e["text_output"]) async for e in events(response)]


async def test_rest_generate_stream_gives_the_tokens_of_aioinfer_serve(
    on_ray: str, in_process: str
) -> None:
    parameters = {"max_new_tokens": 12}
    expected = await stream_tokens(in_process, parameters)
    assert len(expected) == 12
    assert await stream_tokens(on_ray, parameters) == expected
    async with httpx.AsyncClient(timeout=120) as client:
        body = {"text_input": "Hello", "parameters": parameters}
        answers = [
            (await client.post(f"{base}/v2/models/{MODEL}/generate", json=body)).json()
            for base in (in_process, on_ray)
        ]
    assert answers[1] == answers[0]
    assert answers[0]["output_ids"] == [token for token, _ in expected]


async def stream_chat(base: str) -> tuple[list[str], list[str]]:
    """The models listed, and the content of each chunk of a streamed chat."""
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    try:
        models = [model.id async for model in client.models.list()]
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=12,
            temperature=0,
            stream=True,
        )
        texts = [chunk.choices[0].delta.content or "" async for chunk in stream]
    finally:
        await client.close()
    return models, texts


async def test_openai_streaming_chat_gives_the_text_of_aioinfer_serve(
    on_ray: str, in_process: str
) -> None:
    expected = await stream_chat(in_process)
    assert expected[0] == [MODEL] and "".join(expected[1])
    assert await stream_chat(on_ray) == expected


@pytest.mark.parametrize("route", ["generate_stream", "chat"])
async def test_a_client_that_goes_away_frees_its_sequence_on_the_replica(
    on_ray: str, route: str
) -> None:
    if route == "chat":
        url = f"{on_ray}/v1/chat/completions"
        body: dict[str, Any] = {
            "model": MODEL,
            "messages": MESSAGES,
            "max_tokens": LONG,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
        }
    else:
        url = f"{on_ray}/v2/models/{MODEL}/generate_stream"
        body = {"input_ids": HELLO, "parameters": {"max_new_tokens": LONG}}
    before = await replica_status()
    assert before["running_generations"] == 0
    async with (
        httpx.AsyncClient(timeout=120) as client,
        client.stream("POST", url, json=body) as response,
    ):
        assert response.status_code == 200
        received = 0
        async for _ in events(response):
            received += 1
            if received == 3:  # the control: it runs while the client reads
                running = await replica_status()
                break
    # The client closed its connection after 3 events.
    assert running["running_generations"] == 1
    with anyio.fail_after(60):
        while (status := await replica_status())["running_generations"] != 0:
            await anyio.sleep(0.05)
    generated = status["generated_tokens"] - before["generated_tokens"]
    assert 3 <= generated < LONG  # stopped, not run to its end


async def test_a_full_replica_refuses_with_a_retryable_503(on_ray: str) -> None:
    refusal = "(max_running_sequences 1, max_waiting_sequences 0); retry later"
    chat = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "stream": True}
    body = {"input_ids": HELLO, "parameters": {"max_new_tokens": LONG}}
    url = f"{on_ray}/v2/models/{MODEL}/generate_stream"
    async with (
        httpx.AsyncClient(timeout=120) as client,
        client.stream("POST", url, json=body) as running,
    ):
        lines = running.aiter_lines()
        assert (await anext(lines)).startswith("data: ")  # it holds the replica's place
        refused = await client.post(url, json={"input_ids": HELLO})
        assert refused.status_code == 503
        assert refusal in refused.json()["error"]
        openai_refused = await client.post(f"{on_ray}/v1/chat/completions", json=chat)
        assert openai_refused.status_code == 503
        assert openai_refused.headers["retry-after"] == "1"
        assert refusal in openai_refused.json()["error"]["message"]
        status = await replica_status()  # the control: the first one still runs
        assert status["running_generations"] == 1
        await lines.aclose()
    with anyio.fail_after(60):
        while (await replica_status())["running_generations"] != 0:
            await anyio.sleep(0.05)
    answer = await stream_tokens(on_ray, {"max_new_tokens": 2})  # room again
    assert len(answer) == 2
