"""Serving under load: 64 tritonclient ``http.aio`` clients sending single rows to an MLP.

    python -m benchmarks.serving [--clients 64] [--client-processes 1] [--requests 300]
                                 [--seconds 20] [--rounds 5] [--only abc] [--config-b JSON]

Three servers, one after the other in the same run, each in its own process under the
same uvicorn settings (uvloop and httptools when installed) and the same interpreter
switch interval (the one ``aioinfer serve`` sets), on the MLP of ``benchmarks/models.py``
(4 x Gemm 1024x1024 + Relu, float32, dynamic batch):

(a) ``aioinfer serve`` on a repository whose model has no ``config.json``: the server's
    defaults (docs/serving.md: AUTO, the THROUGHPUT hint, dynamic batching);
(b) the same app with the config of ``--config-b`` (default: the same batches computed in
    a worker process, ``BATCH:PROCESS:AUTO``), to compare a choice the defaults did not
    make (they batch on the server's threads when AUTO picks an engine);
(c) a minimal Starlette endpoint speaking the same protocol (KServe v2 infer with the
    binary tensor extension, as tritonclient sends it) that calls onnxruntime through
    ``anyio.to_thread.run_sync`` with one shared session (thread spinning off): the glue
    users write by hand.

Every client is a ``tritonclient.http.aio.InferenceServerClient`` of its own (one
connection) and sends 5 untimed requests; once every client has, the timed phase starts
(connecting and warming up count for no server), and each sends ``--requests`` more, one
after the other; a phase stops after ``--seconds`` at the latest. The clients run in this
process (on uvloop when installed), as in the measurement the serving targets were set
on; ``--client-processes N`` shares them among N processes instead. Two processes cost
more CPU per client request (0.14 against 0.11 ms, fewer requests per wake-up of each
loop), which slows the baseline, whose server needs the cores most, more than aioinfer:
report which was used. Only 127.0.0.1 is contacted. Throughput is
completed requests per second of the timed phase; latency percentiles are per request;
the CPU time per request is the server process's (user and system, all its threads),
apart its child processes' (a PROCESS worker's), and the clients' processes', over the
timed phase.
The servers take turns for ``--rounds`` rounds, and the medians over the rounds are
reported, with the ratio of the medians and each round's ratio: on a shared, noisy
machine a change of load then hits every server alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx

from benchmarks import models

T = TypeVar("T")

WIDTH = 1024
MODEL = "mlp"
KINDS = {
    "a": "aioinfer, no config.json (defaults)",
    "b": "aioinfer, --config-b",
    "c": "Starlette + onnxruntime (to_thread)",
}
DEFAULT_CONFIG_B = {"device": "BATCH:PROCESS:AUTO", "hint": "THROUGHPUT"}


# -- the servers (each runs in a child process) ---------------------------------------------


def onnxruntime_app(model: Path) -> object:
    """KServe v2 ``infer`` with the binary tensor extension, for one FP32 input and
    output: what tritonclient needs, no more."""
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
        body = await request.body()
        size = int(request.headers["inference-header-content-length"])
        header = json.loads(body[:size])
        spec = header["inputs"][0]
        x = np.frombuffer(body[size:], np.float32).reshape(spec["shape"])
        (y,) = await anyio.to_thread.run_sync(session.run, None, {spec["name"]: x})
        data = y.tobytes()
        answer = json.dumps(
            {
                "model_name": MODEL,
                "outputs": [
                    {
                        "name": "y",
                        "datatype": "FP32",
                        "shape": list(y.shape),
                        "parameters": {"binary_data_size": len(data)},
                    }
                ],
            }
        ).encode()
        return Response(
            answer + data,
            media_type="application/octet-stream",
            headers={"Inference-Header-Content-Length": str(len(answer))},
        )

    async def ready(request: Request) -> Response:
        return Response(b"")

    return Starlette(
        routes=[
            Route(f"/v2/models/{MODEL}/infer", infer, methods=["POST"]),
            Route("/v2/health/ready", ready),
        ]
    )


def run_server(kind: str, repository: Path, port: int, config_b: str) -> None:
    """Serve with the process settings of ``aioinfer serve`` (uvicorn, no access log, the
    switch interval, a frozen garbage collector with its raised first threshold), for
    every server alike."""
    import gc

    import uvicorn

    from aioinfer.serving import ModelConfig, serve
    from aioinfer.serving.server import GC_THRESHOLD, SWITCH_INTERVAL

    if kind == "a":
        serve(repository, port=port, log_level="info")
        return
    if kind == "b":
        config = ModelConfig.from_mapping(json.loads(config_b), "--config-b")
        serve(repository, port=port, configs={MODEL: config}, log_level="info")
        return
    sys.setswitchinterval(SWITCH_INTERVAL)
    app = onnxruntime_app(repository / MODEL / "1" / "model.onnx")
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)  # type: ignore[arg-type]


# -- the load (in this process) -----------------------------------------------------------


class Phase:
    """The timed part of a load: it starts once every client has had its untimed warm-up
    answers, so that connecting and warming up count for no server, and it ends when
    every client has its answers, or ``seconds`` after the start."""

    def __init__(
        self, clients: int, seconds: float, on_start: Callable[[], None] = lambda: None
    ) -> None:
        self.clients = clients
        self.seconds = seconds
        self.on_start = on_start
        self.warm = 0
        self.go = asyncio.Event()
        self.started = 0.0
        self.deadline = float("inf")

    async def warmed_up(self) -> None:
        """One client is ready; wait until all are (the last one starts the clock)."""
        self.warm += 1
        if self.warm == self.clients:
            self.on_start()
            self.started = time.perf_counter()
            self.deadline = self.started + self.seconds
            self.go.set()
        await self.go.wait()


WARM_UP = 5
"""Untimed requests of each client before the phase starts."""


async def client(
    port: int, x: np.ndarray, count: int, phase: Phase, latencies: list[float]
) -> None:
    """One tritonclient ``http.aio`` client (one connection) sending ``x`` back to back."""
    import tritonclient.http.aio as httpclient

    triton = httpclient.InferenceServerClient(f"127.0.0.1:{port}", conn_limit=1)
    try:
        row = httpclient.InferInput("x", list(x.shape), "FP32")
        row.set_data_from_numpy(x, binary_data=True)
        wanted = [httpclient.InferRequestedOutput("y", binary_data=True)]
        for _ in range(WARM_UP):
            await triton.infer(MODEL, [row], outputs=wanted)
        await phase.warmed_up()
        for _ in range(count):
            start = time.perf_counter()
            await triton.infer(MODEL, [row], outputs=wanted)
            now = time.perf_counter()
            latencies.append(now - start)
            if now > phase.deadline:
                break
    finally:
        await triton.close()


async def load(
    port: int,
    x: np.ndarray,
    clients: int,
    count: int,
    seconds: float,
    on_start: Callable[[], None] = lambda: None,
) -> tuple[list[float], float]:
    """Run the load; return each timed request's latency and the timed phase's length
    (``on_start`` is called as the timed phase starts)."""
    latencies: list[float] = []
    phase = Phase(clients, seconds, on_start)
    await asyncio.gather(*(client(port, x, count, phase, latencies) for _ in range(clients)))
    return latencies, time.perf_counter() - phase.started


Load = tuple[list[float], float, float]
"""Each timed request's latency, the timed phase's length (s) and the CPU time the
clients' processes spent in it (s)."""


def load_in_processes(
    port: int,
    x: np.ndarray,
    clients: int,
    count: int,
    seconds: float,
    processes: int,
    on_start: Callable[[], None] = lambda: None,
) -> Load:
    """The load of :func:`load`, its clients shared among ``processes`` processes (this
    one when 1). Each process starts its timed phase when all processes' clients have
    warmed up; the phase lasts from the first process's start to the last one's end."""
    if processes == 1:
        marks: list[float] = []

        def start() -> None:
            marks.append(time.process_time())
            on_start()

        latencies, elapsed = run(load(port, x, clients, count, seconds, start))
        return latencies, elapsed, time.process_time() - marks[0]
    context = multiprocessing.get_context("spawn")
    ready, results = context.Queue(), context.Queue()
    go = context.Event()
    shares = [clients // processes + (i < clients % processes) for i in range(processes)]
    workers = [
        context.Process(
            target=_client_process, args=(port, x, share, count, seconds, ready, go, results)
        )
        for share in shares
        if share
    ]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:
            ready.get(timeout=120)
        on_start()
        go.set()
        parts = [results.get(timeout=seconds + 120) for _ in workers]
    finally:
        for worker in workers:
            worker.join(60)
            if worker.is_alive():
                worker.kill()
    latencies = [latency for part in parts for latency in part[0]]
    elapsed = max(part[2] for part in parts) - min(part[1] for part in parts)
    return latencies, elapsed, sum(part[3] for part in parts)


def _client_process(
    port: int,
    x: np.ndarray,
    clients: int,
    count: int,
    seconds: float,
    ready: Any,
    go: Any,
    results: Any,
) -> None:
    """One client process of :func:`load_in_processes`: its clients warm up, then wait
    for ``go``; it puts (latencies, start, end, CPU seconds) on ``results``."""
    marks: list[float] = []

    def start() -> None:  # every client of this process is waiting: block the loop
        ready.put(None)
        go.wait()
        marks.extend((time.perf_counter(), time.process_time()))

    latencies, elapsed = run(load(port, x, clients, count, seconds, start))
    results.put((latencies, marks[0], marks[0] + elapsed, time.process_time() - marks[1]))


async def one(port: int, x: np.ndarray) -> np.ndarray:
    """One answer, through tritonclient."""
    import tritonclient.http.aio as httpclient

    triton = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        row = httpclient.InferInput("x", list(x.shape), "FP32")
        row.set_data_from_numpy(x, binary_data=True)
        wanted = [httpclient.InferRequestedOutput("y", binary_data=True)]
        result = await triton.infer(MODEL, [row], outputs=wanted)
        return np.asarray(result.as_numpy("y"))
    finally:
        await triton.close()


class CpuTimes:
    """CPU time (user + system, seconds) of a server process and, apart, of its child
    processes (the PROCESS device's worker), between :meth:`start` and :meth:`stop`."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.server = psutil.Process(pid)
        self.begin = (0.0, 0.0)
        self.spent = (0.0, 0.0)

    def _now(self) -> tuple[float, float]:
        import psutil

        def cpu(process: psutil.Process) -> float:
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                return 0.0
            return float(times.user + times.system)

        children = sum(cpu(child) for child in self.server.children(recursive=True))
        return cpu(self.server), children

    def start(self) -> None:
        self.begin = self._now()

    def stop(self) -> None:
        server, children = self._now()
        self.spent = (server - self.begin[0], children - self.begin[1])


Result = tuple[float, float, float, int, float, float, float]
"""requests/s, p50 and p99 (ms), requests, the CPU time per request (ms) of the server, of
its worker and of the clients."""


def measure(
    kind: str, repository: Path, x: np.ndarray, expected: np.ndarray, args: argparse.Namespace
) -> Result:
    """Start server ``kind``, check one answer, run the load; return its :data:`Result`."""
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.serving",
            "--serve",
            kind,
            str(repository),
            str(port),
            "--config-b",
            args.config_b,
        ]
    )
    try:
        wait_ready(port)
        y = run(one(port, x))
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
        cpu = CpuTimes(server.pid)
        latencies, elapsed, clients_cpu = load_in_processes(
            port, x, args.clients, args.requests, args.seconds, args.client_processes, cpu.start
        )
        cpu.stop()
    finally:
        server.terminate()
        server.wait(60)
    p50, p99 = np.percentile(latencies, [50, 99]) * 1e3
    count = len(latencies)
    server_ms, worker_ms, clients_ms = (spent / count * 1e3 for spent in (*cpu.spent, clients_cpu))
    return count / elapsed, float(p50), float(p99), count, server_ms, worker_ms, clients_ms


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run the load on uvloop when it is installed: the load shares the cores with the
    server, so the cheaper each client request, the less it takes from the server."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_ready(port: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    request = b"GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
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


def machine() -> str:
    """The CPU, its cores, and the versions that matter here."""
    from importlib.metadata import version as installed

    import onnxruntime as ort
    import uvicorn

    import aioinfer
    from aioinfer.properties import cpu_model_name, num_cores

    version = installed("tritonclient")
    return (
        f"{cpu_model_name()}, {num_cores()} cores; Python {sys.version.split()[0]}, "
        f"aioinfer {aioinfer.__version__}, onnxruntime {ort.__version__}, "
        f"uvicorn {uvicorn.__version__}, tritonclient {version}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=300, help="timed requests per client")
    parser.add_argument("--seconds", type=float, default=20, help="time limit of each phase")
    parser.add_argument("--only", default="ac", help="which servers to run (default: ac)")
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="processes the clients are shared among (default: 1, this process)",
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="rounds of every server, interleaved (medians)"
    )
    parser.add_argument(
        "--config-b",
        default=json.dumps(DEFAULT_CONFIG_B),
        help=f"config.json of server (b) (default: {json.dumps(DEFAULT_CONFIG_B)})",
    )
    parser.add_argument(
        "--serve", nargs=3, metavar=("KIND", "REPOSITORY", "PORT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.serve:
        kind, repository, port = args.serve
        run_server(kind, Path(repository), int(port), args.config_b)
        return
    import onnxruntime as ort

    x = np.random.default_rng(0).standard_normal((1, WIDTH)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp) / "repository"
        model = repository / MODEL / "1" / "model.onnx"
        model.parent.mkdir(parents=True)
        onnx.save(models.mlp(WIDTH, 4), model)
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        expected = session.run(None, {"x": x})[0]
        del session
        print(f"machine: {machine()}")
        print(
            f"MLP 4x{WIDTH}, {args.clients} tritonclient http.aio clients in "
            f"{args.client_processes} process(es) x {args.requests} single-row requests "
            f"(limit {args.seconds:g} s per server), loopback HTTP/1.1"
        )
        runs: dict[str, list[Result]] = {kind: [] for kind in args.only}
        for round_ in range(1, args.rounds + 1):
            for kind in args.only:  # interleaved: a change of load hits every server alike
                result = measure(kind, repository, x, expected, args)
                runs[kind].append(result)
                rate, p50, p99, count, server_ms, worker_ms, clients_ms = result
                print(
                    f"  round {round_} ({kind}) {KINDS[kind]:38s} {rate:8.0f} req/s   "
                    f"p50 {p50:7.1f} ms   p99 {p99:7.1f} ms   ({count} requests; CPU per "
                    f"request: server {server_ms:.3f} ms, worker {worker_ms:.3f} ms, "
                    f"clients {clients_ms:.3f} ms; load average {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
            if "a" in runs and "c" in runs:
                ratio = runs["a"][-1][0] / runs["c"][-1][0]
                print(f"  round {round_} (a)/(c) throughput: {ratio:.2f}x", flush=True)
        print(f"medians of {args.rounds} rounds:")
        rates = {}
        for kind, results in runs.items():
            rate, p50, p99, _, server_ms, worker_ms, clients_ms = (
                float(np.median([r[i] for r in results])) for i in range(7)
            )
            rates[kind] = rate
            print(
                f"  ({kind}) {KINDS[kind]:38s} {rate:8.0f} req/s   p50 {p50:7.1f} ms   "
                f"p99 {p99:7.1f} ms   CPU per request: server {server_ms:.3f} ms, "
                f"worker {worker_ms:.3f} ms, clients {clients_ms:.3f} ms"
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
