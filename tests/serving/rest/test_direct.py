"""Infer requests answered by their connection (``serving/rest/uvicorn_http.py``), against live
servers on loopback with real sockets and tritonclient: the app's ASGI entry is not
called for them, and every answer (values, errors, limits, compression, the API key,
pipelining, ``Connection: close``, a body in parts) is the app's own, compared with a
server that runs every request through the app (uvicorn's own protocol)."""

from __future__ import annotations

import gzip
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient

from aioinfer.serving import create_app
from aioinfer.serving.rest import RestAdapter
from tests.helpers import mlp_model, reference_outputs
from tests.helpers import scrape_metric as metric
from tests.serving.conftest import LiveServer
from tests.serving.test_behaviour import binary_body, json_body

KEY = "direct-key"
LIMIT = 4096
"""The servers' ``max_request_bytes``."""


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("direct") / "mlp.onnx"
    onnx.save(mlp_model(seed=5), path)
    return path


@pytest.fixture(scope="module")
def direct(model_file: Path) -> Iterator[LiveServer]:
    """The connections of ``serve``: infer requests answered by the connection."""
    with LiveServer(create_app(model_file, max_request_bytes=LIMIT)) as live:
        yield live


@pytest.fixture(scope="module")
def routed(model_file: Path) -> Iterator[LiveServer]:
    """uvicorn's own httptools protocol: every request goes through the app."""
    with LiveServer(create_app(model_file, max_request_bytes=LIMIT), http="httptools") as live:
        yield live


@pytest.fixture
def app_infer_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the infer requests the app's ASGI entry answered."""
    calls: list[str] = []
    through_app = RestAdapter.infer

    async def infer(self: RestAdapter, scope, receive, send, name, version) -> None:  # type: ignore[no-untyped-def]
        calls.append(scope["path"])
        await through_app(self, scope, receive, send, name, version)

    monkeypatch.setattr(RestAdapter, "infer", infer)
    return calls


def rows(count: int) -> np.ndarray:
    return np.random.default_rng(count).standard_normal((count, 4)).astype(np.float32)


def exchange(
    live: LiveServer, raw: bytes, responses: int = 1
) -> list[tuple[int, dict[str, str], bytes]]:
    """Send ``raw`` on one connection; read ``responses`` answers (status, lower-case
    headers, body), in order."""
    answers = []
    with socket.create_connection(("127.0.0.1", live.port)) as connection:
        connection.settimeout(60)  # reached only when the server fails to answer
        connection.sendall(raw)
        data = b""
        for _ in range(responses):
            while b"\r\n\r\n" not in data:
                data += receive(connection)
            head, _, data = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            fields = {}
            for line in lines[1:]:
                name, _, value = line.partition(": ")
                fields[name.lower()] = value
            size = int(fields["content-length"])
            while len(data) < size:
                data += receive(connection)
            answers.append((int(lines[0].split()[1]), fields, data[:size]))
            data = data[size:]
    return answers


def receive(connection: socket.socket) -> bytes:
    chunk = connection.recv(65536)
    if not chunk:
        raise AssertionError("the server closed the connection")
    return chunk


def post(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: test", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def infer_path(model: str = "mlp") -> str:
    return f"/v2/models/{model}/infer"


def test_infer_requests_are_answered_by_the_connection(direct, model_file, app_infer_calls):
    x = rows(3)
    client = httpclient.InferenceServerClient(direct.url)
    try:
        inputs = [httpclient.InferInput("x", list(x.shape), "FP32")]
        for binary in (True, False):
            inputs[0].set_data_from_numpy(x, binary_data=binary)
            wanted = [httpclient.InferRequestedOutput("y", binary_data=binary)]
            result = client.infer("mlp", inputs, outputs=wanted)
            expected = reference_outputs(onnx.load(model_file), {"x": x})[0]  # y
            np.testing.assert_allclose(result.as_numpy("y"), expected, rtol=1e-5, atol=1e-6)
        assert client.get_model_metadata("mlp")["name"] == "mlp"  # through the app
    finally:
        client.close()
    assert app_infer_calls == []
    assert metric(direct.url, "aioinfer_inference_requests_total", model="mlp") >= 2


def test_the_app_answers_infer_requests_on_uvicorns_own_protocol(routed, app_infer_calls):
    body, headers = binary_body({"x": rows(1)})
    ((status, _, _),) = exchange(routed, post(infer_path(), body, headers))
    assert status == 200
    assert app_infer_calls == [infer_path()]


def cases() -> list[tuple[str, bytes]]:
    """(what, raw request): answers and errors of the infer endpoint."""
    binary, binary_headers = binary_body({"x": rows(2)})
    as_json = {"Content-Type": "application/json"}

    def encoded(body: object) -> bytes:
        return json.dumps(body).encode()

    compressed = gzip.compress(encoded(json_body(rows(2))))
    return [
        ("binary", post(infer_path(), binary, binary_headers)),
        ("json", post(infer_path(), encoded(json_body(rows(2), id="7")), as_json)),
        ("version", post("/v2/models/mlp/versions/1/infer", encoded(json_body(rows(1))))),
        ("unknown model", post(infer_path("nothing"), encoded(json_body(rows(1))))),
        ("unknown version", post("/v2/models/mlp/versions/9/infer", b"{}")),
        ("bad shape", post(infer_path(), encoded(json_body(np.ones((1, 5), np.float32))))),
        ("not json", post(infer_path(), b"{nope")),
        ("declared too large", post(infer_path(), encoded(json_body(rows(200))))),
        ("compressed", post(infer_path(), compressed, {"Content-Encoding": "gzip"})),
        ("bad coding", post(infer_path(), b"xx", {"Content-Encoding": "br-not"})),
        (
            "compressed answer",
            post(infer_path(), encoded(json_body(rows(20))), {"Accept-Encoding": "gzip"}),
        ),
    ]


CASES = cases()


@pytest.mark.parametrize(("what", "raw"), CASES, ids=[what for what, _ in CASES])
def test_answers_and_errors_are_the_apps(direct, routed, what: str, raw: bytes):
    ((status, fields, body),) = exchange(direct, raw)
    ((expected_status, expected_fields, expected_body),) = exchange(routed, raw)
    assert status == expected_status, body
    assert body == expected_body
    kept = ("content-type", "content-encoding", "inference-header-content-length", "vary")
    assert {k: fields.get(k) for k in kept} == {k: expected_fields.get(k) for k in kept}
    assert "date" in fields and fields["server"] == expected_fields["server"]


def test_pipelined_requests_are_answered_in_order(direct, app_infer_calls):
    first, second = rows(1), rows(2)
    raw = (
        post(infer_path(), json.dumps(json_body(first)).encode())
        + b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n\r\n"
        + post(infer_path(), json.dumps(json_body(second)).encode())
    )
    answers = exchange(direct, raw, responses=3)
    assert [status for status, _, _ in answers] == [200, 200, 200]
    shapes = [json.loads(answers[i][2])["outputs"][0]["shape"] for i in (0, 2)]
    assert shapes == [[1, 3], [2, 3]]
    assert json.loads(answers[1][2]) == {"live": True}
    assert app_infer_calls == []


def test_connection_close_is_honoured(direct):
    raw = post(infer_path(), json.dumps(json_body(rows(1))).encode(), {"Connection": "close"})
    with socket.create_connection(("127.0.0.1", direct.port)) as connection:
        connection.settimeout(60)
        connection.sendall(raw)
        data = b""
        while chunk := connection.recv(65536):  # until the server closes
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"\r\nconnection: close" in head
    assert json.loads(body)["outputs"][0]["shape"] == [1, 3]


def test_a_body_in_parts_is_read_and_a_chunked_one_limited(direct, app_infer_calls):
    body = json.dumps(json_body(rows(4))).encode()
    raw = post(infer_path(), body)
    with socket.create_connection(("127.0.0.1", direct.port)) as connection:
        connection.settimeout(60)
        split = len(raw) - len(body) // 2
        connection.sendall(raw[:split])
        time.sleep(0.2)  # the first part is read on its own
        connection.sendall(raw[split:])
        reply = connection.recv(65536)
        while b"\r\n\r\n" not in reply:
            reply += receive(connection)
    assert reply.startswith(b"HTTP/1.1 200")
    # No Content-Length: the limit is found as the chunks arrive.
    chunk = b"x" * 1000
    chunked = (
        f"POST {infer_path()} HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        + (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 5
        + b"0\r\n\r\n"
    )
    ((status, _, answer),) = exchange(direct, chunked)
    assert status == 413 and f"limit of {LIMIT} bytes" in json.loads(answer)["error"]
    assert app_infer_calls == []


def test_the_api_key_is_checked_before_the_connection_answers(model_file, app_infer_calls):
    body = json.dumps(json_body(rows(1))).encode()
    with LiveServer(create_app(model_file, api_key=KEY)) as live:
        ((status, fields, answer),) = exchange(live, post(infer_path(), body))
        assert status == 401 and fields["www-authenticate"].startswith("Bearer")
        assert "API key" in json.loads(answer)["error"]
        bearer = {"Authorization": f"Bearer {KEY}"}
        ((status, _, answer),) = exchange(live, post(infer_path(), body, bearer))
        assert status == 200 and json.loads(answer)["outputs"][0]["shape"] == [1, 3]
    assert app_infer_calls == []


def test_expect_100_continue_goes_through_the_app(direct, app_infer_calls):
    body = json.dumps(json_body(rows(1))).encode()
    head = post(infer_path(), b"", {"Expect": "100-continue"})
    head = head.replace(b"Content-Length: 0", f"Content-Length: {len(body)}".encode())
    with socket.create_connection(("127.0.0.1", direct.port)) as connection:
        connection.settimeout(60)
        connection.sendall(head)
        interim = receive(connection)
        assert interim.startswith(b"HTTP/1.1 100 Continue")
        connection.sendall(body)
        reply = b""
        while b'"outputs"' not in reply:
            reply += receive(connection)
    assert b"HTTP/1.1 200" in reply
    assert app_infer_calls == [infer_path()]
