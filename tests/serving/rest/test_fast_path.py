"""The serving hot path: infer requests skip Starlette's middleware and router (unless
the user added middleware), mounted or not; the metrics built at scrape time; the
disconnect watch that starts late under asyncio; the switch interval ``serve`` sets.

The apps run in-process (their lifespan entered by hand, httpx's ASGI transport, or ASGI
calls driven by hand to control ``receive``), on asyncio and on trio.
"""

from __future__ import annotations

import gc
import json
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
import numpy as np
import onnx
import pytest
import sniffio
import uvicorn
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.routing import Match, Mount, Route, get_route_path
from starlette.types import ASGIApp, Receive, Scope, Send

from aioinfer.cli import main
from aioinfer.serving import ModelServer, create_app, serve
from aioinfer.serving.metrics import LATENCY_BUCKETS, Histogram
from aioinfer.serving.rest import app as rest_module
from aioinfer.serving.rest import disconnect as disconnect_module
from aioinfer.serving.rest.app import infer_target
from aioinfer.serving.server import GC_THRESHOLD, SWITCH_INTERVAL
from tests.helpers import mlp_model, reference_outputs, two_input_model
from tests.serving.conftest import WIDE
from tests.serving.test_behaviour import binary_body, json_body

pytestmark = pytest.mark.anyio

T = TypeVar("T")

SLOW_ROWS = 1024


class NoopMiddleware:
    """Pure ASGI middleware that only records the paths it saw."""

    def __init__(self, app: ASGIApp, seen: list[str]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append(f"{scope['method']} {scope['path']}")
        await self.app(scope, receive, send)


class StackSpy:
    """Stands in for a Starlette app's middleware stack (its middleware, then its router)
    and records the paths that reach it."""

    def __init__(self, stack: ASGIApp) -> None:
        self.stack = stack
        self.seen: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append(f"{scope['method']} {scope['path']}")
        await self.stack(scope, receive, send)


def spy_on_stack(app: Starlette, monkeypatch: pytest.MonkeyPatch) -> StackSpy:
    spy = StackSpy(app.middleware_stack or app.build_middleware_stack())
    monkeypatch.setattr(app, "middleware_stack", spy)
    return spy


@pytest.fixture(scope="module")
def middleware_seen() -> list[str]:
    return []


# The module-scoped async fixtures take ``anyio_backend``: otherwise pytest keeps the
# first backend's instance, and anyio runs the "trio" tests on its asyncio runner.


@pytest.fixture(scope="module")
async def app(repository: Path, anyio_backend: str) -> AsyncIterator[Starlette]:
    """The protocol app as ``create_app`` returns it, its lifespan entered."""
    served = create_app(repository)
    async with served.router.lifespan_context(served):
        yield served


@pytest.fixture(scope="module")
async def wrapped(
    repository: Path, middleware_seen: list[str], anyio_backend: str
) -> AsyncIterator[Starlette]:
    """The same app with a no-op middleware added: everything goes through Starlette."""
    served = create_app(repository)
    served.add_middleware(NoopMiddleware, seen=middleware_seen)
    async with served.router.lifespan_context(served):
        yield served


def client(app: ASGIApp, base: str = "http://oip") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base, timeout=60)


async def call(
    app: ASGIApp,
    path: str,
    body: bytes,
    headers: Sequence[tuple[str, str]] = (),
    *,
    root_path: str = "",
    gone: anyio.Event | None = None,
    receives: list[str] | None = None,
) -> tuple[int, bytes]:
    """POST ``body`` to ``path`` by hand; return the status and the response body.

    After the body, ``receive()`` blocks until ``gone`` is set (forever when None), then
    reports a disconnect. ``receives`` logs ``"receive"`` per call after the body and
    ``"stopped"`` when such a call was cancelled (the server stopped watching)."""
    log = [] if receives is None else receives
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        log.append("receive")
        try:
            if gone is None:
                await anyio.sleep_forever()
            else:
                await gone.wait()
        except anyio.get_cancelled_exc_class():
            log.append("stopped")
            raise
        return {"type": "http.disconnect"}

    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": root_path,
        "query_string": b"",
        "headers": [
            (b"content-length", str(len(body)).encode()),
            *[(k.lower().encode(), v.encode()) for k, v in headers],
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }
    await app(scope, receive, send)  # type: ignore[arg-type]
    assert messages[0]["type"] == "http.response.start"
    return messages[0]["status"], b"".join(m.get("body", b"") for m in messages[1:])


def samples(app: Starlette) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the app's metrics, by (name, sorted labels)."""
    text = app.state.server.metrics.render().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


def sample(app: Starlette, name: str, **labels: str) -> float:
    return samples(app).get((name, tuple(sorted(labels.items()))), 0.0)


def slow_input() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((SLOW_ROWS, WIDE)).astype(np.float32)


# -- the fast path and the routed path ----------------------------------------------------


async def test_infer_requests_skip_starlettes_stack_and_the_rest_do_not(
    app, monkeypatch, anyio_backend
):
    assert sniffio.current_async_library() == anyio_backend  # see the fixtures above
    spy = spy_on_stack(app, monkeypatch)
    x = np.ones((1, 4), np.float32)
    async with client(app) as http:
        for path in ("/v2/models/mlp/infer", "/v2/models/mlp/versions/1/infer"):
            response = await http.post(path, json=json_body(x))
            assert response.status_code == 200, response.text
        assert (await http.post("/v2/models/nothing/infer", json=json_body(x))).status_code == 404
        assert spy.seen == []
        assert (await http.get("/v2/models/mlp")).status_code == 200
        assert (await http.get("/v2/models/mlp/infer")).status_code == 405
    assert spy.seen == ["GET /v2/models/mlp", "GET /v2/models/mlp/infer"]


def requests_to_compare() -> list[tuple[str, bytes, dict[str, str]]]:
    """(path, body, headers): answers, and failures of each kind."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    binary, binary_headers = binary_body(
        {"x": x}, id="b-1", parameters={"binary_data_output": True}
    )
    plain = {
        "inputs": [
            {"name": n, "shape": [1, 3], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}
            for n in ("a", "b")
        ]
    }
    scale = {"name": "scale", "shape": [3], "datatype": "INT64", "data": [1, 2, 3]}
    as_json = {"Content-Type": "application/json"}

    def encoded(body: dict[str, Any]) -> bytes:
        return json.dumps(body).encode()

    return [
        ("/v2/models/mlp/infer", encoded(json_body(x, id="latest")), as_json),
        ("/v2/models/mlp/versions/1/infer", encoded(json_body(x)), as_json),
        ("/v2/models/mlp/versions/2/infer", binary, binary_headers),
        (
            "/v2/models/plain/infer",
            encoded({"inputs": [*plain["inputs"], scale], "outputs": [{"name": "out"}]}),
            as_json,
        ),
        ("/v2/models/nothing/infer", encoded(json_body(x)), as_json),
        ("/v2/models/mlp/versions/9/infer", encoded(json_body(x)), as_json),
        ("/v2/models/mlp/infer", encoded(json_body(np.ones((1, 5), np.float32))), as_json),
        ("/v2/models/plain/infer", encoded(plain), as_json),
        ("/v2/models/mlp/infer", encoded(json_body(x, outputs=[{"name": "w"}])), as_json),
        ("/v2/models/mlp/infer", b"{not json", as_json),
    ]


async def test_the_fast_path_answers_as_the_routed_path(app, wrapped, middleware_seen, monkeypatch):
    spy = spy_on_stack(app, monkeypatch)
    statuses = []
    async with client(app) as fast, client(wrapped) as routed:
        for path, body, headers in requests_to_compare():
            one = await fast.post(path, content=body, headers=headers)
            other = await routed.post(path, content=body, headers=headers)
            assert one.status_code == other.status_code, (path, one.text, other.text)
            assert one.headers.items() == other.headers.items(), path
            assert one.content == other.content, path
            statuses.append(one.status_code)
            # The routed request went through the user's middleware.
            assert middleware_seen[-1] == f"POST {path}"
        first = await fast.post("/v2/models/mlp/infer", json=json_body(np.eye(4, dtype=np.float32)))
    assert statuses == [200, 200, 200, 200, 404, 404, 400, 400, 400, 400]
    assert spy.seen == []  # the fast app answered every one of them on its fast path
    # And the answers are right: the latest version (2) against onnxruntime.
    answer = first.json()
    assert answer["model_version"] == "2"
    y = np.asarray(answer["outputs"][0]["data"], np.float32).reshape(4, 3)
    expected = reference_outputs(mlp_model(seed=1), {"x": np.eye(4, dtype=np.float32)})[0]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("outer", ["fastapi", "starlette"])
async def test_mounted_under_a_prefix_with_the_lifespan_run_there(
    repository: Path, outer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    oip = create_app(repository)
    if outer == "fastapi":
        parent: Starlette = FastAPI(lifespan=oip.router.lifespan_context)
        parent.mount("/oip", oip)
    else:
        parent = Starlette(routes=[Mount("/oip", app=oip)], lifespan=oip.router.lifespan_context)
    spy = spy_on_stack(oip, monkeypatch)
    x = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    async with parent.router.lifespan_context(parent), client(parent) as http:
        response = await http.post("/oip/v2/models/mlp/versions/1/infer", json=json_body(x))
        assert response.status_code == 200, response.text
        y = np.asarray(response.json()["outputs"][0]["data"], np.float32).reshape(3, 3)
        expected = reference_outputs(mlp_model(seed=0), {"x": x})[0]
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
        assert spy.seen == []  # the mounted app took its fast path
        metadata = await http.get("/oip/v2/models/mlp")
        assert metadata.status_code == 200 and metadata.json()["versions"] == ["1", "2"]
        assert spy.seen == ["GET /oip/v2/models/mlp"]
        # Unprefixed, the parent has no such route.
        missing = await http.post("/v2/models/mlp/infer", json=json_body(x))
        assert missing.status_code == 404
    assert oip.state.server.models == {}  # the parent's lifespan closed the models


async def test_a_root_path_from_the_server_is_honoured(app, monkeypatch):
    spy = spy_on_stack(app, monkeypatch)
    x = np.ones((1, 4), np.float32)
    body = json.dumps(json_body(x)).encode()
    # ASGI: ``path`` includes the ``root_path`` (uvicorn --root-path, a Mount).
    status, content = await call(app, "/api/v2/models/mlp/infer", body, root_path="/api")
    assert status == 200 and json.loads(content)["model_name"] == "mlp"
    # A path that only starts with the same letters is not below the root path.
    status, _ = await call(app, "/apix/v2/models/mlp/infer", body, root_path="/api")
    assert status == 404
    assert spy.seen == ["POST /apix/v2/models/mlp/infer"]


@pytest.mark.parametrize(
    ("path", "root"),
    [
        ("/v2/models/m/infer", ""),
        ("/oip/v2/models/m/infer", "/oip"),
        ("/oip/v2/models/m/infer", "/oi"),
        ("/a/b/v2/models/m/infer", "/a/b"),
        ("/v2/models/m/infer", "/oip"),
    ],
)
def test_route_path_agrees_with_starlette(path: str, root: str) -> None:
    scope = {"type": "http", "path": path, "root_path": root}
    assert rest_module._route_path(scope) == get_route_path(scope)


INFER_PATHS = [
    ("/v2/models/m/infer", ("m", None)),
    ("/v2/models/m/versions/7/infer", ("m", "7")),
    ("/v2/models/versions/infer", ("versions", None)),
    ("/v2/models/m/versions/versions/infer", ("m", "versions")),
    ("/v2/models//infer", None),
    ("/v2/models/infer", None),
    ("/v2/models/m/versions//infer", None),
    ("/v2/models//versions/1/infer", None),
    ("/v2/models/m/versions/infer", None),
    ("/v2/models/m/versions/1/2/infer", None),
    ("/v2/models/m/v/1/infer", None),
    ("/v2/models/a/b/infer", None),
    ("/v2/models/m/infer/", None),
    ("/v2/models/m/infer/x", None),
    ("/v2/models/m/inference", None),
    ("/v2/models/m/ready", None),
    ("/v2/models/m", None),
    ("/v2/model/m/infer", None),
    ("/x/v2/models/m/infer", None),
    ("v2/models/m/infer", None),
]


@pytest.mark.parametrize(("path", "expected"), INFER_PATHS)
def test_infer_target_parses_as_the_router_matches(
    repository: Path, path: str, expected: tuple[str, str | None] | None
) -> None:
    assert infer_target(path) == expected
    matched = None
    for route in create_app(repository).routes[:2]:  # the two infer routes
        assert isinstance(route, Route) and route.path.endswith("/infer")
        match, child = route.matches({"type": "http", "path": path, "method": "POST"})
        if match is Match.FULL:
            params = child["path_params"]
            matched = (params["model"], params.get("version"))
    assert matched == expected


async def test_other_methods_and_malformed_infer_paths_go_through_the_router(app, monkeypatch):
    spy = spy_on_stack(app, monkeypatch)
    async with client(app) as http:
        response = await http.get("/v2/models/mlp/infer")
        assert response.status_code == 405 and response.headers["allow"] == "POST"
        assert response.json() == {"error": "Method Not Allowed: /v2/models/mlp/infer"}
        assert (await http.put("/v2/models/mlp/versions/1/infer")).status_code == 405
        for path in ("/v2/models//infer", "/v2/models/mlp/versions/1/x/infer"):
            response = await http.post(path, json={})
            assert response.status_code == 404 and "Not Found" in response.json()["error"]
        # A trailing slash: the router's redirect to the infer path.
        response = await http.post("/v2/models/mlp/infer/", json={})
        assert response.status_code == 307
        assert response.headers["location"] == "http://oip/v2/models/mlp/infer"
    assert len(spy.seen) == 5


# -- metrics --------------------------------------------------------------------------------


def test_histogram_buckets_are_inclusive_upper_bounds() -> None:
    histogram = Histogram((1, 2, 4))
    for value in (0.5, 1, 2, 3, 4, 4.5):
        histogram.observe(value)
    assert histogram.cumulative() == [("1", 2.0), ("2", 3.0), ("4", 5.0), ("+Inf", 6.0)]
    assert histogram.sum == 15.0


async def test_metrics_of_fast_path_requests(app):
    labels = {"model": "mlp", "version": "1"}
    names = (
        "aioinfer_inference_requests_total",
        "aioinfer_request_duration_seconds_count",
        "aioinfer_queue_duration_seconds_count",
        "aioinfer_batch_size_sum",
    )
    before = {name: sample(app, name, **labels) for name in names}
    failed = {
        reason: sample(app, "aioinfer_inference_failures_total", reason=reason, **labels)
        for reason in ("bad_request", "busy")
    }
    url = "/v2/models/mlp/versions/1/infer"
    async with client(app) as http:
        for rows in (1, 2, 3):
            response = await http.post(url, json=json_body(np.ones((rows, 4), np.float32)))
            assert response.status_code == 200
        assert (
            await http.post(url, json=json_body(np.ones((1, 7), np.float32)))
        ).status_code == 400
        assert (await http.post(url, content=b"[]")).status_code == 400
        app.state.server.closing = True
        try:
            assert (await http.post(url, json=json_body(np.ones((1, 4))))).status_code == 503
        finally:
            app.state.server.closing = False
        text = (await http.get("/metrics")).text
    after = {name: sample(app, name, **labels) for name in names}
    assert after[names[0]] - before[names[0]] == 6
    assert after[names[1]] - before[names[1]] == 3  # the successful ones
    assert after[names[2]] - before[names[2]] == 3
    assert after[names[3]] - before[names[3]] == 6  # 1 + 2 + 3 rows
    bad = sample(app, "aioinfer_inference_failures_total", reason="bad_request", **labels)
    busy = sample(app, "aioinfer_inference_failures_total", reason="busy", **labels)
    assert (bad - failed["bad_request"], busy - failed["busy"]) == (2, 1)
    # The families keep their names and types, the histograms their buckets and sums.
    types = {family.name: family.type for family in text_string_to_metric_families(text)}
    assert {
        "aioinfer_inference_requests": "counter",
        "aioinfer_inference_failures": "counter",
        "aioinfer_request_duration_seconds": "histogram",
        "aioinfer_queue_duration_seconds": "histogram",
        "aioinfer_inference_requests_in_flight": "gauge",
        "aioinfer_batch_size": "histogram",
    }.items() <= types.items()
    found = samples(app)
    key = tuple(sorted(labels.items()))
    for family in ("aioinfer_request_duration_seconds", "aioinfer_queue_duration_seconds"):
        buckets = [
            found[f"{family}_bucket", tuple(sorted({**labels, "le": le}.items()))]
            for le in [*map(str, LATENCY_BUCKETS), "+Inf"]
        ]
        assert buckets == sorted(buckets) and buckets[-1] == found[f"{family}_count", key]
        assert 0 <= found[f"{family}_sum", key] <= 60
    assert found["aioinfer_inference_requests_in_flight", key] == 0


async def test_the_in_flight_gauge_counts_a_running_inference(app):
    body, headers = binary_body({"x": slow_input()[:256]})
    in_flight = "aioinfer_inference_requests_in_flight"
    labels = {"model": "slow", "version": "1"}
    outcome: list[tuple[int, bytes]] = []

    async def infer() -> None:
        outcome.append(await call(app, "/v2/models/slow/infer", body, list(headers.items())))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(infer)
            while sample(app, in_flight, **labels) != 1:
                await anyio.sleep(0.005)
    assert outcome[0][0] == 200
    assert sample(app, in_flight, **labels) == 0


# -- disconnects ----------------------------------------------------------------------------


async def test_a_disconnect_cancels_a_slow_inference_and_a_fast_one_is_left_alone(
    app, anyio_backend
):
    body, headers = binary_body({"x": slow_input()})
    slow = ("/v2/models/slow/infer", body, list(headers.items()))
    # A client that stays: the inference runs to the end; watching it stopped afterwards.
    receives: list[str] = []
    start = time.perf_counter()
    with anyio.fail_after(60):
        status, content = await call(app, *slow, receives=receives)
    full = time.perf_counter() - start
    assert status == 200, content
    assert full > 2 * disconnect_module.WATCH_AFTER  # slow enough to be watched
    await anyio.sleep(0.01)
    assert receives == ["receive", "stopped"]
    cancelled = sample(
        app, "aioinfer_inference_failures_total", reason="cancelled", model="slow", version="1"
    )

    # A client that went away at once: its inference stops early, with 499.
    gone = anyio.Event()
    gone.set()
    start = time.perf_counter()
    with anyio.fail_after(60):
        status, content = await call(app, *slow, gone=gone)
    stopped = time.perf_counter() - start
    assert status == 499 and "disconnected" in json.loads(content)["error"]
    assert stopped < full / 2, (stopped, full)
    if anyio_backend == "asyncio":  # watched only after WATCH_AFTER seconds of work
        assert stopped >= disconnect_module.WATCH_AFTER
    after = sample(
        app, "aioinfer_inference_failures_total", reason="cancelled", model="slow", version="1"
    )
    assert after == cancelled + 1
    assert sample(app, "aioinfer_inference_requests_in_flight", model="slow", version="1") == 0

    # A fast inference of a client that stays is answered; under asyncio nobody even
    # watched it (receive() was not called again, not even after WATCH_AFTER).
    a = np.random.default_rng(5).standard_normal((2, 3)).astype(np.float32)
    feeds = {"a": a, "b": a, "scale": np.array([1, -2, 3], np.int64)}
    specs = [
        {
            "name": n,
            "shape": list(v.shape),
            "datatype": "INT64" if n == "scale" else "FP32",
            "data": v.ravel().tolist(),
        }
        for n, v in feeds.items()
    ]
    receives = []
    start = time.perf_counter()
    with anyio.fail_after(60):
        status, content = await call(
            app, "/v2/models/plain/infer", json.dumps({"inputs": specs}).encode(), receives=receives
        )
    # Fast unless the machine is loaded: a call that outlived WATCH_AFTER may be watched.
    fast = time.perf_counter() - start < disconnect_module.WATCH_AFTER
    assert status == 200, content
    out = np.asarray(json.loads(content)["outputs"][0]["data"], np.float32).reshape(2, 3)
    np.testing.assert_allclose(out, reference_outputs(two_input_model(), feeds)[0], rtol=1e-6)
    await anyio.sleep(2 * disconnect_module.WATCH_AFTER)
    if anyio_backend == "asyncio" and fast:
        assert receives == []
    else:
        assert receives in ([], ["receive", "stopped"])
    # The slow model serves the next request.
    with anyio.fail_after(60):
        assert (await call(app, *slow))[0] == 200


# -- the switch interval --------------------------------------------------------------------


@pytest.fixture
def switch_interval(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[float]]:
    """``uvicorn.Server.serve`` replaced by a recorder of the switch interval when the
    server would have started; the interpreter's interval restored afterwards."""
    seen: list[float] = []

    async def serve_nothing(self: uvicorn.Server, sockets: Any = None) -> None:
        seen.append(sys.getswitchinterval())

    monkeypatch.setattr(uvicorn.Server, "serve", serve_nothing)
    monkeypatch.setattr(gc, "freeze", lambda: None)  # the test process keeps collecting
    onnx.save(two_input_model(), tmp_path / "model.onnx")
    original = sys.getswitchinterval()
    sys.setswitchinterval(0.004)
    try:
        yield seen
    finally:
        sys.setswitchinterval(original)


def in_thread(function: Callable[[], T]) -> T:
    """``function()`` in a thread of its own: its event loop does not meet the async test
    runners that this module's fixtures keep open in the main thread."""
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, function()))
        except BaseException as exc:
            outcome.append((False, exc))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def test_serve_sets_the_switch_interval(switch_interval: list[float], tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    in_thread(lambda: serve(model, port=0, log_level="warning"))
    in_thread(lambda: serve(model, port=0, log_level="warning", switch_interval=0.002))
    assert switch_interval == [SWITCH_INTERVAL, 0.002]
    in_thread(lambda: serve(model, port=0, log_level="warning", switch_interval=None))
    assert switch_interval[-1] == 0.002 == sys.getswitchinterval()  # left as it was


def test_serve_freezes_the_collector_after_loading_and_has_no_access_log(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    events: list[Any] = []

    async def serve_nothing(self: uvicorn.Server, sockets: Any = None) -> None:
        events.append(("serve", self.config.access_log, gc.get_threshold()[0]))

    monkeypatch.setattr(uvicorn.Server, "serve", serve_nothing)
    monkeypatch.setattr(gc, "freeze", lambda: events.append("freeze"))
    loaded = ModelServer.load

    async def load(self: ModelServer) -> None:
        await loaded(self)
        events.append("loaded")

    monkeypatch.setattr(ModelServer, "load", load)
    model = tmp_path / "model.onnx"
    onnx.save(two_input_model(), model)
    original = sys.getswitchinterval()
    thresholds = gc.get_threshold()
    gc.set_threshold(700, *thresholds[1:])  # the interpreter's default
    try:
        in_thread(lambda: serve(model, port=0, log_level="warning"))
        assert events == ["loaded", "freeze", ("serve", False, GC_THRESHOLD)]
        assert gc.get_threshold() == (GC_THRESHOLD, *thresholds[1:])
        events.clear()
        gc.set_threshold(700, *thresholds[1:])
        options = {"freeze_gc": False, "access_log": True}
        in_thread(lambda: serve(model, port=0, log_level="warning", **options))
        assert events == ["loaded", ("serve", True, 700)]  # the collector left as it was
    finally:
        sys.setswitchinterval(original)
        gc.set_threshold(*thresholds)


def test_cli_switch_interval(
    switch_interval: list[float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = str(tmp_path / "model.onnx")
    assert in_thread(lambda: main(["serve", model, "--port", "0"])) == 0
    assert (
        in_thread(lambda: main(["serve", model, "--port", "0", "--switch-interval", "0.003"])) == 0
    )
    assert switch_interval == [SWITCH_INTERVAL, 0.003]
    for bad in ("0", "-1", "nan", "inf", "soon"):
        assert main(["serve", model, "--switch-interval", bad]) == 2
        error = capsys.readouterr().err
        assert f"--switch-interval: expected a number of seconds above 0, got {bad!r}" in error
    assert switch_interval == [SWITCH_INTERVAL, 0.003] and sys.getswitchinterval() == 0.003


async def send_in_chunks(
    app: ASGIApp, body: bytes, headers: dict[str, str], pieces: int, *, declare: bool = True
) -> tuple[int, bytes]:
    """POST ``body`` to the mlp model's infer path in ``pieces`` ASGI messages (as a
    server hands over a body that arrives in parts); without a Content-Length when not
    ``declare``. A ``pieces`` of 0 disconnects after the first part."""
    step = max(1, -(-len(body) // max(pieces, 2)))
    parts = [body[i : i + step] for i in range(0, len(body), step)]
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
        for i, part in enumerate(parts)
    ]
    if pieces == 0:
        messages = [{**messages[0], "more_body": True}, {"type": "http.disconnect"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    listed = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    if declare:
        listed.append((b"content-length", str(len(body)).encode()))
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v2/models/mlp/infer", "raw_path": b"/v2/models/mlp/infer",
        "root_path": "", "query_string": b"", "headers": listed,
        "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000),
    }  # fmt: skip
    await app(scope, receive, send)  # type: ignore[arg-type]
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


async def test_a_body_in_several_parts_is_joined_and_limited(app):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    body, headers = binary_body({"x": x}, parameters={"binary_data_output": True})
    status, whole = await send_in_chunks(app, body, headers, 1)
    assert status == 200
    for pieces in (3, 7):
        assert await send_in_chunks(app, body, headers, pieces) == (200, whole)
    y, z = reference_outputs(mlp_model(seed=1), {"x": x})  # binary, in this order, last
    tail = np.frombuffer(whole[-(y.nbytes + z.nbytes) :], np.float32)
    np.testing.assert_allclose(tail[: y.size].reshape(y.shape), y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tail[y.size :].reshape(z.shape), z, rtol=1e-5, atol=1e-6)
    server: ModelServer = app.state.server
    limit, server.max_request_bytes = server.max_request_bytes, len(body) - 1
    try:  # no Content-Length: the limit is checked as the parts arrive
        status, answer = await send_in_chunks(app, body, headers, 3, declare=False)
        assert status == 413 and b"exceeds the limit" in answer
        status, answer = await send_in_chunks(app, body, headers, 1, declare=False)
        assert status == 413 and b"exceeds the limit" in answer
    finally:
        server.max_request_bytes = limit
    status, answer = await send_in_chunks(app, body, headers, 0)  # gone while sending
    assert status == 499 and b"disconnected while sending" in answer
    assert await send_in_chunks(app, body, headers, 3) == (200, whole)  # still serving


def test_one_timer_starts_the_due_watches_of_a_loop():
    """Under asyncio, watches wait in one sweeper per event loop: one timer while any is
    pending, each started once it is WATCH_AFTER old, none left behind. (Trio watches
    with a task group: this is asyncio's alone, run on a loop of its own.)"""
    import asyncio

    after = disconnect_module.WATCH_AFTER
    added: dict[int, float] = {}
    started: list[tuple[int, float]] = []

    class Probe:
        def __init__(self, number: int) -> None:
            self.number = number

        def start(self) -> None:
            started.append((self.number, asyncio.get_running_loop().time()))

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        sweeper = disconnect_module._sweeper(loop)
        assert disconnect_module._sweeper(loop) is sweeper  # one per loop
        added[1] = loop.time()
        sweeper.add(Probe(1))  # type: ignore[arg-type]
        timer = sweeper.timer
        await asyncio.sleep(after / 4)
        added[2] = loop.time()
        sweeper.add(Probe(2))  # type: ignore[arg-type]
        assert timer is not None and sweeper.timer is timer  # no timer of its own
        guard = loop.time() + 60  # a busy machine only makes the sweeps late
        while len(started) < 2 and loop.time() < guard:
            await asyncio.sleep(after / 4)
        assert not sweeper.pending and sweeper.timer is None  # nothing pending: no timer

    asyncio.run(scenario())
    # Each started in arrival order once it had worked WATCH_AFTER by the loop's clock,
    # never sooner (however late the sweeps ran).
    assert [number for number, _ in started] == [1, 2]
    assert all(at - added[n] >= after - 1e-9 for n, at in started), (added, started)
