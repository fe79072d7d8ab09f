"""How the server's connections write responses, against a live server on loopback with
real sockets: a response with a Content-Length leaves in one TCP segment (its status
line and headers wait for its body), while the headers of a streamed response, of a
HEAD answer and of a response whose app failed half-way are not held back."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import sys
import threading
from collections.abc import Iterator
from typing import Any

import anyio.to_thread
import numpy as np
import onnx
import pytest
from starlette.types import Receive, Scope, Send

from aioinfer.serving import create_app
from aioinfer.serving.connection import ConnectionLimits
from tests.helpers import mlp_model, reference_outputs
from tests.serving.conftest import LiveServer

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="counts TCP segments with Linux's TCP_INFO"
)

PROTOCOL = ConnectionLimits().uvicorn_options()
"""The server's connection options (its HTTP protocol), as ``serve`` passes them."""


def data_segments_in(connection: socket.socket) -> int:
    """Segments carrying data that ``connection`` has received (Linux's
    ``tcpi_data_segs_in``, at byte 152 of ``struct tcp_info``)."""
    info = connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return int(struct.unpack_from("I", info, 152)[0])


@pytest.fixture(scope="module")
def mlp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    model = tmp_path_factory.mktemp("writes") / "model.onnx"
    onnx.save(mlp_model(seed=3), model)
    with LiveServer(create_app(model), **PROTOCOL) as live:
        yield live


def open_connection(live: LiveServer) -> http.client.HTTPConnection:
    connection = http.client.HTTPConnection("127.0.0.1", live.port, timeout=60)
    connection.connect()
    return connection


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_each_response_is_one_segment(mlp_server: LiveServer, binary: bool) -> None:
    connection = open_connection(mlp_server)
    assert connection.sock is not None
    rng = np.random.default_rng(0)
    try:
        connection.request("GET", "/v2/health/ready")
        assert connection.getresponse().read() == b'{"ready":true}'
        before = data_segments_in(connection.sock)
        count = 20
        for _ in range(count):
            x = rng.standard_normal((1, 4)).astype(np.float32)
            request = {
                "inputs": [
                    {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": x[0].tolist()}
                ],
                "outputs": [{"name": "y", "parameters": {"binary_data": binary}}],
            }
            connection.request("POST", "/v2/models/model/infer", body=json.dumps(request))
            response = connection.getresponse()
            body = response.read()
            assert response.status == 200, body
            expected = reference_outputs(mlp_model(seed=3), {"x": x})[0]
            if binary:
                size = int(response.getheader("Inference-Header-Content-Length"))
                y = np.frombuffer(body[size:], np.float32).reshape(1, 3)
            else:
                y = np.asarray(json.loads(body)["outputs"][0]["data"], np.float32).reshape(1, 3)
            np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
        # Two writes per response (headers, then body) would make 2 * count segments.
        assert data_segments_in(connection.sock) - before == count
    finally:
        connection.close()


class _Gate:
    """A tiny ASGI app whose responses the test steps through: ``/stream`` starts a
    chunked response and sends its body once released; ``/fixed`` answers 5 bytes
    with their Content-Length; ``/fail`` starts a response
    with a Content-Length, then raises before its body."""

    def __init__(self) -> None:
        self.release = threading.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await receive()  # startup
            await send({"type": "lifespan.startup.complete"})
            await receive()  # shutdown
            await send({"type": "lifespan.shutdown.complete"})
            return
        headers: list[Any] = [(b"content-type", b"text/plain")]
        if scope["path"] == "/fixed":
            headers.append((b"content-length", b"5"))
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"fixed"})
            return
        if scope["path"] == "/fail":
            headers.append((b"content-length", b"10"))
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            raise RuntimeError("the app failed after starting its response")
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await anyio.to_thread.run_sync(self.release.wait, 60)
        await send({"type": "http.response.body", "body": b"late"})


def read_head(connection: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            raise AssertionError(f"the connection closed after {data!r}")
        data += chunk
    return data


def test_headers_not_held_for_stream_head_or_failed_app() -> None:
    gate = _Gate()
    with LiveServer(gate, **PROTOCOL) as live:
        with socket.create_connection(("127.0.0.1", live.port), timeout=60) as connection:
            # A chunked response: its headers come before its body exists.
            connection.sendall(b"GET /stream HTTP/1.1\r\nHost: test\r\n\r\n")
            head = read_head(connection)
            assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
            assert b"late" not in head
            gate.release.set()
            rest = head.partition(b"\r\n\r\n")[2]
            while not rest.endswith(b"0\r\n\r\n"):
                rest += connection.recv(65536)
            assert rest == b"4\r\nlate\r\n0\r\n\r\n"
            # HEAD: the server writes no body, so the headers have nothing to wait for.
            connection.sendall(b"HEAD /fixed HTTP/1.1\r\nHost: test\r\n\r\n")
            head = read_head(connection)
            assert head.startswith(b"HTTP/1.1 200") and b"content-length: 5" in head
            connection.sendall(b"GET /fixed HTTP/1.1\r\nHost: test\r\n\r\n")
            head = read_head(connection)
            while not head.endswith(b"fixed"):
                head += connection.recv(65536)
            assert head.startswith(b"HTTP/1.1 200")
        with socket.create_connection(("127.0.0.1", live.port), timeout=60) as connection:
            # The app raised after its response started: the client gets what was sent
            # (the headers), then the connection closes.
            connection.sendall(b"GET /fail HTTP/1.1\r\nHost: test\r\n\r\n")
            received = b""
            while chunk := connection.recv(65536):
                received += chunk
            assert received.startswith(b"HTTP/1.1 200") and b"content-length: 10" in received
