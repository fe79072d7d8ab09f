"""The limits a public server needs, against a live server on loopback with real sockets:
a header-read timeout, caps on headers, a connection limit, a cap on open sequences, and
a full queue that answers before it reads a body."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from aioinfer import RepositoryError, ServingConfigError
from aioinfer.serving import ModelRepository, create_app
from aioinfer.serving.connection import ConnectionLimits
from tests.helpers import mlp_model, wait_until
from tests.helpers import scrape_metric as metric
from tests.serving.conftest import (
    WIDE,
    LiveServer,
    accumulator_model,
    chain_model,
    write_config,
    write_model,
)

HEADER_TIMEOUT = 1.0
LIMITS = ConnectionLimits(header_timeout=HEADER_TIMEOUT, max_header_count=20, max_header_bytes=4096)
LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n"
"""A request's start; the test adds headers and the blank line that ends them."""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """slow (one inference at a time, one waiting), accumulator (stateful, at most two
    open sequences), counter (stateful, the server's default of one sequence)."""
    repo = tmp_path_factory.mktemp("limits")
    write_model(repo, "slow", 1, chain_model(300))
    write_config(repo, "slow", {"max_concurrency": 1, "max_queue": 1})
    stateful = {"state": "state_out"}
    write_model(repo, "accumulator", 1, accumulator_model())
    write_config(repo, "accumulator", {"stateful": stateful, "max_sequences": 2})
    write_model(repo, "counter", 1, accumulator_model())
    write_config(repo, "counter", {"stateful": stateful})
    return repo


@pytest.fixture(scope="module")
def limited(repository: Path) -> Iterator[LiveServer]:
    app = create_app(repository, max_sequences=1)
    with LiveServer(app, **LIMITS.uvicorn_options()) as live:
        yield live


def connect(live: LiveServer) -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", live.port))
    connection.settimeout(60)  # reached only when the server fails to answer
    return connection


def read_response(connection: socket.socket) -> tuple[int, bytes]:
    """One response's status and body (by its Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            raise AssertionError(f"the connection closed after {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    fields = dict(line.lower().split(b": ", 1) for line in lines[1:])
    while len(body) < int(fields[b"content-length"]):
        body += connection.recv(65536)
    return int(lines[0].split()[1]), body


def status_of(live: LiveServer, path: str = "/v2/health/live") -> int:
    return httpx.get(f"http://{live.url}{path}", timeout=60).status_code


# -- the header-read timeout --------------------------------------------------------------


def test_slow_header_clients_are_cut_off_while_a_normal_client_is_served(limited):
    # Each slow client sends one byte per connection every 20 ms: 9 s or more for the
    # whole request, against a header timeout of 1 s.
    request = LIVE + b"X-Filler: " + b"a" * 400 + b"\r\n\r\n"
    slow = [connect(limited) for _ in range(10)]
    sent = [0] * len(slow)
    cut = [False] * len(slow)

    def trickle() -> None:
        for position in range(len(request)):
            for index, connection in enumerate(slow):
                if cut[index]:
                    continue
                try:
                    connection.sendall(request[position : position + 1])
                    sent[index] += 1
                except OSError:  # the server closed it
                    cut[index] = True
            if all(cut):
                return
            time.sleep(0.02)

    sender = threading.Thread(target=trickle)
    sender.start()
    try:
        assert status_of(limited) == 200  # served while the slow clients hold connections
        client = httpclient.InferenceServerClient(limited.url)
        assert client.is_server_ready()
        sender.join(120)
    finally:
        for connection in slow:
            connection.close()
    assert all(cut), sent
    assert max(sent) < len(request), "a slow client finished sending its headers"
    assert status_of(limited) == 200


def test_an_idle_connection_and_a_stalled_request_are_closed(limited):
    with connect(limited) as idle, connect(limited) as stalled:
        stalled.sendall(LIVE + b"\r\n")
        assert read_response(stalled) == (200, b'{"live":true}')
        stalled.sendall(LIVE[:20])  # a second request on the connection, then nothing
        data = b""
        while chunk := stalled.recv(65536):
            data += chunk
        assert data.startswith(b"HTTP/1.1 408 ")
        assert data.endswith(b"the request's headers did not arrive within 1 s\"}")
        assert idle.recv(65536) == b""  # closed without an answer: no request began


# -- caps on headers ----------------------------------------------------------------------


def refused(live: LiveServer, request: bytes) -> tuple[int, bytes]:
    with connect(live) as connection:
        connection.sendall(request)
        status, body = read_response(connection)
        assert connection.recv(65536) == b""  # and the connection is closed
    return status, body


def test_too_many_or_too_large_headers_get_431_and_the_server_keeps_serving(limited):
    many = LIVE + b"".join(b"X-%d: 1\r\n" % i for i in range(30)) + b"\r\n"
    status, body = refused(limited, many)
    assert status == 431
    assert body == b'{"error": "the request\'s headers exceed the limit of 20 header lines"}'
    large = LIVE + b"X-Large: " + b"a" * 5000 + b"\r\n\r\n"
    expected = b'{"error": "the request\'s headers exceed the limit of 4096 bytes"}'
    assert refused(limited, large) == (431, expected)
    # A header that does not end: refused from the bytes received, not the parsed ones.
    assert refused(limited, LIVE + b"X-Endless: " + b"a" * 8000) == (431, expected)
    # Within the limits: 15 more headers, 3 KB in all.
    fine = LIVE + b"".join(b"X-%d: %s\r\n" % (i, b"b" * 180) for i in range(15)) + b"\r\n"
    with connect(limited) as connection:
        connection.sendall(fine)
        assert read_response(connection) == (200, b'{"live":true}')
    assert status_of(limited) == 200


def test_connection_limits_are_checked() -> None:
    with pytest.raises(ServingConfigError, match="header_timeout must be above 0"):
        ConnectionLimits(header_timeout=0)
    with pytest.raises(ServingConfigError, match="max_header_count must be at least 1"):
        ConnectionLimits(max_header_count=0)
    with pytest.raises(ServingConfigError, match="limit_concurrency must be at least 1"):
        ConnectionLimits(limit_concurrency=0)


# -- the connection limit -----------------------------------------------------------------


def test_the_connection_limit_answers_503_until_a_connection_closes(tmp_path: Path):
    onnx.save(mlp_model(), tmp_path / "mlp.onnx")
    limits = ConnectionLimits(limit_concurrency=3, timeout_keep_alive=60)
    with LiveServer(create_app(tmp_path / "mlp.onnx"), **limits.uvicorn_options()) as live:
        held = [connect(live) for _ in range(2)]
        for connection in held:
            connection.sendall(LIVE + b"\r\n")
            assert read_response(connection)[0] == 200  # and the connection stays open
        # A third connection reaches the limit (uvicorn counts the new one too).
        with connect(live) as third:
            third.sendall(LIVE + b"\r\n")
            assert read_response(third) == (503, b"Service Unavailable")
            assert third.recv(65536) == b""
        held.pop().close()
        wait_until(lambda: status_of(live) == 200, 30, "a free connection")
        held[0].sendall(LIVE + b"\r\n")  # a held connection still works
        assert read_response(held[0])[0] == 200
        held[0].close()


def test_keep_alive_closes_an_idle_connection_never_a_busy_one(tmp_path: Path):
    """One keep-alive timer per connection checks how long it has been idle: a connection
    idle for the timeout is closed, one that keeps sending requests stays open over several
    timeouts (the timer re-arms for what is left of a recent response's timeout)."""
    onnx.save(mlp_model(), tmp_path / "mlp.onnx")
    limits = ConnectionLimits(timeout_keep_alive=2)
    with LiveServer(create_app(tmp_path / "mlp.onnx"), **limits.uvicorn_options()) as live:
        busy, idle = connect(live), connect(live)
        for connection in (busy, idle):
            connection.sendall(LIVE + b"\r\n")
            assert read_response(connection)[0] == 200
        started = time.monotonic()
        while time.monotonic() - started < 5:  # two and a half timeouts
            time.sleep(0.05)
            busy.sendall(LIVE + b"\r\n")
            assert read_response(busy)[0] == 200
        assert idle.recv(65536) == b""  # the server closed it
        busy.close()
        idle.close()


# -- open sequences -----------------------------------------------------------------------


def accumulate(
    client: httpclient.InferenceServerClient, model: str, sequence: int, **flags: bool
) -> list[float]:
    tensor = httpclient.InferInput("x", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
    result = client.infer(model, [tensor], sequence_id=sequence, **flags)
    return result.as_numpy("total")[0].tolist()  # type: ignore[no-any-return]


def test_max_sequences_refuses_a_new_sequence_until_one_ends(limited):
    client = httpclient.InferenceServerClient(limited.url)
    assert accumulate(client, "accumulator", 1, sequence_start=True) == [1, 1]
    assert accumulate(client, "accumulator", 2, sequence_start=True) == [1, 1]
    with pytest.raises(InferenceServerException) as caught:
        accumulate(client, "accumulator", 3, sequence_start=True)
    assert caught.value.status() == "503"
    assert "model 'accumulator' has 2 open sequences" in str(caught.value)
    assert "max_sequences 2" in str(caught.value)
    # Restarting an open sequence opens none; the open ones go on.
    assert accumulate(client, "accumulator", 1, sequence_start=True) == [1, 1]
    assert accumulate(client, "accumulator", 2) == [2, 2]
    assert accumulate(client, "accumulator", 2, sequence_end=True) == [3, 3]
    assert accumulate(client, "accumulator", 3, sequence_start=True) == [1, 1]
    assert accumulate(client, "accumulator", 1, sequence_end=True) == [2, 2]
    assert accumulate(client, "accumulator", 3, sequence_end=True) == [2, 2]
    # A model without max_sequences in its config has the server's default (one here).
    assert accumulate(client, "counter", 1, sequence_start=True) == [1, 1]
    with pytest.raises(InferenceServerException, match=r"'counter'.*max_sequences 1"):
        accumulate(client, "counter", 2, sequence_start=True)
    assert accumulate(client, "counter", 1, sequence_end=True) == [2, 2]


def test_max_sequences_in_config_json_is_checked(tmp_path: Path):
    write_model(tmp_path, "m", 1, mlp_model())
    write_config(tmp_path, "m", {"max_sequences": 0})
    with pytest.raises(RepositoryError, match="'max_sequences' is 0, too small"):
        ModelRepository(tmp_path)
    write_config(tmp_path, "m", {"max_sequences": 5})
    assert ModelRepository(tmp_path).models["m"].config.max_sequences == 5
    with pytest.raises(ServingConfigError, match="max_sequences must be at least 1, got 0"):
        create_app(tmp_path, max_sequences=0)


# -- admission before the body ------------------------------------------------------------


def test_a_full_queue_answers_503_before_reading_the_body(limited):
    rows = np.random.default_rng(0).standard_normal((1024, WIDE)).astype(np.float32)
    tensor = httpclient.InferInput("x", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    shapes: list[tuple[int, ...]] = []

    def post() -> None:  # a client of its own: gevent clients stay in one thread
        client = httpclient.InferenceServerClient(limited.url, network_timeout=120)
        shapes.append(client.infer("slow", [tensor]).as_numpy("y").shape)

    busy = metric(limited.url, "aioinfer_inference_failures_total", model="slow", reason="busy")
    threads = [threading.Thread(target=post) for _ in range(2)]  # one runs, one waits
    for thread in threads:
        thread.start()
    in_flight = "aioinfer_inference_requests_in_flight"
    wait_until(lambda: metric(limited.url, in_flight, model="slow") == 2, 60, "two in flight")
    # A 60 MB body of which the client sends the first kilobyte only.
    head = (
        b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: test\r\n"
        b"Content-Type: application/json\r\nContent-Length: 60000000\r\n\r\n"
    )
    with connect(limited) as connection:
        connection.sendall(head + b'{"inputs": [' + b" " * 1000)
        status, body = read_response(connection)
    assert status == 503 and b"at capacity" in body and b"1 waiting" in body
    for thread in threads:
        thread.join(120)
    assert shapes == [(1024, WIDE)] * 2  # both served
    after = metric(limited.url, "aioinfer_inference_failures_total", model="slow", reason="busy")
    assert after == busy + 1
    assert status_of(limited) == 200
