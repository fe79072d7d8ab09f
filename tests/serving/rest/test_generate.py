"""Generation over REST (Triton's generate extension with token ids) and in the service.

A live server on loopback serves tiny decoders (``tests.helpers.decoder_model``) with
``"stateful": "auto"`` and a ``generate`` config; the tokens are compared with a greedy
loop by hand on onnxruntime with explicit KV inputs. Disconnects are real socket closes;
the steps a generation ran are counted by the service (``ModelGeneration.steps``).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from aioinfer.errors import ErrorKind, RepositoryError, ServiceError
from aioinfer.serving import create_app
from aioinfer.serving.generation import GenerateRequest, ModelGeneration
from aioinfer.serving.repository import ModelRepository
from aioinfer.serving.service import InferenceService
from tests.helpers import (
    WORDS,
    decoder_model,
    mlp_model,
    reference_generation,
    scrape_metric,
    wait_until,
    write_tokenizer,
)
from tests.serving.conftest import LiveServer, write_config, write_model

PROMPT = [1, 2, 3]
SLOW = 1500
"""MatMul+Tanh pairs per step of the slow decoder: tens of milliseconds a step."""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """decoder (with a tokenizer.json), slow_decoder (one generation at a time, none
    waiting), mlp (no generate key)."""
    repo = tmp_path_factory.mktemp("generate")
    write_model(repo, "decoder", 1, decoder_model())
    write_config(repo, "decoder", {"stateful": "auto", "generate": {"max_new_tokens": 8}})
    write_tokenizer(repo / "decoder" / "tokenizer.json")
    write_model(repo, "slow_decoder", 1, decoder_model(slow=SLOW))
    write_config(
        repo,
        "slow_decoder",
        {"stateful": "auto", "generate": {}, "max_concurrency": 1, "max_queue": 0},
    )
    write_model(repo, "mlp", 1, mlp_model())
    return repo


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[LiveServer]:
    with LiveServer(create_app(repository)) as live:
        yield live


def generation_of(live: LiveServer, name: str) -> ModelGeneration:
    service: InferenceService = live.app.state.server  # type: ignore[attr-defined]
    return service.generations[service.find(name, None)]


def events_of(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def post(live: LiveServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"http://{live.url}/v2/models/{path}", json=body, timeout=60)


# -- generate and generate_stream --------------------------------------------------------------


def test_generate_answers_the_tokens_of_a_hand_written_greedy_loop(server: LiveServer):
    expected, _ = reference_generation(decoder_model(), PROMPT, 12)
    body = {"input_ids": PROMPT, "parameters": {"max_new_tokens": 12}}
    response = post(server, "decoder/generate", body)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "model_name": "decoder",
        "model_version": "1",
        "output_ids": expected,
        "finish_reason": "length",
        "text_output": " ".join(WORDS[t] for t in expected),
    }
    # The config's max_new_tokens by default; a version in the path.
    response = post(server, "decoder/versions/1/generate", {"input_ids": PROMPT})
    assert response.json()["output_ids"] == expected[:8]


def test_generate_stream_sends_one_event_per_token_the_last_with_the_finish_reason(
    server: LiveServer,
):
    expected, _ = reference_generation(decoder_model(), PROMPT, 10)
    body = {"input_ids": PROMPT, "parameters": {"max_new_tokens": 10}}
    url = f"http://{server.url}/v2/models/decoder/generate_stream"
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        events = events_of(response)
    assert [e["token_id"] for e in events] == expected
    assert [e["index"] for e in events] == list(range(10))
    assert all(e["model_name"] == "decoder" and e["model_version"] == "1" for e in events)
    assert [e.get("finish_reason") for e in events] == [None] * 9 + ["length"]
    words = [WORDS[t] for t in expected]
    assert [e["text_output"] for e in events] == [words[0], *(" " + w for w in words[1:])]


def test_stop_tokens_sampling_and_text_input(server: LiveServer):
    expected, _ = reference_generation(decoder_model(), PROMPT, 12)
    stop = expected[4]
    body = {"input_ids": PROMPT, "parameters": {"max_new_tokens": 12, "stop": [stop]}}
    answer = post(server, "decoder/generate", body).json()
    assert answer["output_ids"] == expected[: expected.index(stop) + 1]
    assert answer["finish_reason"] == "stop"
    sampled = {"temperature": 3.0, "seed": 5, "max_new_tokens": 12}
    first = post(server, "decoder/generate", {"input_ids": PROMPT, "parameters": sampled})
    again = post(server, "decoder/generate", {"input_ids": PROMPT, "parameters": sampled})
    assert first.json()["output_ids"] == again.json()["output_ids"] != expected
    # Text in (the tokenizer gives the prompt's ids), text out.
    body = {"text_input": "the cat sat", "parameters": {"max_new_tokens": 12}}
    answer = post(server, "decoder/generate", body).json()
    assert answer["output_ids"] == expected
    assert answer["text_output"] == " ".join(WORDS[t] for t in expected)


def test_an_error_after_the_first_token_is_an_event_that_ends_the_stream(server: LiveServer):
    # The decoder has 64 position embeddings: a prompt of 60 tokens leaves room for the
    # first 5 tokens (positions 59 to 63 feed them); the sixth step's position is 64.
    prompt = [1 + i % 14 for i in range(60)]
    body = {"input_ids": prompt, "parameters": {"max_new_tokens": 10}}
    url = f"http://{server.url}/v2/models/decoder/generate_stream"
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        assert response.status_code == 200
        events = events_of(response)
    assert [e.get("index") for e in events] == [0, 1, 2, 3, 4, None]
    assert "Gather" in events[-1]["error"] and set(events[-1]) == {"error"}
    # Without streaming, the same error is the answer.
    response = post(server, "decoder/generate", body)
    assert response.status_code == 400 and "Gather" in response.json()["error"]


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("decoder/generate_stream", {"input_ids": ["a"]}, 400, "'input_ids' must be a list of"),
        ("decoder/generate_stream", {"input_ids": []}, 400, "non-empty sequence of token ids"),
        ("decoder/generate_stream", {"input_ids": [16]}, 400, "token id 16 is out of range"),
        ("decoder/generate_stream", {}, 400, "either 'input_ids' or 'text_input'"),
        ("decoder/generate", {"input_ids": [1], "inputs": []}, 400, "unknown key(s) 'inputs'"),
        (
            "decoder/generate",
            {"input_ids": [1], "parameters": {"beams": 2}},
            400,
            "unknown generate parameter(s) 'beams'; known: max_new_tokens",
        ),
        (
            "decoder/generate_stream",
            {"input_ids": [1], "parameters": {"temperature": -1}},
            400,
            "temperature must be finite and at least 0, got -1",
        ),
        ("mlp/generate_stream", {"input_ids": [1]}, 400, "model 'mlp' does not generate"),
        ("slow_decoder/generate", {"text_input": "the"}, 400, "has no tokenizer.json"),
        ("nothing/generate_stream", {"input_ids": [1]}, 404, "unknown model: 'nothing'"),
        (
            "decoder/versions/7/generate",
            {"input_ids": [1]},
            404,
            "'decoder' version 7 is not found",
        ),
    ],
)
def test_errors_before_the_first_token_are_json_with_a_status(
    server: LiveServer, path: str, body: dict[str, Any], status: int, message: str
):
    response = post(server, path, body)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert message in response.json()["error"]


def test_a_body_that_is_not_json(server: LiveServer):
    url = f"http://{server.url}/v2/models/decoder/generate"
    response = httpx.post(url, content=b"{no", timeout=60)
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]


def test_the_server_lists_the_generate_extension(server: LiveServer):
    assert "generate" in httpx.get(f"http://{server.url}/v2").json()["extensions"]


# -- disconnects and capacity ------------------------------------------------------------------


def open_generation(live: LiveServer, path: str, max_new_tokens: int) -> socket.socket:
    body = json.dumps({"input_ids": PROMPT, "parameters": {"max_new_tokens": max_new_tokens}})
    head = (
        f"POST /v2/models/{path} HTTP/1.1\r\nHost: {live.url}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    connection = socket.create_connection(("127.0.0.1", live.port))
    connection.sendall(head.encode() + body.encode())
    return connection


def read_events(connection: socket.socket, count: int) -> bytes:
    received = b""
    connection.settimeout(60)
    while received.count(b"data: ") < count:
        chunk = connection.recv(65536)
        assert chunk, received
        received += chunk
    return received


@pytest.mark.parametrize("path", ["slow_decoder/generate_stream", "slow_decoder/generate"])
def test_a_client_that_disconnects_stops_its_generation(server: LiveServer, path: str):
    generation = generation_of(server, "slow_decoder")
    in_flight = "aioinfer_inference_requests_in_flight"
    cancelled = "aioinfer_inference_failures_total"
    cancelled_before = scrape_metric(
        server.url, cancelled, model="slow_decoder", reason="cancelled"
    )
    # The control: a complete generation runs one step per token.
    before = generation.steps
    response = post(
        server, "slow_decoder/generate", {"input_ids": PROMPT, "parameters": {"max_new_tokens": 3}}
    )
    assert response.status_code == 200 and generation.steps == before + 3
    before = generation.steps
    with open_generation(server, path, 60) as connection:
        if path.endswith("stream"):
            read_events(connection, 2)
        else:
            wait_until(lambda: generation.steps >= before + 2, 60, "two steps")
    wait_until(
        lambda: scrape_metric(server.url, in_flight, model="slow_decoder") == 0, 60, "the end"
    )
    ran = generation.steps - before
    time.sleep(0.2)
    assert generation.steps - before == ran  # nothing runs any more
    assert 2 <= ran < 30, ran  # of 60: it stopped soon after the client went
    after = scrape_metric(server.url, cancelled, model="slow_decoder", reason="cancelled")
    assert after == cancelled_before + 1
    # The model serves the next generation (its request went back, usable).
    response = post(
        server, "slow_decoder/generate", {"input_ids": PROMPT, "parameters": {"max_new_tokens": 2}}
    )
    assert (
        response.json()["output_ids"]
        == reference_generation(decoder_model(slow=SLOW), PROMPT, 2)[0]
    )


def test_generations_take_the_models_slots(server: LiveServer):
    # slow_decoder: one generation at a time, none waiting. A second one is refused while
    # the first runs, before its first token.
    with open_generation(server, "slow_decoder/generate_stream", 60) as connection:
        read_events(connection, 1)
        response = post(server, "slow_decoder/generate_stream", {"input_ids": PROMPT})
        assert response.status_code == 503 and "at capacity" in response.json()["error"]
    in_flight = "aioinfer_inference_requests_in_flight"
    wait_until(lambda: scrape_metric(server.url, in_flight, model="slow_decoder") == 0, 60, "end")
    response = post(
        server, "slow_decoder/generate", {"input_ids": PROMPT, "parameters": {"max_new_tokens": 1}}
    )
    assert response.status_code == 200


# -- the service, without a transport ----------------------------------------------------------


@pytest.mark.anyio
async def test_the_service_generates_and_counts_a_closed_generation_as_cancelled(
    repository: Path,
):
    service = InferenceService(ModelRepository(repository))
    expected, _ = reference_generation(decoder_model(), PROMPT, 8)
    async with service.lifespan():
        model = service.find("decoder", None)
        metrics = service.metrics.of(model)
        tokens = [t async for t in service.generate("decoder", None, GenerateRequest(PROMPT))]
        assert [t.token_id for t in tokens] == expected
        assert tokens[-1].finish_reason == "length" and tokens[-1].text == " " + WORDS[expected[-1]]
        assert metrics.requests == 1 and metrics.failures == {}
        stream = service.generate("decoder", None, GenerateRequest(PROMPT))
        assert (await anext(stream)).token_id == expected[0]
        assert metrics.in_flight == 1
        await stream.aclose()
        assert metrics.in_flight == 0 and metrics.failures == {"cancelled": 1}
        with pytest.raises(ServiceError) as raised:
            await anext(service.generate("decoder", None, GenerateRequest([99])))
        assert raised.value.kind is ErrorKind.INVALID_ARGUMENT
        assert metrics.failures == {"cancelled": 1, "bad_request": 1}


# -- config validation -----------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"stateful": "auto", "generate": {"input_ids": "tokens"}},
            "model 'bad' version 1: config 'generate': generate 'input_ids' names 'tokens', not "
            "an input of the model; its inputs: 'input_ids', 'attention_mask', 'position_ids'",
        ),
        (
            {"stateful": "auto", "generate": {"logits": "scores"}},
            "generate 'logits' names 'scores', not an output of the model; its outputs: 'logits'",
        ),
        ({"generate": {}}, "the input(s) 'past_key', 'past_value': compile it with STATEFUL"),
    ],
)
async def test_a_generate_config_that_does_not_fit_the_model_fails_the_load(
    tmp_path: Path, config: dict[str, Any], message: str
):
    write_model(tmp_path, "bad", 1, decoder_model())
    write_config(tmp_path, "bad", config)
    service = InferenceService(ModelRepository(tmp_path))
    with pytest.raises(RepositoryError) as raised:
        await service.load()
    assert message in str(raised.value)
    for model in service.served_models():
        await model.close()


@pytest.mark.parametrize(
    ("generate", "message"),
    [
        ({"eos_token_id": "0"}, "'eos_token_id' must be a token id or a list of them"),
        ({"max_new_tokens": 0}, "'max_new_tokens' must be an integer at least 1, got 0"),
        ({"inputs": "x"}, "unknown generate key 'inputs'"),
        ([], "'generate' must be dict"),
    ],
)
def test_a_malformed_generate_key_fails_reading_the_repository(
    tmp_path: Path, generate: Any, message: str
):
    write_model(tmp_path, "bad", 1, decoder_model())
    write_config(tmp_path, "bad", {"stateful": "auto", "generate": generate})
    with pytest.raises(RepositoryError, match=r"config\.json: ") as raised:
        ModelRepository(tmp_path)
    assert message in str(raised.value)


@pytest.mark.anyio
async def test_a_generation_beyond_the_models_concurrency_waits_for_a_slot(tmp_path: Path):
    write_model(tmp_path, "decoder", 1, decoder_model())
    write_config(
        tmp_path,
        "decoder",
        {"stateful": "auto", "generate": {}, "max_concurrency": 1, "max_queue": 1},
    )
    service = InferenceService(ModelRepository(tmp_path))
    first_prompt, second_prompt = [1, 2, 3], [4, 5]
    async with service.lifespan():
        metrics = service.metrics.of(service.find("decoder", None))
        first = service.generate(
            "decoder", None, GenerateRequest(first_prompt, None, {"max_new_tokens": 6})
        )
        second = service.generate(
            "decoder", None, GenerateRequest(second_prompt, None, {"max_new_tokens": 6})
        )
        got_first = [(await anext(first)).token_id]
        got_second: list[int] = []

        async def wait_for_the_slot() -> None:
            got_second.extend([t.token_id async for t in second])

        async with anyio.create_task_group() as group:
            group.start_soon(wait_for_the_slot)
            await anyio.sleep(0.05)
            assert got_second == [] and metrics.in_flight == 2  # queued
            got_first += [t.token_id async for t in first]  # then hands its slot on
        assert metrics.in_flight == 0 and metrics.failures == {}
    assert got_first == reference_generation(decoder_model(), first_prompt, 6)[0]
    assert got_second == reference_generation(decoder_model(), second_prompt, 6)[0]
