"""Serving under load with bare clients, and gRPC against REST: 64 concurrent clients
sending single-row requests over loopback.

    python -m benchmarks.serving_bare [--clients 64] [--requests 300] [--seconds 20] [--rounds 5]
    python -m benchmarks.serving_bare --grpc    # one server, REST and gRPC in turn

(``benchmarks/serving.py`` measures the no-config defaults with tritonclient as the
client; this module keeps the earlier comparison with bare clients, which take less of
the shared cores, and the transports' comparison.)

Three servers, one after the other in the same run, each in its own process under the
same uvicorn settings (uvloop and httptools when installed) and the same interpreter
switch interval (the one ``aioinfer serve`` sets), on the MLP of ``benchmarks/models.py``
(4 x Gemm 1024x1024 + Relu, float32):

(a) aioinfer's Open Inference Protocol app with the BATCH device on the PROCESS device
    (``BATCH:PROCESS:CPU``: batches computed in a worker process, so that the compute
    never waits for the GIL while the event loop runs Python; up to 32 rows, 1 ms; one
    compute stream with one BLAS thread, so that the other core serves HTTP; 32 rows,
    half the clients, so that one half computes while the loop answers the other, and
    the next full batch already waits in the worker);
(b) the same app without batching (THROUGHPUT hint: one stream per core);
(c) a minimal Starlette endpoint calling onnxruntime through ``anyio.to_thread.run_sync``
    with one shared session (thread spinning off): the glue users write by hand. It takes
    the raw float32 row and answers raw bytes, so it parses less than (a) and (b), which
    speak the protocol (binary tensor extension: a JSON header plus the row).

Each client keeps one HTTP/1.1 connection and sends 5 untimed requests; once every client
has, the timed phase starts (connecting and warming up count for no server), and each
sends ``--requests`` more, one after the other; a phase stops after ``--seconds`` at the
latest. The clients run in this process, as bare asyncio protocols on uvloop when
installed, so that they take as little of the shared cores as they can. Only 127.0.0.1
is contacted. Throughput is completed requests per second of the timed phase; latency
percentiles are per request. The servers take turns for ``--rounds`` rounds, and the
medians over the rounds are reported, with the ratio of the medians and each round's
ratio: on a shared, noisy machine a change of load then hits every server alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import onnx

from benchmarks import models

T = TypeVar("T")

WIDTH = 1024
KINDS = {
    "a": "aioinfer, BATCH device",
    "b": "aioinfer, no batching",
    "c": "Starlette + onnxruntime (to_thread)",
}


# -- the servers (each runs in a child process) ---------------------------------------------


def aioinfer_configs(model: Path, batching: bool) -> dict[str, Any]:
    from aioinfer.serving import ModelConfig

    if batching:
        # One compute stream with one BLAS thread: the other core serves HTTP.
        config = ModelConfig(
            device="PROCESS:CPU",  # the compute in a worker process: no GIL contention
            batching={"max_batch_size": 32, "timeout_ms": 1},
            properties={"NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": 1},
        )
    else:
        config = ModelConfig(hint="THROUGHPUT", batching=False)
    return {model.stem: config}


def onnxruntime_app(model: Path) -> object:
    import anyio.to_thread
    import onnxruntime as ort
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    options = ort.SessionOptions()
    # Spinning workers would take CPU from the clients on the same cores.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])

    async def infer(request: Request) -> Response:
        x = np.frombuffer(await request.body(), np.float32).reshape(1, WIDTH)
        (y,) = await anyio.to_thread.run_sync(session.run, None, {"x": x})
        return Response(y.tobytes(), media_type="application/octet-stream")

    async def health(request: Request) -> Response:
        return Response(b"ok")

    return Starlette(routes=[Route("/infer", infer, methods=["POST"]), Route("/health", health)])


def run_server(kind: str, model: Path, port: int) -> None:
    """Serve with the process settings of ``aioinfer serve`` (uvicorn, no access log, the
    switch interval, a frozen garbage collector with its raised first threshold), for
    every server alike."""
    import gc

    import uvicorn

    from aioinfer.serving import serve
    from aioinfer.serving.server import GC_THRESHOLD, SWITCH_INTERVAL

    if kind != "c":
        serve(model, port=port, configs=aioinfer_configs(model, kind == "a"), log_level="warning")
        return
    sys.setswitchinterval(SWITCH_INTERVAL)
    app = onnxruntime_app(model)
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)  # type: ignore[arg-type]


# -- the load (in this process) -----------------------------------------------------------


def request_bytes(kind: str, port: int, x: np.ndarray) -> bytes:
    """The whole HTTP request one client sends, over and over."""
    if kind == "c":
        path, body, extra = "/infer", x.tobytes(), ""
    else:
        spec = {
            "name": "x",
            "shape": list(x.shape),
            "datatype": "FP32",
            "parameters": {"binary_data_size": x.nbytes},
        }
        header = json.dumps({"inputs": [spec], "parameters": {"binary_data_output": True}})
        path = "/v2/models/mlp/infer"
        body = header.encode() + x.tobytes()
        extra = f"Inference-Header-Content-Length: {len(header)}\r\n"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes
) -> bytes:
    writer.write(payload)
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b" ", 2)[1]
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    body = await reader.readexactly(length)
    if status != b"200":
        raise RuntimeError(f"HTTP {status.decode()}: {body[:200]!r}")
    return body


class Phase:
    """The timed part of a load: it starts once every client has connected and had its
    untimed warm-up answers, so that connecting and warming up count for no server, and
    it ends when every client has its answers, or ``seconds`` after the start."""

    def __init__(self, clients: int, seconds: float) -> None:
        self.clients = clients
        self.seconds = seconds
        self.ready: list[Client] = []
        self.started = 0.0
        self.deadline = float("inf")

    def warmed_up(self, client: Client) -> None:
        """``client`` is ready; when all are, start the clock and send their requests."""
        self.ready.append(client)
        if len(self.ready) == self.clients:
            self.started = time.perf_counter()
            self.deadline = self.started + self.seconds
            for waiting in self.ready:
                waiting.send()


class Client(asyncio.Protocol):
    """One connection sending ``payload`` back to back. Each answer sends the next request
    from the protocol's own callback (no task, no stream reader per request): the load
    shares the cores with the server, so it must cost as little as possible."""

    WARM_UP = 5
    """Untimed requests of each client before the phase starts."""

    def __init__(self, payload: bytes, count: int, phase: Phase, latencies: list[float]) -> None:
        self.payload = payload
        self.warm_up = self.WARM_UP
        self.count = count
        self.phase = phase
        self.latencies = latencies
        self.done = asyncio.get_running_loop().create_future()
        self.buffer = bytearray()
        self.head_end = -1
        self.end = -1
        self.start = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.send()

    def send(self) -> None:
        assert self.transport is not None
        self.start = time.perf_counter()
        self.transport.write(self.payload)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            if self.end < 0:
                self.head_end = self.buffer.find(b"\r\n\r\n")
                if self.head_end < 0:
                    return
                length = 0
                for line in bytes(self.buffer[: self.head_end]).split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                self.end = self.head_end + 4 + length
            if len(self.buffer) < self.end:
                return
            status = bytes(self.buffer[9:12])
            body = bytes(self.buffer[self.head_end + 4 : self.end])
            del self.buffer[: self.end]
            self.end = -1
            if status != b"200":
                self.finish(RuntimeError(f"HTTP {status.decode()}: {body[:200]!r}"))
                return
            self.answered()

    def answered(self) -> None:
        now = time.perf_counter()
        if self.warm_up:
            self.warm_up -= 1
            if self.warm_up:
                self.send()
            else:
                self.phase.warmed_up(self)  # waits for the others, then sends
            return
        self.latencies.append(now - self.start)
        self.count -= 1
        if self.count == 0 or now > self.phase.deadline:
            self.finish(None)
        else:
            self.send()

    def finish(self, error: BaseException | None) -> None:
        if not self.done.done():
            if error is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(error)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.finish(exc or ConnectionError("the server closed the connection"))


async def load(
    port: int, payload: bytes, clients: int, count: int, seconds: float
) -> tuple[list[float], float]:
    """Run the load; return each timed request's latency and the timed phase's length."""
    latencies: list[float] = []
    phase = Phase(clients, seconds)
    loop = asyncio.get_running_loop()
    connections = [
        await loop.create_connection(
            lambda: Client(payload, count, phase, latencies), "127.0.0.1", port
        )
        for _ in range(clients)
    ]
    await asyncio.gather(*(protocol.done for _, protocol in connections))
    return latencies, time.perf_counter() - phase.started


def measure(
    kind: str, model: Path, x: np.ndarray, expected: np.ndarray, args: argparse.Namespace
) -> tuple[float, float, float, int]:
    """Start server ``kind``, check one answer, run the load; return (req/s, p50, p99, n)."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.serving_bare", "--serve", kind, str(model), str(port)]
    )
    try:
        payload = request_bytes(kind, port, x)
        wait_ready(port, "/health" if kind == "c" else "/v2/health/ready")
        answer = run(one(port, payload))
        y = np.frombuffer(answer if kind == "c" else answer[-expected.nbytes :], np.float32)
        np.testing.assert_allclose(y.reshape(expected.shape), expected, rtol=1e-4, atol=1e-4)
        latencies, elapsed = run(load(port, payload, args.clients, args.requests, args.seconds))
    finally:
        server.terminate()
        server.wait(60)
    p50, p99 = np.percentile(latencies, [50, 99]) * 1e3
    return len(latencies) / elapsed, float(p50), float(p99), len(latencies)


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run the load on uvloop when it is installed: the load shares the cores with the
    server, so the cheaper each client request, the less it takes from the server."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


async def one(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await exchange(reader, writer, payload)
    finally:
        writer.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_ready(port: int, path: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as connection:
                connection.sendall(request)
                if connection.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server on port {port} not ready after {timeout} s")


# -- gRPC against REST: one server, both transports (--grpc) ------------------------------

GRPC_LOADS = {
    "rest": "REST, tritonclient.http.aio",
    "grpc": "gRPC, tritonclient.grpc.aio",
    "rest-bare": "REST, bare HTTP/1.1 clients",
    "grpc-bare": "gRPC, bare grpc.aio calls",
}


def grpc_versus_rest(model: Path, x: np.ndarray, expected: np.ndarray, args: Any) -> None:
    """``aioinfer serve --grpc-port`` with the server's defaults (no ``config.json``, as
    ``benchmarks/serving.py``'s server (a)), in one process;
    the same load over each transport in turn, ``--rounds`` times: with tritonclient's
    asyncio clients on both (the clients users run), and with bare clients (HTTP/1.1
    protocols as above; grpc.aio calls of pre-serialised requests), which take less of
    the shared cores. Each client has a connection of its own."""
    port, grpc_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        (repo / "mlp" / "1").mkdir(parents=True)
        (repo / "mlp" / "1" / "model.onnx").write_bytes(model.read_bytes())
        command = [sys.executable, "-m", "aioinfer.cli", "serve", str(repo)]
        command += ["--port", str(port), "--grpc-port", str(grpc_port)]
        server = subprocess.Popen(command, stderr=subprocess.DEVNULL)
        try:
            wait_ready(port, "/v2/health/ready")
            print(
                f"MLP 4x{WIDTH}, one server (REST and gRPC), {args.clients} clients x "
                f"{args.requests} single-row requests (limit {args.seconds:g} s per load)"
            )
            runs: dict[str, list[tuple[float, float, float, int]]] = {k: [] for k in GRPC_LOADS}
            for round_ in range(1, args.rounds + 1):
                for kind in GRPC_LOADS:
                    target = grpc_port if kind.startswith("grpc") else port
                    latencies, elapsed = run(
                        transport_load(
                            kind, target, x, expected, args.clients, args.requests, args.seconds
                        )
                    )
                    p50, p99 = np.percentile(latencies, [50, 99]) * 1e3
                    result = (len(latencies) / elapsed, float(p50), float(p99), len(latencies))
                    runs[kind].append(result)
                    print(
                        f"  round {round_} {GRPC_LOADS[kind]:30s} {result[0]:8.0f} req/s   "
                        f"p50 {p50:7.1f} ms   p99 {p99:7.1f} ms   ({len(latencies)} requests)"
                    )
        finally:
            server.terminate()
            server.wait(60)
    print(f"medians of {args.rounds} rounds:")
    for kind, results in runs.items():
        rate, p50, p99 = (float(np.median([r[i] for r in results])) for i in range(3))
        print(f"  {GRPC_LOADS[kind]:30s} {rate:8.0f} req/s   p50 {p50:7.1f} ms   p99 {p99:7.1f} ms")
    for client in ("", "-bare"):
        ratios = [g[0] / r[0] for g, r in zip(runs["grpc" + client], runs["rest" + client])]
        print(
            f"  gRPC/REST{client or ' (tritonclient)'}: per round "
            f"{', '.join(f'{r:.2f}' for r in ratios)} (median {float(np.median(ratios)):.2f}x)"
        )


async def transport_load(
    kind: str,
    port: int,
    x: np.ndarray,
    expected: np.ndarray,
    clients: int,
    count: int,
    seconds: float,
) -> tuple[list[float], float]:
    """``clients`` clients of ``kind`` (:data:`GRPC_LOADS`) sending ``x`` back to back
    (5 untimed each first); every answer's ``y`` is checked once per client."""
    if kind == "rest-bare":
        return await load(port, request_bytes("a", port, x), clients, count, seconds)
    url = f"127.0.0.1:{port}"
    own_connection = [("grpc.use_local_subchannel_pool", 1)]
    closers: list[Any] = []
    if kind == "grpc-bare":
        import grpc
        from tritonclient.grpc import service_pb2

        request = service_pb2.ModelInferRequest(model_name="mlp")
        request.inputs.add(name="x", datatype="FP32", shape=x.shape)
        request.raw_input_contents.append(x.tobytes())
        payload = request.SerializeToString()
        calls = []
        for _ in range(clients):
            channel = grpc.aio.insecure_channel(url, options=own_connection)
            closers.append(channel.close)
            calls.append(channel.unary_unary("/inference.GRPCInferenceService/ModelInfer"))

        def infer(index: int) -> Any:
            return calls[index](payload)

        def output(answer: bytes) -> np.ndarray:
            raw = service_pb2.ModelInferResponse.FromString(answer).raw_output_contents[0]
            return np.frombuffer(raw, np.float32)
    else:
        if kind == "grpc":
            import tritonclient.grpc.aio as tc

            made = [
                tc.InferenceServerClient(url, channel_args=own_connection) for _ in range(clients)
            ]
        else:
            import tritonclient.http.aio as tc  # type: ignore[no-redef]

            made = [tc.InferenceServerClient(url, conn_limit=1) for _ in range(clients)]
        closers.extend(client.close for client in made)
        tensor = tc.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)

        def infer(index: int) -> Any:
            return made[index].infer("mlp", [tensor])

        def output(answer: Any) -> np.ndarray:
            return np.asarray(answer.as_numpy("y"))

    latencies: list[float] = []
    ready = asyncio.Event()
    warmed = 0
    started = 0.0

    async def client(index: int) -> None:
        nonlocal warmed, started
        for _ in range(5):
            answer = await infer(index)
        y = output(answer).reshape(expected.shape)
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
        warmed += 1
        if warmed == clients:
            started = time.perf_counter()
            ready.set()
        await ready.wait()
        deadline = started + seconds
        for _ in range(count):
            start = time.perf_counter()
            await infer(index)
            latencies.append(time.perf_counter() - start)
            if start > deadline:
                break

    try:
        await asyncio.gather(*(client(index) for index in range(clients)))
        return latencies, time.perf_counter() - started
    finally:
        for close in closers:
            await close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=300, help="timed requests per client")
    parser.add_argument("--seconds", type=float, default=20, help="time limit of each phase")
    parser.add_argument("--only", default="abc", help="which servers to run (default: abc)")
    parser.add_argument(
        "--rounds", type=int, default=5, help="rounds of every server, interleaved (medians)"
    )
    parser.add_argument(
        "--grpc", action="store_true", help="compare gRPC with REST on one server instead"
    )
    parser.add_argument(
        "--serve", nargs=3, metavar=("KIND", "MODEL", "PORT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.serve:
        kind, model, port = args.serve
        run_server(kind, Path(model), int(port))
        return
    import onnxruntime as ort

    x = np.random.default_rng(0).standard_normal((1, WIDTH)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "mlp.onnx"
        onnx.save(models.mlp(WIDTH, 4), model)
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        expected = session.run(None, {"x": x})[0]
        del session
        if args.grpc:
            grpc_versus_rest(model, x, expected, args)
            return
        print(
            f"MLP 4x{WIDTH}, {args.clients} clients x {args.requests} single-row requests "
            f"(limit {args.seconds:g} s per server), loopback HTTP/1.1"
        )
        runs: dict[str, list[tuple[float, float, float, int]]] = {kind: [] for kind in args.only}
        for round_ in range(1, args.rounds + 1):
            for kind in args.only:  # interleaved: a change of load hits every server alike
                result = measure(kind, model, x, expected, args)
                runs[kind].append(result)
                rate, p50, p99, count = result
                print(
                    f"  round {round_} ({kind}) {KINDS[kind]:38s} {rate:8.0f} req/s   "
                    f"p50 {p50:7.1f} ms   p99 {p99:7.1f} ms   ({count} requests)"
                )
            if "a" in runs and "c" in runs:
                ratio = runs["a"][-1][0] / runs["c"][-1][0]
                print(f"  round {round_} (a)/(c) throughput: {ratio:.2f}x")
        print(f"medians of {args.rounds} rounds:")
        rates = {}
        for kind, results in runs.items():
            rate, p50, p99 = (float(np.median([r[i] for r in results])) for i in range(3))
            rates[kind] = rate
            print(
                f"  ({kind}) {KINDS[kind]:38s} {rate:8.0f} req/s   p50 {p50:7.1f} ms   "
                f"p99 {p99:7.1f} ms"
            )
        if "a" in rates and "c" in rates:
            ratios = [a[0] / c[0] for a, c in zip(runs["a"], runs["c"])]
            print(
                f"  (a)/(c) throughput: {rates['a'] / rates['c']:.2f}x (ratio of the medians); "
                f"per round: {', '.join(f'{r:.2f}' for r in ratios)} "
                f"(median {float(np.median(ratios)):.2f}x)"
            )
        if "a" in rates and "b" in rates:
            print(f"  (a)/(b) throughput: {rates['a'] / rates['b']:.2f}x")


if __name__ == "__main__":
    main()
