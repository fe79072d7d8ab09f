"""Generation over gRPC (``ModelStreamInfer`` token by token, ``ModelInfer`` whole) against
a live server, with the unmodified ``tritonclient.grpc`` and ``tritonclient.grpc.aio``.

The tokens are compared with a greedy loop by hand on onnxruntime with explicit KV inputs
(``tests.helpers.reference_generation``); the steps a generation ran are counted by the
service (``ModelGeneration.steps``). The async cases run under asyncio only: grpc.aio is
asyncio's.
"""

from __future__ import annotations

import asyncio
import queue
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from aioinfer.serving.generation import ModelGeneration
from tests.helpers import (
    WORDS,
    decoder_model,
    mlp_model,
    reference_generation,
    reference_outputs,
    scrape_metric,
    wait_until,
    write_tokenizer,
)
from tests.serving.conftest import write_config, write_model
from tests.serving.grpc.live import LiveGrpcServer

ROOT = Path(__file__).resolve().parents[3]
PROMPT = [1, 2, 3]
SLOW = 1500
"""MatMul+Tanh pairs per step of the slow decoder: tens of milliseconds a step."""
RTOL, ATOL = 1e-4, 1e-5
"""Float32 logits of our CPU kernels against onnxruntime's."""


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # grpc.aio is asyncio's


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGrpcServer]:
    """decoder (with a tokenizer.json), slow_decoder (one generation at a time, none
    waiting), bare_decoder (input_ids its only input), mlp (no generate key)."""
    repo = tmp_path_factory.mktemp("grpc_generate")
    write_model(repo, "decoder", 1, decoder_model())
    write_config(repo, "decoder", {"stateful": "auto", "generate": {"max_new_tokens": 8}})
    write_tokenizer(repo / "decoder" / "tokenizer.json")
    write_model(repo, "slow_decoder", 1, decoder_model(slow=SLOW))
    write_config(
        repo,
        "slow_decoder",
        {"stateful": "auto", "generate": {}, "max_concurrency": 1, "max_queue": 0},
    )
    write_model(repo, "bare_decoder", 1, bare_decoder())
    write_config(repo, "bare_decoder", {"stateful": "auto", "generate": {}})
    write_model(repo, "mlp", 1, mlp_model())
    with LiveGrpcServer(repo) as live:
        yield live


def bare_decoder() -> Any:
    return decoder_model(attention_mask=False, position_ids=False)


def generation_of(live: LiveGrpcServer, name: str) -> ModelGeneration:
    service = live.service
    return service.generations[service.find(name, None)]


def ids(values: list[int], kind: str = "INT64", shape: list[int] | None = None) -> Any:
    array = np.array(values, np.int64 if kind == "INT64" else np.int32)
    tensor = grpcclient.InferInput("input_ids", shape or [len(values)], kind)
    tensor.set_data_from_numpy(array.reshape(shape or [len(values)]))
    return tensor


def text(value: str) -> Any:
    tensor = grpcclient.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([value.encode()], dtype=object))
    return tensor


def final(result: Any) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def finish_reason(result: Any) -> str | None:
    parameters = result.get_response().parameters
    return parameters["finish_reason"].string_param if "finish_reason" in parameters else None


class Stream:
    """tritonclient's stream (``start_stream``/``async_stream_infer``) whose callback
    puts each (result, error) in a queue."""

    def __init__(self, live: LiveGrpcServer) -> None:
        self.client = grpcclient.InferenceServerClient(live.grpc_url)
        self.answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(lambda result, error: self.answers.put((result, error)))

    def send(self, model: str, inputs: list[Any], **options: Any) -> None:
        self.client.async_stream_infer(model, inputs, **options)

    def until_final(self) -> list[Any]:
        """The results of one request, up to the final one (an error raises it)."""
        results = []
        while True:
            result, error = self.answers.get(timeout=60)
            if error is not None:
                raise error
            results.append(result)
            if final(result):
                return results

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


@pytest.fixture
def stream(server: LiveGrpcServer) -> Iterator[Stream]:
    opened = Stream(server)
    yield opened
    opened.close()


# -- ModelStreamInfer ----------------------------------------------------------------------


def test_one_response_per_token_the_last_final_with_its_finish_reason(stream: Stream):
    expected, _ = reference_generation(decoder_model(), PROMPT, 10)
    stream.send("decoder", [ids(PROMPT)], request_id="g1", parameters={"max_new_tokens": 10})
    results = stream.until_final()
    assert [r.as_numpy("token_id").tolist() for r in results] == [[t] for t in expected]
    assert [r.as_numpy("index").tolist() for r in results] == [[i] for i in range(10)]
    assert all(r.as_numpy("token_id").dtype == np.int64 for r in results)
    assert [final(r) for r in results] == [False] * 9 + [True]
    assert [finish_reason(r) for r in results] == [None] * 9 + ["length"]
    responses = [r.get_response() for r in results]
    assert {(r.model_name, r.model_version, r.id) for r in responses} == {("decoder", "1", "g1")}
    # The tokenizer's text, the words each token adds.
    words = [WORDS[t] for t in expected]
    texts = [r.as_numpy("text_output")[0].decode() for r in results]
    assert texts == [words[0], *(" " + w for w in words[1:])]
    # INT32 ids, a [1, n] prompt, the config's max_new_tokens (8) by default.
    stream.send("decoder", [ids(PROMPT, "INT32", [1, 3])])
    assert [r.as_numpy("token_id")[0] for r in stream.until_final()] == expected[:8]


def test_plain_inferences_share_the_stream_and_are_final(stream: Stream):
    expected, logits = reference_generation(decoder_model(), PROMPT, 4)
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    mlp_input = grpcclient.InferInput("x", [2, 4], "FP32")
    mlp_input.set_data_from_numpy(x)
    # The decoder given every input but its cache: an ordinary inference, its logits.
    plain = [
        ids(PROMPT, shape=[1, 3]),
        grpcclient.InferInput("attention_mask", [1, 3], "INT64"),
        grpcclient.InferInput("position_ids", [1, 3], "INT64"),
    ]
    plain[1].set_data_from_numpy(np.ones((1, 3), np.int64))
    plain[2].set_data_from_numpy(np.arange(3, dtype=np.int64)[None])
    stream.send("mlp", [mlp_input], request_id="p1")
    stream.send("decoder", [ids(PROMPT)], request_id="g", parameters={"max_new_tokens": 4})
    stream.send("decoder", plain, request_id="p2")
    stream.send("mlp", [mlp_input], request_id="p3")
    first = stream.until_final()
    assert len(first) == 1 and first[0].get_response().id == "p1"
    np.testing.assert_allclose(
        first[0].as_numpy("y"), reference_outputs(mlp_model(), {"x": x})[0], rtol=1e-5, atol=1e-6
    )
    assert [r.as_numpy("token_id")[0] for r in stream.until_final()] == expected
    (logits_result,) = stream.until_final()
    assert logits_result.get_response().id == "p2"
    np.testing.assert_allclose(logits_result.as_numpy("logits")[0, -1], logits[0], RTOL, ATOL)
    (last,) = stream.until_final()
    assert last.get_response().id == "p3"


def test_the_steps_of_a_sequence_are_inferences_of_the_same_model(server: LiveGrpcServer):
    """bare_decoder takes input_ids alone: outside a sequence they ask for a generation,
    in a sequence they are one step of the decoder (its logits, the cache kept)."""
    expected, logits = reference_generation(bare_decoder(), PROMPT, 3)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        generated = client.infer("bare_decoder", [ids(PROMPT)], parameters={"max_new_tokens": 3})
        assert generated.as_numpy("output_ids").tolist() == expected
        steps = [
            client.infer(
                "bare_decoder", [ids(PROMPT, shape=[1, 3])], sequence_id=4, sequence_start=True
            ),
            client.infer("bare_decoder", [ids(expected[:1], shape=[1, 1])], sequence_id=4),
            client.infer(
                "bare_decoder", [ids(expected[1:2], shape=[1, 1])], sequence_id=4, sequence_end=True
            ),
        ]
    finally:
        client.close()
    for step, reference in zip(steps, logits, strict=True):
        np.testing.assert_allclose(step.as_numpy("logits")[0, -1], reference, RTOL, ATOL)


@pytest.mark.anyio
async def test_stop_tokens_sampling_and_text_input_with_the_aio_client(server: LiveGrpcServer):
    expected, _ = reference_generation(decoder_model(), PROMPT, 12)
    stop = expected[4]
    sampled = {"temperature": 3.0, "seed": 5, "max_new_tokens": 12}
    requests = [
        ("stop-int", [ids(PROMPT)], {"max_new_tokens": 12, "stop": stop}),
        ("stop-json", [ids(PROMPT)], {"max_new_tokens": 12, "stop": f"[15, {stop}]"}),
        ("sampled", [ids(PROMPT)], sampled),
        ("again", [ids(PROMPT)], sampled),
        ("text", [text("the cat sat")], {"max_new_tokens": 12}),
    ]

    async def messages() -> AsyncIterator[dict[str, Any]]:
        for request_id, inputs, parameters in requests:
            yield {
                "model_name": "decoder",
                "inputs": inputs,
                "request_id": request_id,
                "parameters": parameters,
            }

    tokens: dict[str, list[int]] = {}
    reasons: dict[str, str | None] = {}
    client = aioclient.InferenceServerClient(server.grpc_url)
    try:
        async for result, error in client.stream_infer(messages()):
            assert error is None, error
            request_id = result.get_response().id
            tokens.setdefault(request_id, []).append(int(result.as_numpy("token_id")[0]))
            reasons[request_id] = finish_reason(result)
            if final(result) and request_id == "text":
                break
    finally:
        await client.close()
    stopped = expected[: expected.index(stop) + 1]
    assert tokens["stop-int"] == tokens["stop-json"] == stopped
    assert reasons["stop-int"] == reasons["stop-json"] == "stop"
    assert tokens["sampled"] == tokens["again"] != expected
    assert tokens["text"] == expected  # the tokenizer's ids of the prompt: [1, 2, 3]


def test_an_empty_final_response_when_the_client_asks_for_one(stream: Stream):
    expected, _ = reference_generation(decoder_model(), PROMPT, 3)
    stream.send(
        "decoder",
        [ids(PROMPT)],
        request_id="e",
        parameters={"max_new_tokens": 3},
        enable_empty_final_response=True,
    )
    results = stream.until_final()
    assert [final(r) for r in results] == [False] * 3 + [True]
    assert [r.as_numpy("token_id")[0] for r in results[:3]] == expected
    last = results[-1]
    assert last.get_response().outputs == [] and last.get_response().id == "e"
    assert finish_reason(last) == "length"


def rest_generate_error(live: LiveGrpcServer, model: str, body: dict[str, Any]) -> str:
    url = f"http://{live.url}/v2/models/{model}/generate_stream"
    response = httpx.post(url, json=body, timeout=60)
    assert response.status_code == 400
    return str(response.json()["error"])


@pytest.mark.parametrize(
    ("model", "inputs", "parameters", "rest_body", "message"),
    [
        ("decoder", [[16]], {}, {"input_ids": [16]}, "token id 16 is out of range"),
        ("decoder", [[]], {}, {"input_ids": []}, "non-empty sequence of token ids"),
        (
            "decoder",
            [[1]],
            {"beams": 2},
            {"input_ids": [1], "parameters": {"beams": 2}},
            "unknown generate parameter(s) 'beams'",
        ),
        (
            "decoder",
            [[1]],
            {"temperature": -1.0},
            {"input_ids": [1], "parameters": {"temperature": -1.0}},
            "temperature must be finite and at least 0, got -1",
        ),
        (
            "decoder",
            [[1]],
            {"stop": "end"},
            {"input_ids": [1], "parameters": {"stop": "end"}},
            "stop must be a token id or a list of them",
        ),
        ("slow_decoder", "the", {}, {"text_input": "the"}, "has no tokenizer.json"),
    ],
    ids=["out-of-range", "empty", "unknown-parameter", "temperature", "stop", "no-tokenizer"],
)
def test_errors_before_the_first_token_end_the_request_only(
    server: LiveGrpcServer, stream: Stream, model, inputs, parameters, rest_body, message
):
    prompt = text(inputs) if isinstance(inputs, str) else ids(inputs[0])
    stream.send(model, [prompt], request_id="bad", parameters=parameters)
    stream.send("decoder", [ids(PROMPT)], request_id="good", parameters={"max_new_tokens": 2})
    result, error = stream.answers.get(timeout=60)
    assert result is None and message in error.message()
    assert error.message() == rest_generate_error(server, model, rest_body)  # REST's words
    good = stream.until_final()
    assert [r.as_numpy("token_id")[0] for r in good] == reference_generation(
        decoder_model(), PROMPT, 2
    )[0]


def test_a_prompt_of_the_wrong_datatype_is_named(stream: Stream):
    wrong = grpcclient.InferInput("input_ids", [2], "FP32")
    wrong.set_data_from_numpy(np.array([1, 2], np.float32))
    stream.send("decoder", [wrong])
    result, error = stream.answers.get(timeout=60)
    assert result is None
    assert error.message() == (
        "input 'input_ids': datatype 'FP32' given, a generation takes INT64 or INT32"
    )


def test_an_error_after_the_first_token_is_the_requests_last_response(server: LiveGrpcServer):
    # The decoder has 64 position embeddings: a prompt of 60 tokens leaves room for the
    # first 5 tokens; the sixth step's position is 64 (a Gather out of range).
    prompt = [1 + i % 14 for i in range(60)]
    request = service_pb2.ModelInferRequest(model_name="decoder", id="late")
    request.inputs.add(name="input_ids", datatype="INT64", shape=[60])
    request.raw_input_contents.append(np.array(prompt, np.int64).tobytes())
    request.parameters["max_new_tokens"].int64_param = 10
    follow = service_pb2.ModelInferRequest(model_name="decoder", id="next")
    follow.CopyFrom(request)
    follow.id = "next"
    follow.parameters["max_new_tokens"].int64_param = 1
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        responses = list(stub.ModelStreamInfer(iter([request, follow])))
    assert [r.error_message for r in responses[:5]] == [""] * 5
    assert [r.infer_response.id for r in responses] == ["late"] * 6 + ["next"]
    error = responses[5]
    assert "Gather" in error.error_message
    assert error.infer_response.parameters["triton_final_response"].bool_param
    assert error.infer_response.model_name == "decoder" and not error.infer_response.outputs
    assert responses[6].error_message == ""  # the stream goes on


# -- ModelInfer: the whole generation -------------------------------------------------------


def test_model_infer_answers_the_whole_generation(server: LiveGrpcServer):
    expected, _ = reference_generation(decoder_model(), PROMPT, 12)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        result = client.infer(
            "decoder", [ids(PROMPT)], request_id="u", parameters={"max_new_tokens": 12}
        )
        assert result.as_numpy("output_ids").tolist() == expected
        assert result.as_numpy("text_output")[0].decode() == " ".join(WORDS[t] for t in expected)
        assert finish_reason(result) == "length" and result.get_response().id == "u"
        only = client.infer(
            "decoder",
            [text("the cat sat")],
            outputs=[grpcclient.InferRequestedOutput("output_ids")],
        )
        assert [o.name for o in only.get_response().outputs] == ["output_ids"]
        assert only.as_numpy("output_ids").tolist() == expected[:8]
        # An error is the call's status, with REST's message.
        with pytest.raises(InferenceServerException) as caught:
            client.infer("decoder", [ids([16])])
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert caught.value.message() == rest_generate_error(server, "decoder", {"input_ids": [16]})
        with pytest.raises(InferenceServerException, match="a generation has no output"):
            client.infer(
                "decoder", [ids(PROMPT)], outputs=[grpcclient.InferRequestedOutput("token")]
            )
        # Naming the model's own output: the ordinary inference (a [1, 3] prompt alone
        # misses the decoder's other inputs).
        with pytest.raises(InferenceServerException, match="missing input"):
            client.infer(
                "decoder",
                [ids(PROMPT, shape=[1, 3])],
                outputs=[grpcclient.InferRequestedOutput("logits")],
            )
    finally:
        client.close()


# -- cancellation -------------------------------------------------------------------------------


def steps_after_cancel(server: LiveGrpcServer, cancel: Any) -> int:
    """Run ``cancel()`` (starts a 60-token generation on slow_decoder and ends its call
    early); the steps it ran, once nothing runs any more."""
    generation = generation_of(server, "slow_decoder")
    before = generation.steps
    cancel()
    in_flight = "aioinfer_inference_requests_in_flight"
    wait_until(
        lambda: scrape_metric(server.url, in_flight, model="slow_decoder") == 0, 60, "the end"
    )
    ran = generation.steps - before
    time.sleep(0.2)
    assert generation.steps - before == ran  # nothing runs any more
    return ran


def slow_request() -> dict[str, Any]:
    return {
        "model_name": "slow_decoder",
        "inputs": [ids(PROMPT)],
        "parameters": {"max_new_tokens": 60},
    }


@pytest.mark.parametrize("how", ["stream-cancelled", "stream-closed", "infer-deadline"])
def test_a_cancelled_call_stops_its_generation(server: LiveGrpcServer, how: str):
    generation = generation_of(server, "slow_decoder")
    cancelled = "aioinfer_inference_failures_total"
    cancelled_before = scrape_metric(
        server.url, cancelled, model="slow_decoder", reason="cancelled"
    )
    # The control: a complete generation runs one step per token.
    client = grpcclient.InferenceServerClient(server.grpc_url)
    before = generation.steps
    request = slow_request()
    start = time.perf_counter()
    done = client.infer("slow_decoder", request["inputs"], parameters={"max_new_tokens": 3})
    three_steps = time.perf_counter() - start
    assert done.as_numpy("output_ids").size == 3 and generation.steps == before + 3

    def cancel() -> None:
        if how == "infer-deadline":
            with pytest.raises(InferenceServerException) as caught:
                # Twice the control: a loaded machine must not let the deadline pass
                # before the server has the call (then nothing is there to cancel).
                client.infer(**request, client_timeout=2 * three_steps)
            assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED"
            return

        async def stream() -> None:
            aio = aioclient.InferenceServerClient(server.grpc_url)

            async def one() -> AsyncIterator[dict[str, Any]]:
                yield request
                await asyncio.sleep(3600)  # the stream stays open until cancelled

            try:
                answers = aio.stream_infer(one())
                async for result, error in answers:
                    assert error is None
                    if result.as_numpy("index")[0] == 1:
                        break
                if how == "stream-cancelled":
                    answers.cancel()
            finally:
                await aio.close()  # closes the channel: the call ends

        asyncio.run(stream())

    ran = steps_after_cancel(server, cancel)
    # Of 60: it stopped soon after the call ended (a stream read two tokens first; the
    # deadline came after about six steps).
    assert (0 if how == "infer-deadline" else 2) <= ran < 30, ran
    wait_until(
        lambda: (
            scrape_metric(server.url, cancelled, model="slow_decoder", reason="cancelled")
            == cancelled_before + 1
        ),
        10,
        "the cancelled generation counted",
    )
    # The model serves the next generation (its request went back, usable).
    result = client.infer("slow_decoder", [ids(PROMPT)], parameters={"max_new_tokens": 2})
    assert (
        result.as_numpy("output_ids").tolist()
        == reference_generation(decoder_model(slow=SLOW), PROMPT, 2)[0]
    )
    client.close()


# -- the example ------------------------------------------------------------------------------


def test_the_grpc_generate_client_example_runs():
    done = subprocess.run(
        [sys.executable, "examples/grpc_generate_client.py"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "stream: aioinfer keeps the kv cache inside each infer request ,"
    assert lines[1] == "final: True, finish_reason: length (8 tokens)"
    assert lines[2].startswith("whole: aioinfer keeps the kv cache inside each infer request")
    assert lines[2].endswith("new token . (finish_reason: stop)")
